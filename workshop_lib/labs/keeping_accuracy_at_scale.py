"""Notebook 03, "The large-batch challenge": keep the accuracy at k times the batch.

It sits where section 2 shows the linear rule breaking: the hot base rate (the profile's
``hot_factor`` times its rate). The learner picks, for the large global batch, a
learning-rate rule, a warmup, an optimizer, a schedule (flags of the training script), as
one or several named runs. The check trains each at the large batch, for the notebook's
epoch budget, on the seeds of section 2's square-root run (the notebook's and the next
two), beside baselines: the small batch at the hot rate, and the large batch with the
linear rule and with the square-root rule (on three seeds) from it. A leaderboard ranks
every run by the epochs it took to reach the target accuracy (a stated fraction of the
small batch's final accuracy), then by its training seconds and final accuracy. The
challenge is met when one of the learner's runs beats section 2's square-root run, the
best rule the notebook printed at this rate: on each of those seeds it reaches the target
before that run did on any of its three (SPREAD_SEEDS; the same steps per epoch at the
same batch, so epochs are steps, free of the machine's noise), and holds it: it settles at
or above the target (the lowest of its last epochs) and never collapses on the way (a fall
of COLLAPSE_PP from its running best after warmup), the stability verdict of notebook 03's
findings. Where no seed of the square-root run reached the target, holding it is enough.
Section 1's answer, the linear rule (with or without its warmup), does not meet it at this
rate; nor do the square-root run's small perturbations that change nothing of substance
(tests/test_notebook_03.py trains them).

The budget is the check's, and a run the notebook already made is no answer: both are
refused before anything trains (``_challenge_refusal``).
"""
import re
import shlex
import tempfile
from pathlib import Path

from workshop_lib import profile, runlog, sweep
from workshop_lib.findings.keeping_accuracy_at_scale import (
    COLLAPSE_PP,
    SPREAD_SEEDS,
    TARGET_FRACTION,
    settled,
    worst_fall,
)
from workshop_lib.labs import Exercise, Verdict, register
from workshop_lib.labs._challenge_refusal import (  # noqa: F401 - the tests read them here
    NOTEBOOK_SWEEPS,
    SECTIONS,
    _epochs,
    _options_set_by,
    as_flags,
    budget_options,
    notebook_runs,
    refusal,
)


def settings(p, batch_scale, epochs=None, hot_factor=None, seed=0):
    """The challenge's sizes from a profile: small and large global batch, common flags
    (the epochs of notebook 03's sweeps: at least 100 steps for the large batch; the base
    rate of its section 2, ``hot_factor`` times the profile's)."""
    small, large = p.lr_ref_batch, p.lr_ref_batch * batch_scale
    base_lr = (hot_factor or p.hot_factor) * p.lr
    common = ["--device", p.device, "--dataset", p.dataset, "--model", p.model,
              "--epochs", str(epochs or p.sweep_epochs(batch_scale)), "--lr", f"{base_lr:g}",
              "--lr-ref-batch", str(small), "--seed", str(seed)]
    return small, large, common


def run_baselines(out, p, batch_scale, epochs=None, hot_factor=None, seed=0):
    """Section 2's small batch, its linear rule, and its square-root rule on each seed of
    SPREAD_SEEDS, at the large batch (the notebook passes its own runs of these instead)."""
    small, large, common = settings(p, batch_scale, epochs, hot_factor, seed)
    sqrt = [(f"baseline_{SPREAD_SEEDS[0]}{suffix}", ["--batch-size", str(large), "--lr-scaling",
                                                     "sqrt", "--seed", str(seed)])
            for suffix, seed in seeded(common)]
    return sweep.run_sweep(out, [("baseline_small", ["--batch-size", str(small)]),
                                 ("baseline_large_linear", ["--batch-size", str(large),
                                                            "--lr-scaling", "linear"]),
                                 *sqrt], common)


def epochs_to(run, target):
    """The first epoch at which ``run`` reached ``target`` (None: never)."""
    return next((e["epoch"] for e in run.epochs if e["val_acc"] >= target), None)


def sqrt_epochs(baselines, target):
    """The epochs at which section 2's square-root run reached ``target``, seed by seed
    (None: never); the seeds passed (an older notebook passes seed 0 alone)."""
    return [epochs_to(baselines[f"baseline_{name}"], target) for name in SPREAD_SEEDS
            if f"baseline_{name}" in baselines]


def bar_epoch(baselines, target):
    """The latest epoch a winning run may reach the target at: before the earliest of the
    square-root run's seeds, so that it beats that run on every seed, not one seed's luck;
    None where no seed reached it, or one did in its first epoch (holding it wins)."""
    reached = [epoch for epoch in sqrt_epochs(baselines, target) if epoch is not None]
    # Reached in its first epoch on a seed: nothing is sooner, and holding it wins.
    return min(reached) - 1 if reached and min(reached) > 1 else None


