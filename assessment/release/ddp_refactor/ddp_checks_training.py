"""The checks of how the job trains: to the target accuracy in time (requirement 1), each
rank on a shard of its own that covers the data with the others' (2) and is reshuffled
every epoch (3), at a learning rate scaled to the global batch (8).

Each ``check_<grade id>`` judges one requirement from the records of all ranks (the batches
each rank's DataLoader handed out, its learning rates, its final model's scores), prints
``PASS: ...`` or raises ``RequirementNotMet`` with the reason in one line. Nothing reads
the script's source: any correct way of writing it passes.

Your copy of this file is replaced by the instructor's when your work is graded.

Standard library only: the notebook's kernel imports this file.
"""
import math

from ddp_checks_rules import (
    SPEEDUP_NOT_REQUIRED_ON_CPU,
    SPEEDUP_PER_GPU,
    SPEEDUP_UNCALIBRATED,
    RequirementNotMet,
)
from ddp_checks_run import _passed, _require, _require_model

LR_RTOL = 1e-3


def check_runs_and_reaches_target_accuracy(run):
    """The job finishes in time on every rank and rank 0's final model reaches the target
    accuracy on the whole validation set. The speed-up over one process is reported where
    it was measured, and never fails the requirement (SPEEDUP_UNCALIBRATED)."""
    _require_model(run)
    evaluation = run.ranks[0]["val_eval"]
    if "error" in evaluation:
        raise RequirementNotMet(f"rank 0: {evaluation['error']}")
    acc = sum(evaluation["correct"]) / len(evaluation["correct"])
    target = run.config.target_accuracy
    reached = (f"after {run.config.epochs} epochs the model classifies {acc:.1%} of the "
               f"validation set correctly")
    if acc < target:
        raise RequirementNotMet(f"{reached}; the target is {target:.0%}.")
    reached += f" (target {target:.0%}), in {run.elapsed_s:.0f} s"
    speedup, why_not = run.speed()
    if run.on_gpu and run.measures_speedup:
        bar = SPEEDUP_PER_GPU * run.nproc
        if speedup is None:
            reached += f"; the speed-up over one GPU: {why_not}"
        else:
            reached += (f"; {speedup:.2f} times as fast as one GPU (the bar, "
                        f"{SPEEDUP_PER_GPU} x {run.nproc} = {bar:.2f}, is "
                        f"{SPEEDUP_UNCALIBRATED})")
            if speedup < bar:
                reached += (". Below the bar, look for work that every rank repeats in "
                            "full, work on rank 0 alone inside the training loop that the "
                            "others wait for, or ranks sharing one GPU "
                            "(torch.cuda.set_device(local_rank) and device_ids=[local_rank])")
        _passed(reached + ".")
        return
    if speedup is not None:
        reached += (f"; {speedup:.2f} times as fast as one process "
                    f"({SPEEDUP_NOT_REQUIRED_ON_CPU})")
    _passed(reached + ".")


# --------------------------------------------------------------------------------------
# The shards: which samples each rank drew in each epoch.
# --------------------------------------------------------------------------------------

def _train_passes(run):
    """``[rank][epoch] -> list of batches``, each the training-set indices of one batch."""
    passes = [[p["batches"] for p in record["passes"] if p["split"] == "train"]
              for record in run.ranks]
    epochs = run.config.epochs
    for rank, rank_passes in enumerate(passes):
        if len(rank_passes) != epochs:
            raise RequirementNotMet(
                f"rank {rank} went through a DataLoader over train_set {len(rank_passes)} "
                f"times in {epochs} epochs; expected once per epoch. Keep training from a "
                f"DataLoader over train_set (with a sampler, or over a Subset of it).")
    return passes


def _samples(batches):
    return [i for batch in batches for i in batch]


def _droppable(batches):
    """How many samples a pass may have left out of a last, incomplete batch: none if its
    last batch is smaller than the others (nothing was dropped); otherwise up to one batch
    less one (DataLoader(drop_last=True))."""
    if not batches:
        return 0
    size = max(len(batch) for batch in batches)
    return size - 1 if all(len(batch) == size for batch in batches) else 0


