"""The check that the ranks train as one (requirement 4): the ranks form one process group,
each trains on samples of its own, every optimizer step takes --accumulate batches on each
rank, and after every step every rank's parameters equal a single-process replay of that
step on the global batch.

The replay itself runs in rank 0 of the job, where torch is (``ddp_recorder_replay.py``):
it leaves in rank 0's record, for the first segment of steps that does not match (or for
all of them), how far each rank's parameters are from three replays: with the ranks'
gradients averaged (a correct job), summed, and each rank alone on its own batches. This
file turns those distances into the verdict, naming the mistake that matches.

Your copy of this file is replaced by the instructor's when your work is graded.

Standard library only: the notebook's kernel imports this file.
"""
import base64
from array import array

from ddp_checks_rules import RequirementNotMet
from ddp_checks_run import _passed, _require_model

PARAM_RTOL = 1e-6  # ranks that average their gradients hold bit-identical parameters
START_RTOL = 1e-6  # ranks that start from rank 0's parameters hold exactly those
# Every optimizer step is replayed, in segments of a few steps
# (ddp_recorder_steps.SEGMENT_STEPS), each from the parameters the ranks held at its start.
# A replay on the CPU in float32 matches a correct job within ~1e-5 of a step's update; a
# job that sums its gradients, or whose ranks step alone for even one step, is off by ~0.3
# or more. ddp_recorder_replay.REPLAY_MATCH is the same bar.
REPLAY_RTOL = 0.02


def _params(record):
    return array("f", base64.b64decode(record["model"]["params_b64"]))


def _replayed(replay):
    """Which steps a replay result covers, in words."""
    if "segment" in replay:
        first, last = replay["segment"]
        return f"in optimizer steps {first}-{last} (of {replay['steps']})"
    return f"over all {replay['steps']} optimizer steps"


def _replay_verdict(run, replay):
    """The mistake the replay shows, as a reason; None when every step is right."""
    ranks = replay["ranks"]
    moved = [r for r, result in enumerate(ranks) if result["start"] > START_RTOL]
    if moved:
        return (f"the ranks started training from different parameters (rank {moved[0]}'s "
                f"differ from rank 0's by {ranks[moved[0]]['start']:.2g} of their size): "
                f"start every rank from rank 0's parameters (DistributedDataParallel "
                f"broadcasts them when it wraps the model).")
    if all(result["averaged"] <= REPLAY_RTOL for result in ranks):
        return None
    replayed = _replayed(replay)
    if all(result["summed"] is not None and result["summed"] <= REPLAY_RTOL
           for result in ranks):
        return (f"{replayed} the ranks' parameters equal a replay in which the ranks' "
                f"gradients are summed, not averaged: divide the all-reduced gradients by "
                f"the world size (DistributedDataParallel averages them)"
                + (f", and each batch's loss by the number of batches its step accumulates "
                   f"(--accumulate {run.config.accumulate}), as the single-device script "
                   f"does." if (run.config.accumulate or 1) > 1 else "."))
    if all(result["local"] is not None and result["local"] <= REPLAY_RTOL
           for result in ranks):
        return (f"{replayed} each rank's parameters equal a replay of its own batches alone: "
                f"each rank stepped on its own gradients. Average the gradients over the "
                f"ranks at every step (DistributedDataParallel does it in backward()); "
                f"averaging the parameters now and then, or averaging only some steps, is "
                f"not the same.")
    worst = max(range(len(ranks)), key=lambda r: ranks[r]["averaged"])
    return (f"{replayed} rank {worst}'s parameters differ from a single-process replay of "
            f"the same global batches by {ranks[worst]['averaged']:.2g} of a step's update "
            f"(at most {REPLAY_RTOL} allowed): average the gradients over the ranks at "
            f"every step. The replay trains each step on the batches all ranks took from "
            f"their DataLoader since their previous step, with F.cross_entropy (each "
            f"batch's mean, averaged over the step's batches and ranks) and your "
            f"optimizer; keep the model deterministic (no dropout).")


def _steps_of(batches, accumulate):
    """The batches of each optimizer step of one pass of ``batches`` batches, as the
    single-device script takes them: ``accumulate`` each, the last step those left."""
    return [accumulate] * (batches // accumulate) + [batches % accumulate] * bool(
        batches % accumulate)


