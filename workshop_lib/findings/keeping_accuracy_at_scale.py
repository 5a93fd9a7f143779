"""Notebook 03, Keeping accuracy at scale: its closing findings, computed from its runs.

The rescue and stability verdicts judge the whole curve, not its last point: a run that
collapses mid-way and climbs back as the schedule decays ends high, and is no rescue.
"""
import math

from workshop_lib import runlog
from workshop_lib.findings.base import Finding, Findings, settled, settled_epochs, skipped
from workshop_lib.findings.sgd_and_batch_size import (
    GAP_PP,
    RECOVERED,
    fixed_epoch_gap,
    rule_restores,
)

BN_TOLERANCE = 1e-5  # two runs this close in their weights are the same up to float rounding
TARGET_FRACTION = 0.98  # a target accuracy: this fraction of a small batch's final one
COLLAPSE_PP = 5.0    # a fall this large from the running best after warmup is a collapse
                     # (digits: 18 of 359 validation images), not epoch-to-epoch noise


def worst_fall(run):
    """(pp, best, its epoch, low, its epoch): the largest fall of validation accuracy below
    its running best, over the epochs after warmup (a warmup's own climb is not judged)."""
    warmup_epochs = math.ceil(run.start.get("warmup_steps", 0) / run.start["steps_per_epoch"])
    best = best_epoch = None
    fall = (0.0, None, None, None, None)
    for epoch in run.epochs[warmup_epochs:]:
        if best is None or epoch["val_acc"] > best:
            best, best_epoch = epoch["val_acc"], epoch["epoch"]
        if 100 * (best - epoch["val_acc"]) > fall[0]:
            fall = (100 * (best - epoch["val_acc"]), best, best_epoch, epoch["val_acc"],
                    epoch["epoch"])
    return fall


def _fall_words(run):
    pp, best, best_epoch, low, low_epoch = worst_fall(run)
    if not pp:
        return "never fell below its running best after warmup"
    return (f"worst fall after warmup {pp:.1f} pp ({best:.3f} at epoch {best_epoch} to "
            f"{low:.3f} at epoch {low_epoch})")


# Section 2's square-root run, trained on this many seeds (its variants, in this order):
# the spread of their settled accuracies is the noise every rescue verdict must clear, since
# the rescues themselves run on one seed each.
SPREAD_SEEDS = ("large_sqrt", "large_sqrt_seed2", "large_sqrt_seed3")


def seed_spread(hot):
    """``(pp, runs)``: the spread (max - min, in points) of the settled accuracies of the
    square-root run's seeds in ``hot``, and those runs (older records: seed 0 alone, 0 pp)."""
    runs = [hot[name] for name in SPREAD_SEEDS if name in hot]
    accuracies = [settled(run) for run in runs] or [0.0]
    return 100 * (max(accuracies) - min(accuracies)), runs


def spread_finding(hot):
    """How far one seed's run is from another's, measured: the bar's noise, stated."""
    pp, runs = seed_spread(hot)
    if len(runs) < len(SPREAD_SEEDS):  # a sweep recorded before the seeds joined it
        return skipped("seed_spread", f"the square-root run on {len(runs)} seed(s) only (a "
                                      f"sweep recorded before its {len(SPREAD_SEEDS)} seeds): "
                                      f"no spread to judge the rescues against")
    seeds = ", ".join(str(run.start["args"].get("seed", "?")) for run in runs)
    held = sum(worst_fall(run)[0] < COLLAPSE_PP for run in runs)
    return Finding("seed_spread", f"The square-root run on {len(runs)} seed(s) ({seeds}): "
                                  f"settled at " + ", ".join(f"{settled(run):.3f}" for run in runs)
                   + f", a spread of {pp:.1f} pp; {held} of {len(runs)} never collapsed (a fall "
                     f"of {COLLAPSE_PP:g} pp). Each rescue below is one seed's run, so it must "
                     f"also win back more than this spread: less is what another seed could "
                     f"give.")