def check_shards_disjoint_and_cover(run):
    """In every epoch the ranks train on disjoint shards that together cover the data.

    DistributedSampler may repeat up to world_size - 1 samples to make the shards equal,
    or leave out as many (drop_last=True); a DataLoader with drop_last=True leaves out each
    rank's last incomplete batch. That much overlap, or shortfall, is allowed.
    """
    _require(run)
    passes = _train_passes(run)
    n_train = run.ranks[0]["n_train"]
    sampler_slack = run.nproc - 1
    for epoch in range(run.config.epochs):
        drawn = [_samples(passes[rank][epoch]) for rank in range(run.nproc)]
        total = sum(len(d) for d in drawn)
        covered = set().union(*map(set, drawn))
        repeats = total - len(covered)
        if repeats > sampler_slack:
            sizes = " and ".join(str(len(d)) for d in drawn)
            raise RequirementNotMet(
                f"in epoch {epoch + 1} the ranks drew {sizes} training samples, "
                f"{repeats} of them drawn more than once: the ranks train on overlapping "
                f"data. Give each rank its own shard (DistributedSampler).")
        allowed = sampler_slack + sum(_droppable(passes[rank][epoch])
                                      for rank in range(run.nproc))
        if len(covered) < n_train - allowed:
            raise RequirementNotMet(
                f"in epoch {epoch + 1} {n_train - len(covered)} of the {n_train:,} training "
                f"samples went to no rank (at most {allowed} may be left out by drop_last): "
                f"together the shards must cover the training set.")
    _passed(f"in each of the {run.config.epochs} epochs the {run.nproc} ranks trained on "
            f"disjoint shards that cover the {n_train:,} training samples.")


def check_shards_reshuffled_each_epoch(run):
    """Each rank's samples come in a different order (or from a different shard) in
    every epoch."""
    _require(run)
    passes = _train_passes(run)
    if run.config.epochs < 2:
        raise RequirementNotMet("this check needs a run of two epochs or more.")
    for rank, rank_passes in enumerate(passes):
        for epoch in range(1, len(rank_passes)):
            if _samples(rank_passes[epoch]) == _samples(rank_passes[epoch - 1]):
                raise RequirementNotMet(
                    f"rank {rank} drew the same samples in the same order in epochs "
                    f"{epoch} and {epoch + 1}. DistributedSampler shuffles by epoch "
                    f"number: call set_epoch(epoch) on it before each epoch.")
    _passed(f"every rank drew its samples in a new order in each of the "
            f"{run.config.epochs} epochs.")


# --------------------------------------------------------------------------------------
# The learning rate: scaled from one process's batch to the global batch.
# --------------------------------------------------------------------------------------

def scaled_learning_rates(lr, world_size):
    """``{rule: learning rate}``: ``lr``, tuned for one process's batch, scaled to a global
    batch world_size times as large (notebook 03)."""
    return {"linear": lr * world_size, "square-root": lr * math.sqrt(world_size)}


def check_learning_rate_follows_global_batch(run):
    """The learning rate the optimizer uses (its peak over the run, so warmup is allowed)
    is --lr scaled from one process's batch to the global batch, by the linear or the
    square-root rule."""
    _require(run)
    base, world = run.config.lr, run.nproc
    allowed = scaled_learning_rates(base, world)
    for rank, record in enumerate(run.ranks):
        if not record["lrs"]:
            raise RequirementNotMet(f"rank {rank} made no optimizer step.")
        peak = max(record["lrs"])
        if not any(math.isclose(peak, lr, rel_tol=LR_RTOL) for lr in allowed.values()):
            rules = " or ".join(f"{lr:.4g} ({rule})" for rule, lr in allowed.items())
            raise RequirementNotMet(
                f"rank {rank}'s optimizer trained with a learning rate of at most "
                f"{peak:.4g}; the global batch is {world} x --batch-size, so scale --lr "
                f"{base:g} by the world size: {rules}.")
    rule = next(rule for rule, lr in allowed.items()
                if math.isclose(max(run.ranks[0]["lrs"]), lr, rel_tol=LR_RTOL))
    _passed(f"the learning rate peaks at {max(run.ranks[0]['lrs']):.4g}: --lr {base:g} "
            f"scaled to a global batch {world} times as large ({rule} rule).")