def _accumulation_reason(run, replay):
    """Why the job's optimizer steps did not each take --accumulate batches per rank (an
    epoch's last step: those left); None when they did, or when the run asks for none."""
    accumulate = run.config.accumulate
    if accumulate is None:
        return None
    for rank, (record, taken) in enumerate(zip(run.ranks, replay.get("micro_batches", []),
                                               strict=False)):
        passes = [len(p["batches"]) for p in record["passes"] if p["split"] == "train"]
        expected = [n for batches in passes for n in _steps_of(batches, accumulate)]
        if taken == expected:
            continue
        step = next((i for i, (a, b) in enumerate(zip(taken, expected, strict=False))
                     if a != b),
                    min(len(taken), len(expected)))
        took = ", ".join(str(n) for n in sorted(set(taken)))
        return (f"rank {rank}'s optimizer steps took {took} batch(es) of train_set each "
                f"(step {step + 1} took {taken[step] if step < len(taken) else 'none'}, "
                f"expected {expected[step] if step < len(expected) else 'none'}): the "
                f"graded run passes --accumulate {accumulate}, so each optimizer step must "
                f"accumulate the gradients of {accumulate} batches on every rank (an "
                f"epoch's last step those left), as the single-device script does.")
    return None


def check_gradients_averaged_over_ranks(run):
    """The ranks train as one: they form one process group, each trains on samples of its
    own, and every rank's parameters after every optimizer step of the job equal a
    single-process replay of the job's steps on the global batch (all ranks' batches of
    each step: the batches each was handed since its previous step), replayed in short
    segments from the parameters at each segment's start; all ranks hold identical
    parameters at the end."""
    _require_model(run)
    for rank, record in enumerate(run.ranks):
        group = record.get("process_group_size")
        if group is not None and group != run.nproc:
            alone = group == 1
            raise RequirementNotMet(
                f"rank {rank} took its first optimizer step in a process group of "
                f"{group} process{'es' * (group > 1)}, not of the job's {run.nproc}"
                + (" (dist.init_process_group was never called): each process trained "
                   "alone, and nothing was averaged. Join the processes with "
                   "dist.init_process_group and wrap the model in DistributedDataParallel."
                   if alone else "."))
    replay = run.ranks[0].get("replay") or {"problem": "rank 0 recorded no replay."}
    if "problem" in replay:
        raise RequirementNotMet(f"the training steps could not be checked: "
                                f"{replay['problem']}")
    shared = replay.get("shared", 0)
    if shared > run.nproc - 1:  # more than DistributedSampler's padding can repeat
        raise RequirementNotMet(
            f"in the first {replay.get('shared_steps', replay['steps'])} optimizer steps "
            f"{shared} of the {max(replay['samples']):,} samples a rank trained on were "
            f"also another rank's: the ranks trained on the same samples, so their steps "
            f"prove nothing about averaging (copies of one training end identical too), and "
            f"the job does the same work several times. Give each rank its own shard "
            f"(DistributedSampler).")
    reason = _accumulation_reason(run, replay) or _replay_verdict(run, replay)
    if reason:
        raise RequirementNotMet(reason)
    reference = _params(run.ranks[0])
    for rank, record in enumerate(run.ranks[1:], start=1):
        params = _params(record)
        if len(params) != len(reference):
            raise RequirementNotMet(f"rank {rank}'s model has a different size from "
                                    f"rank 0's.")
        worst = max(abs(a - b) / (1 + abs(b)) for a, b in zip(params, reference, strict=True))
        if worst > PARAM_RTOL:
            raise RequirementNotMet(
                f"every optimizer step matches a single-process replay, but after training "
                f"rank {rank}'s parameters differ from rank 0's (by up to {worst:.3g}): "
                f"average the gradients over the ranks at every step.")
        gap = replay.get("optimizer_end_gap", [0.0] * run.nproc)[rank]
        if gap > PARAM_RTOL:
            raise RequirementNotMet(
                f"after training rank {rank}'s optimizer state (its momentum) differs from "
                f"rank 0's (by up to {gap:.3g}): the ranks did not average their gradients "
                f"at every step (averaging the parameters afterwards is not the same). "
                f"Average the gradients over the ranks at every step.")
    error = max(result["averaged"] for result in replay["ranks"])
    _passed(f"{_replayed(replay)} every rank's parameters equal a single-process replay on "
            f"the global batch (within {error:.1g} of a step's update), and the "
            f"{run.nproc} ranks hold identical parameters after training.")