def holds_target(run, target):
    """Reaches ``target`` and holds it: settles at or above it, with no collapse after
    warmup."""
    return (runlog.time_to_accuracy(run, target) is not None and settled(run) >= target
            and worst_fall(run)[0] < COLLAPSE_PP)


def leaderboard(runs, target):
    """Rows (name, epoch and seconds to target or None, final accuracy), best first."""
    rows = [{"run": name, "global_batch": run.start["global_batch_size"],
             "lr": run.start["lr"], "seconds_to_target": runlog.time_to_accuracy(run, target),
             "epoch": epochs_to(run, target),
             "final_val_acc": run.final["val_acc"],
             "holds": "yes" if holds_target(run, target) else "no"} for name, run in runs.items()]
    # Ranked as the challenge is judged: epochs to the target (steps, at one batch), then
    # training seconds (the machine's noise is in these), then final accuracy.
    return sorted(rows, key=lambda r: (r["epoch"] is None, r["epoch"] or 0,
                                       r["seconds_to_target"] or 0, -r["final_val_acc"]))


def check(my_runs, profile_used=None, batch_scale=16, runs_dir=None, baselines=None,
          epochs=None, hot_factor=None, seed=0):
    """Train ``my_runs`` ({name: "flags"}) at the large batch from the hot base rate, each
    on the square-root run's seeds, and rank them."""
    if not isinstance(my_runs, dict) or not my_runs:
        return Verdict(False, "my_runs should map a name to the flags of a run, e.g. "
                              "{'linear': '--lr-scaling linear'}")
    p = profile_used or profile.get_profile("cpu", "digits")
    small, large, common = settings(p, batch_scale, epochs, hot_factor, seed)
    refused = refusal(my_runs, common, large) or _name_refusal(my_runs)
    if refused:
        return Verdict(False, refused)
    out = Path(runs_dir or tempfile.mkdtemp(prefix="lab-challenge-"))
    baselines = baselines or run_baselines(out, p, batch_scale, epochs, hot_factor, seed)
    target = round(TARGET_FRACTION * baselines["baseline_small"].final["val_acc"], 4)
    seeds = seeded(common)
    # Every run on each seed at once (one wave where the GPUs are as many as the runs): a
    # win must hold on every seed, as the rescue verdicts' bar does, not on one seed's luck.
    trained = sweep.run_sweep(out, [(name + suffix, [*shlex.split(flags), "--batch-size",
                                                     str(large), "--seed", str(seed)])
                                    for name, flags in my_runs.items()
                                    for suffix, seed in seeds], common)
    mine = {name: trained[name] for name in my_runs}
    each = {name: [trained[name + suffix] for suffix, _ in seeds] for name in my_runs}
    # The square-root run's other seeds show as that run's "every seed", not as rows.
    shown = {name: run for name, run in baselines.items()
             if name in ("baseline_small", "baseline_large_linear", "baseline_large_sqrt")}
    board = leaderboard({**shown, **mine}, target)
    print(_table(board, target, each, baselines))
    print(why_the_time(baselines["baseline_small"], [*mine.values(), *baselines.values()],
                       target))
    bar = bar_epoch(baselines, target)
    reached = [row for row in board if row["run"] in mine
               and all(wins(run, target, bar) for run in each[row["run"]])]
    # What the closing notebook (08) reads back: the batches, the target and its basis, and
    # the flags of each of the learner's runs.
    details = {"leaderboard": board, "target": target, "small_batch": small,
               "large_batch": large, "small_acc": baselines["baseline_small"].final["val_acc"],
               "runs": dict(my_runs), "bar_epoch": bar,
               "seed_epochs": {name: [epochs_to(run, target) for run in runs]
                               for name, runs in each.items()}}
    seeds_text = ", ".join(str(seed) for _, seed in seeds)
    if not reached:
        said = "; ".join(f"{name}: reached it at epoch {_list(epochs_to(r, target) for r in runs)}"
                         f" on seeds {seeds_text}, settled at "
                         f"{_list(f'{settled(r):.3f}' for r in runs)}, worst fall after warmup "
                         f"{_list(f'{worst_fall(r)[0]:.1f}' for r in runs)} pp"
                         for name, runs in each.items())
        wanted = ("" if bar is None else f" by epoch {bar}, before section 2's square-root "
                  f"run on any of its seeds (epochs {_epochs_text(baselines, target)}),")
        return Verdict(False, f"none of your runs at batch {large} reached the target "
                              f"{target:.3f} ({TARGET_FRACTION:.0%} of the small batch's "
                              f"{baselines['baseline_small'].final['val_acc']:.3f}){wanted} "
                              f"and held it (settled at or above it, no fall of "
                              f"{COLLAPSE_PP:g} pp or more from its best after warmup) on "
                              f"every seed ({said}). {_hint(baselines, target)}", details)
    winner = reached[0]
    beat = ("" if bar is None else f", before section 2's square-root run on every seed "
            f"(epochs {_epochs_text(baselines, target)}; the bar: epoch {bar})")
    return Verdict(True, f"your run {winner['run']!r} reached {target:.3f} at batch {large} "
                         f"at epoch {_list(details['seed_epochs'][winner['run']])} on seeds "
                         f"{seeds_text}{beat} and held it on each, in "
                         f"{winner['seconds_to_target']:.2f} s of training on seed "
                         f"{seeds[0][1]} (final {winner['final_val_acc']:.3f})",
                   {**details, "winner": winner["run"]})