def _rescue(name, what, broken, rescued, reference, noise_pp=0.0):
    """Whether ``rescued`` wins back at least RECOVERED of what ``broken`` lost against
    ``reference``, and more than ``noise_pp`` (the seeds' spread), judged on the whole
    curve: settled accuracies (the last epochs' lowest), and no collapse (a fall of
    COLLAPSE_PP or more from the running best after warmup)."""
    lost = settled(reference) - settled(broken)
    won = settled(rescued) - settled(broken)
    collapsed = worst_fall(rescued)[0] >= COLLAPSE_PP
    enough = won >= RECOVERED * lost and 100 * won > noise_pp
    holds = lost > 0 and enough and not collapsed
    if lost <= 0:
        verdict = "nothing was lost to win back."
    elif won < 0:
        verdict = (f"{-100 * won:.1f} pp below the broken run itself: no rescue here "
                   f"(the bar: {RECOVERED:.0%} of the loss won back).")
    else:
        verdict = f"{won / lost:.0%} of the loss won back (the bar: {RECOVERED:.0%})"
        if won >= RECOVERED * lost and 100 * won <= noise_pp:
            verdict += (f", but {100 * won:.1f} pp is within the seeds' spread of "
                        f"{noise_pp:.1f} pp: another seed could give as much; not shown"
                        + (f", and it collapsed on the way (a fall of {COLLAPSE_PP:g} pp or "
                           f"more)." if collapsed else "."))
        else:
            verdict += (f", but it collapsed on the way (a fall of {COLLAPSE_PP:g} pp or "
                        f"more): not a rescue, whatever the end." if collapsed and enough
                        else ".")
    return Finding(name, f"{what} (lr {rescued.start['lr']:.3g}): settled at "
                         f"{settled(rescued):.3f} (the lowest of its last "
                         f"{settled_epochs(rescued)} epochs; last "
                         f"{rescued.final['val_acc']:.3f}), {_fall_words(rescued)}; "
                         f"{verdict}", holds=holds)


def accuracy_at_scale(base, hot, hot_factor):
    """Notebook 03's sweeps: ``base`` and ``hot`` map run names to Runs (the same epochs,
    seed and large batch; ``hot`` from a base rate ``hot_factor`` times larger)."""
    small, large = base["small"], base["large_same_lr"]
    found = Findings([
        Finding("budget", f"Every run below: {len(small.epochs)} epochs, seed "
                          f"{small.start['args']['seed']}, batch "
                          f"{small.start['global_batch_size']} (small) or "
                          f"{large.start['global_batch_size']} (large, "
                          f"{large.start['steps_per_epoch'] * len(large.epochs)} steps)."),
        fixed_epoch_gap(small, large),
        rule_restores(small, large, base["large_linear"], "linear"),
        rule_restores(small, large, base["large_sqrt"], "sqrt"),
    ])
    hot_small, broken = hot["small"], hot["large_linear"]
    fine = settled(hot_small) >= settled(small) - GAP_PP / 100
    found.append(Finding("hot_small", f"A base rate {hot_factor:g}x larger "
                                      f"({hot_small.start['lr']:.3g}) at the small batch: "
                                      f"settled at {settled(hot_small):.3f} against "
                                      f"{settled(small):.3f}, "
                         + (f"as good as the base rate (within {GAP_PP} pp)." if fine else
                            f"already more than {GAP_PP} pp worse than the base rate: it is "
                            f"too hot even there."),
                         holds=fine))
    drop_pp = 100 * (settled(hot_small) - settled(broken))
    breaks = drop_pp >= GAP_PP
    found.append(Finding("linear_breaks", f"Scaled linearly from it (lr "
                                          f"{broken.start['lr']:.3g}): settled at "
                                          f"{settled(broken):.3f}, {drop_pp:.1f} pp below the "
                                          f"small batch at that rate (settled: the lowest of "
                                          f"the last epochs), {_fall_words(broken)}: "
                         + ("the linear rule breaks here." if breaks else
                            f"within {GAP_PP} pp, so it does not break at this budget."),
                         holds=breaks))
    noise_pp, _ = seed_spread(hot)
    found.append(spread_finding(hot))
    for key, what in (("large_linear_warmup", "Gradual warmup from the base rate"),
                      ("large_sqrt", "The square-root rule"),
                      ("large_lars", "LARS at the linear rate"),
                      ("large_lamb", "LAMB at the linear rate"),
                      ("large_novograd", "NovoGrad at the linear rate")):
        if key in hot:  # LAMB and NovoGrad joined the sweep later: older records lack them
            found.append(_rescue(f"hot_{key.removeprefix('large_')}", what, broken, hot[key],
                                 hot_small, noise_pp))
    return found


def stop_target(small):
    """The target of section 2's early-stopped run: TARGET_FRACTION of section 1's small
    batch's final accuracy (the challenge's rule; section 2's own small batch is not
    trained yet when its sweep starts)."""
    return round(TARGET_FRACTION * small.final["val_acc"], 3)


