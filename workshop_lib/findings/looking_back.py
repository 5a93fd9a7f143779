"""Notebook 08, Looking back: the learner's takeaways, computed from their own records.

Two kinds of record hold the learner's day: the verdicts of their checks and of the
assessment's Validate (``workshop_lib.progress``: one JSON object per line, each with its
``kind``, exercise ``key``, ``ok``, ``reason``, ``attempt`` and the check's ``details``), and
the run records their notebooks' launches wrote (``runlog``). Each takeaway reads the latest
verdict of its exercise, judges with a threshold its sentence states, and where the record
is missing says so and what to run.
"""
from pathlib import Path

from workshop_lib import day, labs, runlog
from workshop_lib.findings.base import Finding, Findings, skipped
from workshop_lib.findings.from_one_gpu_to_many import EFFICIENT, weak_scaling_reading
from workshop_lib.findings.keeping_accuracy_at_scale import TARGET_FRACTION
from workshop_lib.labs import when_things_go_wrong

# The exercises each takeaway reads, by notebook (keys of workshop_lib.labs).
CHALLENGE, STUCK, FIX = "challenge", "stuck_ranks", "debugging"
THIS_NOTEBOOK = "08_looking_back"
# Notebook 02's runs folder (its parameters cell's runs_dir, under the day's runs folder):
# its comparison's two arms, each a folder of seeds.
COMPARISON = ("02_ddp", "one_device", "scaled")


def day_exercises():
    """The exercises of the day's notebooks before this one, in their order."""
    on_the_day = {Path(s.notebook).stem for s in day.the_day()} - {THIS_NOTEBOOK}
    return [e for e in labs._load().values() if e.notebook in on_the_day]


def comparison_runs(day_runs):
    """Notebook 02's comparison under ``day_runs`` (the folder the day's notebooks wrote
    their runs in): (one-device runs, scaled runs), each [] where missing; a run cut short
    before its first epoch is left out."""
    folder, *arms = COMPARISON
    found = []
    for arm in arms:
        path = Path(day_runs) / folder / arm
        runs = runlog.read_all(path).values() if path.is_dir() else []
        found.append([run for run in runs if run.epochs])
    return tuple(found)


def verdicts(records, key):
    """The records of exercise ``key``, in the order they were made."""
    return [r for r in records if r.get("kind") == "exercise" and r.get("key") == key]


def latest(records, key=None, kind="exercise"):
    """The last record of exercise ``key`` (or of ``kind``, with no key), or None."""
    found = [r for r in records if r.get("kind") == kind and (key is None or r.get("key") == key)]
    return found[-1] if found else None


def missing(key, what, where):
    return Finding(key, f"You have no record of {what} yet: {where}, then run this notebook "
                        f"again.", holds=None)


def overview(records, exercises):
    """How many of the day's exercises (``exercises``: the ``labs`` Exercise objects of the
    notebooks the day covers) have a PASS, which are still NOT YET, which were never
    checked."""
    passed, not_yet, never = [], [], []
    for exercise in exercises:
        last = latest(records, exercise.key)
        if last is None:
            never.append(exercise.key)
        elif any(r["ok"] for r in verdicts(records, exercise.key)):
            passed.append(exercise.key)
        else:
            not_yet.append(exercise.key)
    text = (f"Your checks: {len(passed)} of {len(exercises)} exercises passed"
            + (f" ({', '.join(passed)})" if passed else ""))
    if not_yet:
        text += f"; NOT YET: {', '.join(not_yet)}"
    if never:
        text += f"; never checked: {', '.join(never)}"
    return Finding("overview", text + ".", holds=not not_yet and not never)


def progress_rows(records, exercises):
    """One row per exercise for the figure: its key, its notebook's number, how many times
    it was checked, and its state: "PASS" (passed at least once), "NOT YET" or "none"."""
    rows = []
    for exercise in exercises:
        mine = verdicts(records, exercise.key)
        state = "none" if not mine else "PASS" if any(r["ok"] for r in mine) else "NOT YET"
        rows.append({"key": exercise.key, "notebook": exercise.notebook[:2],
                     "checks": len(mine), "state": state})
    return rows