def _name_refusal(my_runs):
    """Why a run's name cannot be a run folder of the check, or None: each run trains as
    NAME, NAME_seed2 and NAME_seed3 beside the baselines, so a name must be a plain word of
    its own."""
    for name in my_runs:
        if not (isinstance(name, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", name)) \
                or name.startswith("baseline_") or re.search(r"_seed\d+$", name):
            return (f"run name {name!r}: use letters, digits, '_' or '-', not starting with "
                    f"'baseline_' nor ending in '_seed' and a number (the check names its "
                    f"own runs so), e.g. 'mine'")
    return None


def seeded(common):
    """``[(suffix, seed)]``: the run names' suffixes and seeds of the square-root run's
    SPREAD_SEEDS ("", the check's own seed; "_seed2", the next; ...)."""
    first = int(common[common.index("--seed") + 1])
    return [(name.removeprefix(SPREAD_SEEDS[0]), first + i)
            for i, name in enumerate(SPREAD_SEEDS)]


def wins(run, target, bar):
    """``run`` holds ``target``, reaching it by epoch ``bar`` (None: any epoch)."""
    return holds_target(run, target) and (bar is None or epochs_to(run, target) <= bar)


def _list(values):
    return ", ".join(str(value or "never") if not isinstance(value, str) else value
                     for value in values)


def _epochs_text(baselines, target):
    return ", ".join(str(epoch or "never") for epoch in sqrt_epochs(baselines, target))


def _hint(baselines, target):
    """What to try next, from what section 2's linear and square-root runs did here."""
    linear, sqrt = baselines.get("baseline_large_linear"), baselines.get("baseline_large_sqrt")
    said = []
    if linear is not None and not holds_target(linear, target):
        said.append("The linear rule's run did not hold the target at this base rate (its "
                    "k-times step is too large here).")
    elif linear is not None:
        said.append("The linear rule's run held the target here: compare your flags with its "
                    "(--lr-scaling linear).")
    if sqrt is not None and holds_target(sqrt, target):
        said.append(f"The square-root run held it, reaching it at epoch "
                    f"{_epochs_text(baselines, target)} on its seeds: "
                    f"what else sets how far a step goes (with SGD's momentum m, a steady "
                    f"gradient moves the weights lr/(1-m) a step), and what does a warmup "
                    f"cost in epochs?")
    return " ".join(said)


def _table(board, target, each=None, baselines=None):
    """The leaderboard, with the epoch each seed reached the target at, where known: the
    learner's runs and section 2's square-root run."""
    seeds = {name: _list(epochs_to(run, target) for run in runs)
             for name, runs in (each or {}).items()}
    if baselines is not None and f"baseline_{SPREAD_SEEDS[1]}" in baselines:
        seeds["baseline_large_sqrt"] = _epochs_text(baselines, target)
    rows = [{**row, "seconds": "never" if row["seconds_to_target"] is None
             else f"{row['seconds_to_target']:.2f}", "reached": str(row["epoch"] or "never"),
             "seeds": seeds.get(row["run"], "")} for row in board]
    return runlog.format_table(rows, {
        "run": ("run", ""), "global_batch": ("global batch", "d"), "lr": ("lr", ".3g"),
        "seconds": (f"training s to {target:.3f}", ""), "reached": ("at epoch", ""),
        "seeds": ("every seed", ""), "holds": ("holds it", ""),
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
    epochs = {id(run): epochs_to(run, target) for run in (small, fastest)}
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
# The square-root rate with a shorter step: momentum 0.8 halves lr/(1-m) against 0.9, and a
# one-epoch warmup. Measured (CPU profile, digits, hot rate 0.2, batch 512, 34 epochs,
# target 0.972): it reaches the target at epoch 9, 8, 7 on seeds 0, 1, 2 against the
# square-root run's 11, 10, 10, and holds it on each (its worst fall after warmup 0.3 pp).
REFERENCE = {"sqrt_shorter_step": "--lr-scaling sqrt --momentum 0.8 --warmup-epochs 1"}


def earlier_runs(**_):
    """Every run the notebook made before the challenge (sections 1 and 2), as an answer:
    the check refuses each before training (section 2's square-root run would otherwise
    be judged against itself)."""
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
