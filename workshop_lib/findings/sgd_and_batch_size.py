"""Notebook 01, SGD and the effect of batch size: its closing findings, computed from its runs."""
from workshop_lib import runlog
from workshop_lib.findings.base import Finding, Findings, settled, settled_epochs

GAP_PP = 1.0           # an accuracy difference smaller than this is no gap (digits: 3 samples)
UNDERTRAINED = 2.0     # a training loss this many times the reference's: under-trained
RECOVERED = 0.5        # a rule "restores" accuracy when it wins back this share of the gap


def toy(runs, problem):
    """The SGD toy: per-epoch progress and noise of full batch, mini-batch, one sample."""
    best = problem.loss(*problem.best_params())
    full, *_, single = runs
    return Findings([Finding(
        "toy", f"Toy, {full.epochs[-1]:.0f} epochs at lr {full.lr:g}: "
               + ", ".join(f"{run.label} ended at loss {run.final_loss:.3f}" for run in runs)
               + f" (best possible {best:.3f}); the loss rose after "
               + ", ".join(f"{run.noisiness():.0%} of {run.label} steps" for run in runs) + ".",
        holds=single.final_loss < full.final_loss)])


def peak_samples_per_s(run):
    return max(run.column("samples_per_s"))


def fixed_epoch_gap(reference, large):
    """Same learning rate, same epochs: what k times the batch did to steps, loss, accuracy."""
    k = large.start["global_batch_size"] // reference.start["global_batch_size"]
    steps = [run.start["steps_per_epoch"] * len(run.epochs) for run in (reference, large)]
    gap_pp = 100 * (reference.final["val_acc"] - large.final["val_acc"])
    loss_ratio = large.final["train_loss"] / reference.final["train_loss"]
    said = (f"At the same learning rate and {len(large.epochs)} epochs, batch "
            f"{large.start['global_batch_size']} took {steps[1]} optimizer steps against "
            f"{steps[0]} for batch {reference.start['global_batch_size']} ({k}x fewer): its "
            f"training loss ended {loss_ratio:.1f}x higher and its validation accuracy "
            f"{gap_pp:.1f} pp lower ({large.final['val_acc']:.3f} against "
            f"{reference.final['val_acc']:.3f}). ")
    if gap_pp >= GAP_PP and loss_ratio >= UNDERTRAINED:
        said += (f"A gap (>= {GAP_PP} pp) of an under-trained model (training loss >= "
                 f"{UNDERTRAINED:g}x): at a fixed budget of epochs the large batch lacks steps.")
    elif gap_pp >= GAP_PP:
        said += f"A gap (>= {GAP_PP} pp) with a training loss as low: not under-training."
    else:
        said += f"No accuracy gap at this budget (under {GAP_PP} pp)."
    return Finding("gap", said, holds=gap_pp >= GAP_PP)


def rule_restores(reference, large, scaled, rule="linear"):
    """Whether the learning-rate ``rule`` at the large batch wins back the gap, judged on the
    settled accuracies (the lowest of each run's last epochs), not on a last epoch."""
    gap = settled(reference) - settled(large)
    won = settled(scaled) - settled(large)
    share = won / gap if gap > 0 else float("nan")
    holds = gap > 0 and share >= RECOVERED
    return Finding(f"{rule}_restores", (
        f"With the {rule} rule (lr {scaled.start['lr']:g}) batch "
        f"{scaled.start['global_batch_size']} settled at {settled(scaled):.3f} (the lowest of "
        f"its last {settled_epochs(scaled)} epochs; the small batch {settled(reference):.3f}, "
        f"the large one at the same rate {settled(large):.3f}): "
        + (f"{share:.0%} of the gap won back (the bar: {RECOVERED:.0%})." if gap > 0 else
           "there was no gap to win back.")), holds=holds)


def time_to_accuracy(runs, target_fraction=0.97):
    """Which batch reached a target accuracy in the least training time."""
    target = round(target_fraction * max(run.best_val_acc for run in runs), 2)
    times = {run.start["global_batch_size"]: runlog.time_to_accuracy(run, target)
             for run in runs}
    reached = {batch: t for batch, t in times.items() if t is not None}
    fastest = min(reached, key=reached.get) if reached else None
    busiest = max(runs, key=peak_samples_per_s).start["global_batch_size"]
    never = [str(b) for b, t in times.items() if t is None]
    return Findings([Finding(
        "time_to_accuracy",
        (f"Time to {target:.2f} validation accuracy: batch {fastest} was fastest "
         f"({reached[fastest]:.2f} s of training); the highest throughput was batch "
         f"{busiest}'s" + (f"; batch {', '.join(never)} never got there" if never else "")
         + ".") if fastest else f"No batch reached {target:.2f}.",
        holds=fastest is not None and fastest != busiest)]), times, target


def batch_size_sweep(same_lr, linear, reference_batch):
    """Notebook 01's real-model sweep: ``same_lr`` runs sorted by batch, ``linear`` the
    largest batch with the linear rule."""
    reference = next(r for r in same_lr if r.start["global_batch_size"] == reference_batch)
    smallest, largest = same_lr[0], same_lr[-1]
    ratio = peak_samples_per_s(largest) / peak_samples_per_s(smallest)
    found = Findings([Finding(
        "throughput", f"Throughput: batch {largest.start['global_batch_size']} trained at "
                      f"{peak_samples_per_s(largest):,.0f} samples/s, {ratio:.1f}x batch "
                      f"{smallest.start['global_batch_size']}'s "
                      f"{peak_samples_per_s(smallest):,.0f}.", holds=ratio > 1),
        fixed_epoch_gap(reference, largest)])
    if linear is not None:
        found.append(rule_restores(reference, largest, linear))
    return found + time_to_accuracy(same_lr)[0]