def speedup(one_device, scaled, folder="runs/02_ddp"):
    """The speed-up of notebook 02's comparison (``one_device``, ``scaled``: its runs, [] when
    they are missing from ``folder``), its scaling efficiency, and what limited it: each
    step's overhead among N (the notebook's own reading)."""
    if not one_device or not scaled:
        return Findings([missing("speedup", "notebook 02's comparison of 1 process against "
                                            "N (its section 4)",
                                 f"{folder} holds no finished runs of its two arms; run that "
                                 f"section of notebook 02")])
    r = weak_scaling_reading(one_device, scaled)
    if r is None:
        return Findings([skipped("speedup", "your notebook 02 comparison ran one process "
                                            "(nproc was 1): no speed-up to read.")])
    n, e = r["n"], r["efficiency"]
    said = (f"Your speed-up (notebook 02): an epoch took {r['t1']:.2f} s on 1 process and "
            f"{r['tn']:.2f} s on {n}, {r['speedup']:.2f}x, a scaling efficiency E = S/N of "
            f"{e:.0%}; a step took {r['step1'] * 1e3:.1f} ms alone and "
            f"{r['stepn'] * 1e3:.1f} ms among {n}.")
    if e >= EFFICIENT:
        limit = f" E is at least {EFFICIENT:.0%}: near-linear, little limited it."
    elif r["speedup"] <= 1:
        limit = (f" The {n} processes were no faster than one: what each step among them "
                 f"added (the all-reduce, waiting for each other"
                 + (", sharing the cores the one process had to itself" if r["on_cpu"] else "")
                 + ") outgrew the work they divided.")
    else:
        limit = (f" E is below {EFFICIENT:.0%}. What limited it: each step among {n} cost "
                 f"{r['overhead'] * 1e3:.1f} ms more than alone, "
                 + ("and the processes shared this CPU's cores, so more of them brought no "
                    "more compute." if r["on_cpu"] else
                    "the all-reduce not hidden behind the backward pass, DDP's host work and "
                    "waiting for the slowest rank: overhead every process pays on every step, "
                    "which lowers the efficiency at any N and sets no ceiling."))
    return Findings([Finding("speedup", said + limit, holds=r["speedup"] > 1)])


def accuracy_held(records):
    """Notebook 03's challenge: the batch at which the learner's accuracy held, and which of
    their runs' flags rescued it (the latest verdict's details)."""
    last = latest(records, CHALLENGE)
    if last is None:
        return missing("accuracy_held", "notebook 03's exercise (the large-batch challenge)",
                       "run its check cell")
    attempts = len(verdicts(records, CHALLENGE))
    d = last.get("details") or {}
    if "leaderboard" not in d:
        return Finding("accuracy_held", f"Your last challenge answer (of {attempts}) was "
                                        f"refused before anything trained, so there is no "
                                        f"batch to report yet: {last['reason']}", holds=False)
    if "large_batch" not in d:  # a verdict recorded before its details held the batches
        return Finding("accuracy_held", f"Your latest challenge verdict (of {attempts}): "
                                        f"{last['reason']}", holds=bool(last["ok"]))
    rows = {row["run"]: row for row in d["leaderboard"]}
    k = d["large_batch"] // d["small_batch"]
    basis = (f"the target {d['target']:.3f} ({TARGET_FRACTION:.0%} of the small batch "
             f"{d['small_batch']}'s final {d['small_acc']:.3f})")
    linear = rows.get("baseline_large_linear")
    versus = "" if linear is None else (
        " At the same batch the linear rule alone "
        + ("held it too." if linear["holds"] == "yes" else
           f"did not hold it (final {linear['final_val_acc']:.3f})."))
    bar = d.get("bar_epoch")
    sooner = "" if bar is None else (
        f" by epoch {bar}, sooner than section 2's square-root run on any of its seeds (its "
        f"earliest: epoch {bar + 1}),")
    if last["ok"]:
        win = rows[d["winner"]]
        epochs = d.get("seed_epochs", {}).get(d["winner"])
        at = (f"at epoch {', '.join(map(str, epochs))} on its {len(epochs)} seeds, " if epochs
              else "" if win.get("epoch") is None else f"at epoch {win['epoch']}, ")
        return Finding("accuracy_held",
                       f"Your accuracy held at global batch {d['large_batch']}, {k}x the small "
                       f"batch: your run {d['winner']!r} reached {basis} {at}in "
                       f"{win['seconds_to_target']:.2f} s of training and held it, final "
                       f"{win['final_val_acc']:.3f}. What rescued it: "
                       f"{d['runs'][d['winner']] or 'the defaults'}.{versus}", holds=True)
    best = max((rows[name] for name in d["runs"] if name in rows),
               key=lambda row: row["final_val_acc"], default=None)
    return Finding("accuracy_held",
                   f"Not held yet: in your latest challenge answer (of {attempts}) no run at "
                   f"global batch {d['large_batch']} ({k}x the small batch) reached "
                   f"{basis}{sooner} and held it"
                   + (f"; your best, {best['run']!r}, ended at {best['final_val_acc']:.3f}"
                      if best else "") + f".{versus}", holds=False)


