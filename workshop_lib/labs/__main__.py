"""``python -m workshop_lib.labs list|check [KEY ...]``: the exercises, and proof that each
check judges: it must fail on the exercise's stub (with the stated reason), pass on its
reference solution, fail every run the notebook made before the exercise, and refuse what
breaks the exercise's rules. ``make check-labs`` runs ``check``; CI does too."""
import sys
import time

from workshop_lib import cli, labs
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


@exit_cleanly_on_course_error
def main(argv=None):
    parser = cli.ArgumentParser(prog="python -m workshop_lib.labs", description=__doc__)
    parser.add_argument("command", choices=("list", "check"))
    parser.add_argument("keys", nargs="*", help="exercises to check (default: all)")
    args = parser.parse_args(argv)
    exercises = labs._load()
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
