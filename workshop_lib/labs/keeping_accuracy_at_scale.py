"""Notebook 03, "The large-batch challenge": keep the accuracy at k times the batch.

It sits where section 2 shows the linear rule breaking: the hot base rate (the profile's
``hot_factor`` times its rate). The learner picks, for the large global batch, a
learning-rate rule, a warmup, an optimizer, a schedule (flags of the training script), as
one or several named runs. The check trains each at the large batch, for the notebook's
epoch budget and seed, beside two baselines: the small batch at the hot rate, and the
large batch with the linear rule from it. A leaderboard ranks every run by the training
time it took to reach the target accuracy (a stated fraction of the small batch's final
accuracy), then by final accuracy. The challenge is met when one of the learner's runs
reaches the target and holds it: it settles at or above the target (the lowest of its last
epochs) and never collapses on the way (a fall of COLLAPSE_PP from its running best after
warmup), the stability verdict of notebook 03's findings. Section 1's answer, the linear
rule (with or without its warmup), does not meet it at this rate.

The budget is the check's: a run whose flags set one of the options the check sets for
every run (epochs, batch size, base rate, seed, dataset, ...) is refused before anything
trains, since the training script takes the last of a repeated flag. So is a run that
trains what a run the notebook made before the challenge trained (``NOTEBOOK_SWEEPS``, its
sweep cells' variants, at the check's batch and rate). Runs are compared by what they
train, computed as the training script computes it (``what_it_trains``): the learning rate
of every optimizer step, the global batch, the optimizer and every other option that
changes the arithmetic. So order, abbreviations, ``--flag=value``, a restated default, a
warmup start without warmup epochs, or an option that changes only how a step is computed
(``--grad-checkpointing``, ``--channels-last``) make no new run.
"""
import argparse
import math
import re
import shlex
import tempfile
from pathlib import Path

from workshop_lib import cli, data, plans, profile, runlog, scaling, sweep
from workshop_lib.findings.keeping_accuracy_at_scale import (
    COLLAPSE_PP,
    TARGET_FRACTION,
    settled,
    worst_fall,
)
from workshop_lib.labs import Exercise, Verdict, register


def settings(p, batch_scale, epochs=None, hot_factor=None):
    """The challenge's sizes from a profile: small and large global batch, common flags
    (the epochs of notebook 03's sweeps: at least 100 steps for the large batch; the base
    rate of its section 2, ``hot_factor`` times the profile's)."""
    small, large = p.lr_ref_batch, p.lr_ref_batch * batch_scale
    base_lr = (hot_factor or p.hot_factor) * p.lr
    common = ["--device", p.device, "--dataset", p.dataset, "--model", p.model,
              "--epochs", str(epochs or p.sweep_epochs(batch_scale)), "--lr", f"{base_lr:g}",
              "--lr-ref-batch", str(small), "--seed", "0"]
    return small, large, common


def _training_parser(defaults=True):
    """The training script's parser: abbreviations (--epoch) and --flag=value read as it
    reads them; without ``defaults`` its namespace holds only what was given."""
    parser = cli.ArgumentParser(prog="python -m workshop_lib.train", add_help=False)
    cli.add_common_args(parser, default_out="runs/challenge")
    if not defaults:
        for action in parser._actions:
            action.default = argparse.SUPPRESS
    return parser


def _options_set_by(flags):
    """The options (the training script's names, e.g. "epochs") that ``flags`` set."""
    return set(vars(_training_parser(defaults=False).parse_args(flags)))