def code_on(lines, number):
    """The code of line ``number`` (1-based) of ``lines``, without its comment."""
    return lines[number - 1].split("#", 1)[0].strip()


def hang(records, stub_lines):
    """Notebook 04: what the hung job looked like (where its ranks waited, as the learner
    read it) and whether their fix finished. ``stub_lines``: the hung script's lines, to
    quote the code of each line number."""
    stuck = latest(records, STUCK)
    if stuck is None:
        return Findings([missing("hang", "notebook 04's exercise (where each rank of the hung "
                                         "job waits)", "run its check cell")])
    if not any(r["ok"] for r in verdicts(records, STUCK)):
        return Findings([Finding("hang", f"Where the hung job's ranks waited is not read yet "
                                         f"(your latest answer: {stuck['reason']}).",
                                 holds=False)])
    passed = next(r for r in reversed(verdicts(records, STUCK)) if r["ok"])
    d = passed.get("details") or {}
    if "lines" not in d:  # recorded before its details held the lines
        return Findings([Finding("hang", f"The hang you read in notebook 04: "
                                         f"{passed['reason']}", holds=True)])
    lines = {int(rank): line for rank, line in d["lines"].items()}
    where = ", ".join(f"rank {rank} in line {line} ({code_on(stub_lines, line)})"
                      for rank, line in sorted(lines.items()))
    found = Findings([Finding(
        "hang", f"A hang, as you read it in notebook 04: {where}. Each waited in a collective "
                f"the other never called, so neither completed, and the job made no progress "
                f"and printed nothing until its {d['timeout_s']} s collective timeout; on GPUs "
                f"each would have shown busy, since NCCL's kernels spin while they wait.",
        holds=True)])
    fix = latest(records, FIX)
    if fix is None:
        found.append(missing("fix", "notebook 04's fix of the hung job", "run its check cell"))
    elif fix["ok"] and "seconds" not in (fix.get("details") or {}):
        found.append(Finding("fix", f"Your fix: {fix['reason']}", holds=True))
    elif fix["ok"]:
        f = fix["details"]
        found.append(Finding("fix", f"Your fix finished in {f['seconds']:.0f} s and reported "
                                    f"the accuracy of all {f['val_samples']} validation samples, "
                                    f"{f['val_acc']:.4f}.", holds=True))
    else:
        found.append(Finding("fix", f"Your fix of the hung job does not pass yet: "
                                    f"{fix['reason']}", holds=False))
    return found


def assessment(records):
    """What the learner's assessment job measured: the latest result its checks recorded
    (its cells, or Validate), with the job's numbers."""
    last = latest(records, kind="assessment")
    if last is None:
        return missing("assessment", "the assessment",
                       "open ddp_refactor/ddp_refactor.ipynb and run its cells, or press "
                       "Validate")
    d = last.get("details") or {}
    text = (f"Your assessment job, at its latest check ({last['time']}, "
            + ("Validate" if d.get("validate") else "its cells") + "): ")
    if "points" in d:
        text += (f"{d['points']} of {d['max_points']} points, "
                 + ("which passes the assessment's pass mark" if last["ok"] else
                    "which does not pass the assessment's pass mark yet"))
        if d.get("not_met"):
            text += f"; not met: {', '.join(d['not_met'])}"
    else:
        text += last["reason"]
    if d.get("samples_per_s"):  # the job ran and was timed (None for a job that failed)
        where = "GPUs" if d.get("on_gpu") else "CPU processes"
        text += (f". The job: {d['processes']} {where}, {d['epochs']} epochs in "
                 f"{d['elapsed_s']:.0f} s, {d['samples_per_s']:,.0f} training samples/s")
        text += (f", {d['speedup']:.2f}x one process's speed" if d.get("speedup")
                 else ", its speed-up over one process not measured (on the CPU it is not "
                      "required)" if not d.get("on_gpu") else ", its speed-up not measured")
    return Finding("assessment", text + ".", holds=bool(last["ok"]))


def takeaways(records, day_runs):
    """Every takeaway, in the day's order: from the records, and from notebook 02's runs
    under ``day_runs``."""
    return (speedup(*comparison_runs(day_runs), Path(day_runs) / COMPARISON[0])
            + Findings([accuracy_held(records)])
            + hang(records, when_things_go_wrong.stub_lines())
            + Findings([assessment(records)]))