def early_stopping(stopped, full, target):
    """What ``--target-accuracy target`` saved: ``stopped`` against ``full``, the same run
    (flags, seed) trained to the end. Called stopped early only when it reached the target
    and ended before the budget's epochs."""
    budget, patience = len(full.epochs), stopped.start["args"].get("patience", "1")
    reached = runlog.time_to_accuracy(stopped, target) is not None
    if not reached or len(stopped.epochs) >= budget:
        return Findings([Finding(
            "early_stopping", f"With --target-accuracy {target:.3f} the run never reached "
                              f"it for {patience} epoch(s) in a row: it trained all "
                              f"{len(stopped.epochs)} epochs, nothing saved.", holds=False)])
    spent = sum(e["epoch_s"] for e in stopped.epochs)
    whole = sum(e["epoch_s"] for e in full.epochs)
    apart = max(abs(a["val_acc"] - b["val_acc"])  # the full run is the longer one
                for a, b in zip(stopped.epochs, full.epochs[:len(stopped.epochs)], strict=True))
    return Findings([Finding(
        "early_stopping", f"Stopped once validation accuracy reached {target:.3f} for "
                          f"{patience} epoch(s) in a row: after epoch {len(stopped.epochs)} "
                          f"of {budget}, {spent:.1f} s of training against {whole:.1f} s for "
                          f"the same run to the end, {whole - spent:.1f} s "
                          f"({(whole - spent) / whole:.0%}) saved; the full run went on to "
                          f"{full.final['val_acc']:.3f} ("
                          + ("its curve up to the stop is the full run's, epoch for epoch)."
                             if apart == 0 else f"the two curves differ by up to "
                             f"{100 * apart:.1f} pp before the stop: not bit-identical "
                             f"runs here)."), holds=True)])


def batchnorm(equivalence):
    """N ranks x batch b against one process with batch N x b, with and without BatchNorm
    (``python -m workshop_lib.equivalence``'s result)."""
    if equivalence is None:
        return Findings([skipped("batchnorm", "comparing ranks with one process needs two "
                                              "ranks or more; this execution ran one.")])
    diff = equivalence["max_abs_difference"]
    world, batch = equivalence["world_size"], equivalence["batch_size"]
    tolerance = BN_TOLERANCE
    same = diff["bn_free"] < tolerance
    found = Findings([Finding(
        "bn_free", f"Without BatchNorm, {world} ranks x batch {batch} and one process x batch "
                   f"{world * batch} end {diff['bn_free']:.1e} apart after "
                   f"{equivalence['steps']} steps: "
                   + (f"the same (float rounding, under {tolerance:.0e})." if same else
                      f"more than float rounding ({tolerance:.0e}): something besides "
                      f"BatchNorm differs between the two here."), holds=same)])
    differs = diff["batchnorm"] >= tolerance
    found.append(Finding(
        "batchnorm", f"With BatchNorm they end {diff['batchnorm']:.1e} apart: "
                     + (f"more than float rounding ({tolerance:.0e}): each rank normalises with "
                        f"its own {batch} samples' statistics, so a DDP job is not one process "
                        f"with the global batch." if differs else
                        f"within float rounding ({tolerance:.0e}): the per-rank statistics "
                        f"made no measurable difference in this run."), holds=differs))
    if "sync_batchnorm" in diff:
        restored = diff["sync_batchnorm"] < tolerance
        found.append(Finding(
            "sync_batchnorm", f"With SyncBatchNorm: {diff['sync_batchnorm']:.1e} apart: "
                              + ("the global batch's statistics again (under "
                                 f"{tolerance:.0e})." if restored else
                                 f"still more than float rounding ({tolerance:.0e}): "
                                 f"SyncBatchNorm did not give one process's steps here."),
            holds=restored))
    else:
        found.append(skipped("sync_batchnorm", "SyncBatchNorm needs CUDA tensors; on GPUs this "
                                               "cell shows it matching one process."))
    return found


def _noise_words(est, small, large):
    if est["b_noise"] is None:
        return (f"not resolved: the signal |G|^2 is below what {est['batches']} batches of "
                f"{est['big']} resolve, so the noise scale is past the batches measured "
                f"(every batch up to {large} noise-dominated)")
    return f"B_noise ~ {est['b_noise']:.0f}: " + ", ".join(
        f"batch {b} below it (noise-dominated)" if b < est["b_noise"] else
        f"batch {b} {b / est['b_noise']:.1f}x above it (signal-dominated)" for b in (small, large))


def noise_scale(estimates, small, large):
    """``noise_scale.at_start_and_trained``'s estimates against the notebook's small and
    large batch: where each sits against B_noise at the start and after training. Judges
    nothing: a batch above B_noise buys little per step, one below it ~k times the progress
    for k times the batch (the linear rule's regime)."""
    start, trained = estimates["start"], estimates["trained"]
    grew = (start["b_noise"] is not None and
            (trained["b_noise"] is None or trained["b_noise"] > start["b_noise"]))
    return Findings([Finding(
        "noise_scale", f"Gradient noise scale at initialization: "
                       f"{_noise_words(start, small, large)}; after the small batch's "
                       f"training: {_noise_words(trained, small, large)}. "
                       + ("It grew as the loss fell: the large batch loses most per step "
                          "early, which is where warmup holds its rate back."
                          if grew else "It did not grow here as the loss fell."))])