# Notebook 03's sweeps before the challenge, variant by variant, as its %%bash cells write
# them (tests/test_labs.py holds the cells to this list). Each cell's common flags are the
# budget the check sets itself: what is left of a variant is the run the learner could copy.
NOTEBOOK_SWEEPS = {
    "base_lr": {
        "small": "--batch-size $SMALL",
        "large_same_lr": "--batch-size $LARGE",
        "large_linear": "--batch-size $LARGE --lr-scaling linear",
        "large_linear_warmup": ("--batch-size $LARGE --lr-scaling linear "
                                "--warmup-epochs $WARMUP_EPOCHS"),
        "large_sqrt": "--batch-size $LARGE --lr-scaling sqrt",
    },
    "hot_lr": {
        "small": "--batch-size $SMALL",
        "large_linear": "--batch-size $LARGE --lr-scaling linear",
        "large_linear_warmup": ("--batch-size $LARGE --lr-scaling linear "
                                "--warmup-epochs $WARMUP_EPOCHS"),
        "large_sqrt": "--batch-size $LARGE --lr-scaling sqrt",
        "large_lars": "--batch-size $LARGE --lr-scaling linear --optimizer lars",
        "large_lamb": "--batch-size $LARGE --lr-scaling linear --optimizer lamb",
        "large_sqrt_stop": "--batch-size $LARGE --lr-scaling sqrt --target-accuracy $STOP_AT",
    },
}
SECTIONS = {"base_lr": "section 1", "hot_lr": "section 2"}
# Options that change how a run is shown or where it stops, not what it trains: early
# stopping cuts the same run short (its epochs up to the stop are the full run's).
NOT_THE_RUN = {"progress", "target_accuracy", "patience"}


def effective_options(flags, budget):
    """What a run trains with: the training script's namespace for ``flags`` (a list),
    defaults filled in, without the ``budget`` options (the check's) and NOT_THE_RUN."""
    chosen = vars(_training_parser().parse_args(flags))
    return {name: value for name, value in chosen.items()
            if name not in budget and name not in NOT_THE_RUN}


def _cell_flags(flags, epochs):
    """A sweep cell's variant with its shell variables given a value: the warmup the
    notebook gives a run of ``epochs``; the others stand only for budget options or options
    that are not the run."""
    warmup = str(plans.warmup_epochs(epochs))
    return shlex.split(re.sub(r"\$\w+", lambda m: warmup if m[0] == "$WARMUP_EPOCHS" else "1",
                              flags))


def notebook_runs(budget, epochs):
    """[(options, ["section 2's large_sqrt", ...])]: each distinct run the notebook made
    before the challenge, as the check would train it, with the variants that made it."""
    runs = []
    for folder, variants in NOTEBOOK_SWEEPS.items():
        for variant, flags in variants.items():
            options = effective_options(_cell_flags(flags, epochs), budget)
            named = f"{SECTIONS[folder]}'s {variant}"
            match = next((names for seen, names in runs if seen == options), None)
            if match is None:
                runs.append((options, [named]))
            else:
                match.append(named)
    return runs


def as_flags(options, budget):
    """``options`` (effective_options) as the shortest flags: the ones that differ from the
    training script's defaults, "" for none."""
    defaults = effective_options([], budget)
    flags = []
    for name, value in options.items():
        if value != defaults[name]:
            flag = "--" + name.replace("_", "-")
            flags += [flag] if value is True else [flag, f"{value:g}" if isinstance(
                value, float) else str(value)]
    return shlex.join(flags)


# What sets a run's learning rate at each step: compared as the rates themselves.
SCHEDULE = {"lr", "lr_scaling", "lr_ref_batch", "warmup_epochs", "warmup_from", "schedule"}
# Options that change how a step is computed, not what it computes: activations recomputed
# in backward, another memory layout, the data read another way, a fault injected.
HOW_NOT_WHAT = {"grad_checkpointing", "channels_last", "data_format", "data_dir",
                "inject_fault"}
DEFAULT_BATCH_SCALE = 16


