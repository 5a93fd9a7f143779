"""Notebook 03, "The large-batch challenge": keep the accuracy at k times the batch.

The learner picks, for the large global batch, a learning-rate rule, a warmup and an
optimizer (any flags of the training script), as one or several named runs. The check
trains each at the large batch, for the notebook's epoch budget and seed, beside two
baselines: the small batch at its tuned rate, and the large batch at that same rate. A
leaderboard ranks every run by the training time it took to reach the target accuracy
(a stated fraction of the small batch's final accuracy), then by final accuracy. The
challenge is met when one of the learner's runs reaches the target.
"""
import shlex
import tempfile
from pathlib import Path

from workshop_lib import profile, runlog, sweep
from workshop_lib.labs import Exercise, Verdict, register

TARGET_FRACTION = 0.98  # of the small batch's final validation accuracy


def settings(p, batch_scale, epochs=None):
    """The challenge's sizes from a profile: small and large global batch, common flags
    (the epochs of notebook 03's sweeps: at least 100 steps for the large batch)."""
    small, large = p.lr_ref_batch, p.lr_ref_batch * batch_scale
    common = ["--device", p.device, "--dataset", p.dataset, "--model", p.model,
              "--epochs", str(epochs or p.sweep_epochs(batch_scale)), "--lr", str(p.lr),
              "--lr-ref-batch", str(small), "--seed", "0"]
    return small, large, common


def run_baselines(out, p, batch_scale, epochs=None):
    small, large, common = settings(p, batch_scale, epochs)
    return sweep.run_sweep(out, [("baseline_small", ["--batch-size", str(small)]),
                                 ("baseline_large_same_lr", ["--batch-size", str(large)])],
                           common)


def leaderboard(runs, target):
    """Rows (name, seconds to target or None, final accuracy), best first."""
    rows = [{"run": name, "global_batch": run.start["global_batch_size"],
             "lr": run.start["lr"], "seconds_to_target": runlog.time_to_accuracy(run, target),
             "final_val_acc": run.final["val_acc"]} for name, run in runs.items()]
    return sorted(rows, key=lambda r: (r["seconds_to_target"] is None,
                                       r["seconds_to_target"] or 0, -r["final_val_acc"]))


def check(my_runs, profile_used=None, batch_scale=16, runs_dir=None, baselines=None,
          epochs=None):
    """Train ``my_runs`` ({name: "flags"}) at the large batch and rank them."""
    if not isinstance(my_runs, dict) or not my_runs:
        return Verdict(False, "my_runs should map a name to the flags of a run, e.g. "
                              "{'linear': '--lr-scaling linear'}")
    p = profile_used or profile.get_profile("cpu", "digits")
    out = Path(runs_dir or tempfile.mkdtemp(prefix="lab-challenge-"))
    small, large, common = settings(p, batch_scale, epochs)
    baselines = baselines or run_baselines(out, p, batch_scale, epochs)
    target = round(TARGET_FRACTION * baselines["baseline_small"].final["val_acc"], 4)
    mine = sweep.run_sweep(out, [(name, [*shlex.split(flags), "--batch-size", str(large)])
                                 for name, flags in my_runs.items()], common)
    board = leaderboard({**baselines, **mine}, target)
    print(_table(board, target))
    reached = [row for row in board if row["run"] in mine and row["seconds_to_target"]]
    best = max(mine.values(), key=lambda run: run.final["val_acc"])
    if not reached:
        return Verdict(False, f"none of your runs at batch {large} reached the target "
                              f"{target:.3f} ({TARGET_FRACTION:.0%} of the small batch's "
                              f"{baselines['baseline_small'].final['val_acc']:.3f}); your best "
                              f"ended at {best.final['val_acc']:.3f}. The step count fell "
                              f"{large // small}x: what does the learning rate need?",
                       {"leaderboard": board, "target": target})
    winner = reached[0]
    return Verdict(True, f"your run {winner['run']!r} reached {target:.3f} at batch {large} "
                         f"in {winner['seconds_to_target']:.2f} s of training (final "
                         f"{winner['final_val_acc']:.3f})", {"leaderboard": board,
                                                             "target": target})


def _table(board, target):
    rows = [{**row, "seconds": "never" if row["seconds_to_target"] is None
             else f"{row['seconds_to_target']:.2f}"} for row in board]
    return runlog.format_table(rows, {
        "run": ("run", ""), "global_batch": ("global batch", "d"), "lr": ("lr", ".3g"),
        "seconds": (f"training s to {target:.3f}", ""), "final_val_acc": ("final acc", ".4f")})


def context():
    """The baselines, trained once for both of `labs check`'s runs of the check."""
    return {"baselines": run_baselines(tempfile.mkdtemp(prefix="lab-challenge-"),
                                       profile.get_profile("cpu", "digits"), 16)}


STUB = {"mine": "--lr-scaling none"}
REFERENCE = {"linear_warmup": "--lr-scaling linear --warmup-epochs 1"}

register(Exercise("challenge", "03_keeping_accuracy_at_scale", "keep the accuracy at k x the batch",
                  writes="my_runs: the flags of your runs at k x the batch, within the budget",
                  check=check, stub=lambda **_: dict(STUB), solution=lambda **_: dict(REFERENCE),
                  stub_reason="none of your runs", context=context))
