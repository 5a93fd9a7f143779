"""``python -m workshop_lib.labs list|check [KEY ...]``: the exercises, and proof that each
check judges: it must fail on the exercise's stub (with the stated reason), pass on its
reference solution, fail every run the notebook made before the exercise, and refuse what
breaks the exercise's rules. ``make check-labs`` runs ``check``; CI does too.

``python -m workshop_lib.labs progress [--json] [--send]``: the learner's own verdicts so
far (workshop_lib.progress): per exercise its latest verdict and attempts, then the
progress line; ``--json`` prints the summary as JSON instead; ``--send`` first sends the
records the class server has not acknowledged yet."""
import json
import sys
import time

from workshop_lib import cli, labs, progress
from workshop_lib.errors import CourseError, exit_cleanly_on_course_error


def prove(exercise):
    """(stub verdict, solution verdict, seconds, problems) for one exercise."""
    start = time.perf_counter()
    context = exercise.context()
    on_stub = exercise.check(exercise.stub(**context), **context)
    on_solution = exercise.check(exercise.solution(**context), **context)
    problems = []
    if on_stub.ok:
        problems.append("its check passes the stub")
    elif exercise.stub_reason not in on_stub.reason:
        problems.append(f"on the stub it fails without saying {exercise.stub_reason!r}")
    if not on_solution.ok:
        problems.append(f"its check fails the reference solution: {on_solution.reason}")
    problems += prove_rules(exercise, context)
    return on_stub, on_solution, time.perf_counter() - start, problems


def prove_rules(exercise, context=None):
    """What the exercise's check lets through that it must not: a run the notebook made
    before the exercise, or an answer that breaks its rules. [] when nothing."""
    context = exercise.context() if context is None else context
    problems = []
    for answer in exercise.earlier_runs(**context):
        if exercise.check(answer, **context).ok:
            problems.append(f"its check passes {answer!r}, a run the notebook made before the "
                            f"exercise")
    for answer, words in exercise.refused(**context):
        verdict = exercise.check(answer, **context)
        if verdict.ok or words not in verdict.reason:
            problems.append(f"it does not refuse {answer!r} saying {words!r}: "
                            f"{verdict.reason}")
    return problems


def todo(exercises):
    """Everything the learner writes in the course, on one screen: per notebook, each
    exercise's key, what it asks, and what the learner writes."""
    lines, notebook = [], None
    for exercise in exercises:
        if exercise.notebook != notebook:
            notebook = exercise.notebook
            lines.append(f"notebooks/{notebook}.ipynb")
        lines.append(f"  [ ] {exercise.key:14} {exercise.title}")
        lines.append(f"      {'':14} you write {exercise.writes}")
    lines.append(f"{len(exercises)} exercises; labs.check(key, answer) judges each, "
                 f"labs.show_solution(key) prints a reference answer")
    return "\n".join(lines)


def progress_table(exercises, found):
    """The learner's verdicts: a row per exercise of the course (and the assessment, once
    recorded) with its latest verdict and attempts."""
    rows = [(exercise.notebook, key) for key, exercise in exercises.items()]
    rows += [(seen["notebook"], key) for key, seen in found.items() if key not in exercises]
    wide = max(len(notebook) for notebook, _ in rows), max(len(key) for _, key in rows)
    lines = [f"{'notebook':{wide[0]}}  {'exercise':{wide[1]}}  {'latest verdict':15} attempts"]
    for notebook, key in rows:
        seen = found.get(key)
        verdict = "-" if seen is None else "PASS" if seen["ok"] else "NOT YET"
        lines.append(f"{notebook:{wide[0]}}  {key:{wide[1]}}  {verdict:15} "
                     f"{seen['attempts'] if seen else 0}")
    return "\n".join(lines)


def show_progress(exercises, as_json=False, send=False):
    if send:
        if progress.class_server() is None:
            raise CourseError(f"no class server to send to ({progress.URL_ENV} and "
                              f"{progress.TOKEN_ENV} are set on the class server only): "
                              f"your records stay in {progress.record_path()}")
        sent = progress.send_pending()
        print(f"sent {sent.sent} record(s) to the class server; {sent.pending} still pending"
              + (f" ({sent.error})" if sent.error else ""), file=sys.stderr if as_json else None)
    found = progress.summary(progress.records())
    if as_json:
        print(json.dumps(found, indent=1))
        return 0
    print(progress_table(exercises, found))
    print(progress.progress_line(exercises={k: e.notebook for k, e in exercises.items()}))
    print(f"(recorded in {progress.record_path()}"
          + (f"; {len(progress.pending())} not yet sent to the class server"
             if progress.class_server() else "") + ")")
    return 0


@exit_cleanly_on_course_error
def main(argv=None):
    parser = cli.ArgumentParser(prog="python -m workshop_lib.labs", description=__doc__)
    parser.add_argument("command", choices=("list", "check", "progress"))
    parser.add_argument("keys", nargs="*", help="exercises to check (default: all)")
    parser.add_argument("--json", action="store_true", help="progress: print the summary "
                                                            "as JSON")
    parser.add_argument("--send", action="store_true", help="progress: send the records the "
                                                            "class server has not yet")
    args = parser.parse_args(argv)
    exercises = labs._load()
    if args.command == "progress":
        if args.keys:
            raise CourseError("progress takes no exercise keys: python -m workshop_lib.labs "
                              "progress [--json] [--send]")
        return show_progress(exercises, args.json, args.send)
    unknown = set(args.keys) - set(exercises)
    if unknown:
        raise CourseError(f"no exercise {', '.join(sorted(unknown))}; there are: "
                          f"{', '.join(exercises)}")
    chosen = [exercises[key] for key in args.keys] if args.keys else list(exercises.values())
    if args.command == "list":
        print(todo(chosen))
        return 0
    failed = 0
    for exercise in chosen:
        print(f"{exercise.key} ({exercise.notebook}): {exercise.title}", flush=True)
        on_stub, on_solution, seconds, problems = prove(exercise)
        print(f"  stub:     {'PASS' if on_stub.ok else 'NOT YET'}: {on_stub.reason}")
        print(f"  solution: {'PASS' if on_solution.ok else 'NOT YET'}: {on_solution.reason}")
        print(f"  {'ok' if not problems else 'PROBLEM: ' + '; '.join(problems)} "
              f"({seconds:.0f} s)", flush=True)
        failed += bool(problems)
    print(f"{len(chosen) - failed} of {len(chosen)} exercises: the check fails the stub and "
          f"passes the solution")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