def what_it_trains(flags, common, large):
    """What a run of ``flags`` (a list) trains at the global batch ``large`` with the
    check's ``common`` flags, computed as the training script computes it: the learning
    rate of every optimizer step, the global batch, and every option that changes the
    arithmetic (optimizer, momentum, weight decay, precision, ...)."""
    args = _training_parser().parse_args([*common, *flags, "--batch-size", str(large)])
    train_size = data.DATASETS[args.dataset].train_size
    global_batch = args.batch_size * args.accumulate
    steps_per_epoch = math.ceil(math.ceil(train_size / args.batch_size) / args.accumulate)
    lr = scaling.scaled_lr(args.lr, args.lr_scaling, global_batch, args.lr_ref_batch)
    warmup_steps = round(args.warmup_epochs * steps_per_epoch)
    start = scaling.warmup_start(args.warmup_from, args.lr, lr)
    total = args.epochs * steps_per_epoch
    rates = tuple(round(lr * scaling.lr_factor(step, warmup_steps, total, args.schedule,
                                               start), 12) for step in range(total))
    rest = {name: value for name, value in vars(args).items()
            if name not in SCHEDULE | HOW_NOT_WHAT | NOT_THE_RUN | {"out", "resume"}}
    return {**rest, "global_batch": global_batch, "lr_per_step": rates}


def _epochs(common):
    return _training_parser().parse_args(common).epochs


def challenge_batch(common):
    """The challenge's large global batch for ``common`` (its reference batch x 16)."""
    return _training_parser().parse_args(common).lr_ref_batch * DEFAULT_BATCH_SCALE


def copied_run(flags, common, large=None):
    """The names of the notebook's earlier runs that train what ``flags`` (a list) trains,
    at the check's batch ``large`` and rate, or None."""
    large = large or challenge_batch(common)
    trains = what_it_trains(flags, common, large)
    copied = [f"{SECTIONS[folder]}'s {variant}"
              for folder, variants in NOTEBOOK_SWEEPS.items()
              for variant, cell in variants.items()
              if what_it_trains(_cell_flags(cell, _epochs(common)), common, large) == trains]
    return copied or None


def budget_options(common):
    """What the check sets for every run, so no run may: its common flags, the batch size,
    and where the run is written."""
    return _options_set_by(common) | {"batch_size", "out", "resume"}


def refusal(my_runs, common, large=None):
    """The one-line reason to refuse ``my_runs`` before training (at the global batch
    ``large``, the challenge's by default), or None."""
    budget = budget_options(common)
    for name, flags in my_runs.items():
        if not isinstance(flags, str):
            return f"run {name!r}: give its flags as one string, e.g. '--lr-scaling sqrt'"
        try:
            overrides = _options_set_by(shlex.split(flags)) & budget
        except SystemExit:  # the parser printed its one line: the flag it does not know
            return (f"run {name!r}: {flags!r} are not flags of the training script (the "
                    f"error above says which); see python -m workshop_lib.train --help")
        except ValueError as bad:  # shlex: an unclosed quote
            return f"run {name!r}: cannot split {flags!r} into flags ({bad})"
        if overrides:
            given = ", ".join(f"--{option.replace('_', '-')}" for option in sorted(overrides))
            return (f"run {name!r} sets {given}: the budget is the challenge's, the same for "
                    f"every run ({', '.join(sorted(budget))}); choose the rule, warmup, "
                    f"optimizer, schedule or momentum instead")
        copied = copied_run(shlex.split(flags), common, large)
        if copied:
            options = as_flags(effective_options(shlex.split(flags), budget), budget)
            return (f"run {name!r} repeats a run the notebook made before the challenge "
                    f"({', '.join(copied)}: {options or 'the defaults'} trains with the "
                    f"same learning rate at every step, batch, optimizer and momentum, at "
                    f"this batch and rate): copying a cell above is no answer; change its "
                    f"rule, warmup, optimizer, schedule or momentum")
    return None


def run_baselines(out, p, batch_scale, epochs=None, hot_factor=None):
    """Section 2's small batch and its linear rule at the large batch (the notebook passes
    its own runs of the two instead)."""
    small, large, common = settings(p, batch_scale, epochs, hot_factor)
    return sweep.run_sweep(out, [("baseline_small", ["--batch-size", str(small)]),
                                 ("baseline_large_linear", ["--batch-size", str(large),
                                                            "--lr-scaling", "linear"])],
                           common)


def holds_target(run, target):
    """Reaches ``target`` and holds it: settles at or above it, with no collapse after
    warmup."""
    return (runlog.time_to_accuracy(run, target) is not None and settled(run) >= target
            and worst_fall(run)[0] < COLLAPSE_PP)


def leaderboard(runs, target):
    """Rows (name, seconds to target or None, final accuracy), best first."""
    rows = [{"run": name, "global_batch": run.start["global_batch_size"],
             "lr": run.start["lr"], "seconds_to_target": runlog.time_to_accuracy(run, target),
             "final_val_acc": run.final["val_acc"],
             "holds": "yes" if holds_target(run, target) else "no"} for name, run in runs.items()]
    return sorted(rows, key=lambda r: (r["seconds_to_target"] is None,
                                       r["seconds_to_target"] or 0, -r["final_val_acc"]))


def check(my_runs, profile_used=None, batch_scale=16, runs_dir=None, baselines=None,
          epochs=None, hot_factor=None):
    """Train ``my_runs`` ({name: "flags"}) at the large batch from the hot base rate and
    rank them."""
    if not isinstance(my_runs, dict) or not my_runs:
        return Verdict(False, "my_runs should map a name to the flags of a run, e.g. "
                              "{'linear': '--lr-scaling linear'}")
    p = profile_used or profile.get_profile("cpu", "digits")
    small, large, common = settings(p, batch_scale, epochs, hot_factor)
    refused = refusal(my_runs, common, large)
    if refused:
        return Verdict(False, refused)
    out = Path(runs_dir or tempfile.mkdtemp(prefix="lab-challenge-"))
    baselines = baselines or run_baselines(out, p, batch_scale, epochs, hot_factor)
    target = round(TARGET_FRACTION * baselines["baseline_small"].final["val_acc"], 4)
    mine = sweep.run_sweep(out, [(name, [*shlex.split(flags), "--batch-size", str(large)])
                                 for name, flags in my_runs.items()], common)
    board = leaderboard({**baselines, **mine}, target)
    print(_table(board, target))
    print(why_the_time(baselines["baseline_small"], [*mine.values(), *baselines.values()],
                       target))
    reached = [row for row in board if row["run"] in mine and row["seconds_to_target"]
               and holds_target(mine[row["run"]], target)]
    # What the closing notebook (08) reads back: the batches, the target and its basis, and
    # the flags of each of the learner's runs.
    details = {"leaderboard": board, "target": target, "small_batch": small,
               "large_batch": large, "small_acc": baselines["baseline_small"].final["val_acc"],
               "runs": dict(my_runs)}
    if not reached:
        said = "; ".join(f"{name}: settled at {settled(run):.3f}, worst fall after warmup "
                         f"{worst_fall(run)[0]:.1f} pp" for name, run in mine.items())
        return Verdict(False, f"none of your runs at batch {large} reached the target "
                              f"{target:.3f} ({TARGET_FRACTION:.0%} of the small batch's "
                              f"{baselines['baseline_small'].final['val_acc']:.3f}) and held "
                              f"it (settled at or above it, no fall of {COLLAPSE_PP:g} pp or "
                              f"more from its best after warmup) ({said}). "
                              f"{_hint(baselines, target)}", details)
    winner = reached[0]
    return Verdict(True, f"your run {winner['run']!r} reached {target:.3f} at batch {large} "
                         f"in {winner['seconds_to_target']:.2f} s of training (final "
                         f"{winner['final_val_acc']:.3f})", {**details,
                                                             "winner": winner["run"]})


def _hint(baselines, target):
    """What to try next, from what the baseline run of the linear rule did here."""
    linear = baselines.get("baseline_large_linear")
    if linear is not None and not holds_target(linear, target):
        return ("The linear rule's run did not hold the target at this base rate (its "
                "k-times step is too large here): what does the learning rate need?")
    return ("The linear rule's run held the target here: compare your flags with its "
            "(--lr-scaling linear).")


def _table(board, target):
    rows = [{**row, "seconds": "never" if row["seconds_to_target"] is None
             else f"{row['seconds_to_target']:.2f}"} for row in board]
    return runlog.format_table(rows, {
        "run": ("run", ""), "global_batch": ("global batch", "d"), "lr": ("lr", ".3g"),
        "seconds": (f"training s to {target:.3f}", ""), "holds": ("holds it", ""),
        "final_val_acc": ("final acc", ".4f")})


def why_the_time(small, runs, target):
    """Why the large batch is slower (or faster) to the target than the small one in
    training seconds: seconds = epochs to the target x seconds per epoch, and seconds per
    epoch follow samples/s, which a CPU does not raise much with the batch."""
    large = [run for run in runs if run.start["global_batch_size"] !=
             small.start["global_batch_size"] and runlog.time_to_accuracy(run, target)]
    if not large:
        return "No run at the large batch reached the target, so there is no time to compare."
    fastest = min(large, key=lambda run: runlog.time_to_accuracy(run, target))
    epochs = {id(run): next(e["epoch"] for e in run.epochs if e["val_acc"] >= target)
              for run in (small, fastest)}
    rates = {id(run): run.final["samples_per_s"] for run in (small, fastest)}
    ratio = rates[id(fastest)] / rates[id(small)]
    k = fastest.start["global_batch_size"] // small.start["global_batch_size"]
    return (f"Training seconds to the target = epochs to it x seconds per epoch. The small "
            f"batch needed {epochs[id(small)]} epoch(s) at {rates[id(small)]:,.0f} samples/s; "
            f"the fastest large-batch run needed {epochs[id(fastest)]} at "
            f"{rates[id(fastest)]:,.0f} samples/s ({ratio:.1f}x the small batch's, on "
            f"{fastest.start['device']}): a {k}x larger batch "
            + ("did not raise samples/s much here (under 2x), so the extra "
               "epochs it needs cost their full time; on GPUs, where a larger batch fills "
               "the device, samples/s grows with it." if ratio < 2 else
               "processed samples faster here, which pays for the extra epochs it needs "
               "only where the rate grows more than the epochs do."))


STUB = {"mine": "--lr-scaling linear"}  # section 1's answer, copied: refused
# Measured (CPU profile, digits, seed 0, hot rate 0.2, batch 512, 34 epochs): reaches 0.978
# at epoch 12, settles at 0.983, never falls more than 0.3 pp after its warmup.
REFERENCE = {"sqrt_warmup": "--lr-scaling sqrt --warmup-epochs 2"}


def earlier_runs(**_):
    """Every run the notebook made before the challenge (sections 1 and 2), as an answer:
    the check refuses each before training (section 2's square-root run would hold the
    target at this rate: measured, 0.978 at epoch 11)."""
    _, _, common = settings(profile.get_profile("cpu", "digits"), 16)
    budget = budget_options(common)
    return [{names[0].partition("'s ")[2]: as_flags(options, budget)}
            for options, names in notebook_runs(budget, _epochs(common))]


def budget_overrides(**_):
    """Answers that set the budget, or train an earlier run with flags that change nothing
    of it: refused before anything trains."""
    sqrt = "section 2's large_sqrt"
    return [({"longer": "--lr-scaling linear --epochs 200"}, "sets --epochs"),
            ({"hotter": "--lr=0.4"}, "sets --lr"),
            ({"bigger": "--batch 1024"}, "sets --batch-size"),
            ({"zero": "--lr-scaling sqrt --warmup-from zero"}, sqrt),  # no warmup to start
            ({"recompute": "--lr-scaling sqrt --grad-checkpointing"}, sqrt),
            ({"layout": "--lr-scaling sqrt --channels-last --warmup-epochs 0.1"}, sqrt)]

register(Exercise("challenge", "03_keeping_accuracy_at_scale", "keep the accuracy at k x the batch",
                  writes="my_runs: the flags of your runs at k x the batch, within the budget",
                  check=check, stub=lambda **_: dict(STUB), solution=lambda **_: dict(REFERENCE),
                  # No context: the stub and every earlier run are refused before anything
                  # trains, so only the solution's check trains the baselines.
                  stub_reason="repeats a run the notebook made",
                  earlier_runs=earlier_runs, refused=budget_overrides))
