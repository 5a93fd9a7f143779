"""The job behind notebook 07's exercises: a learner's file, run on N ranks, judged by
what it did (``labs.inside_ddp`` reads the result and gives the verdict).

For each model of ``replay`` (the plain CNN, and the net with frozen, tied and sometimes
unused parameters) the learner's class trains ``replay.STEPS`` steps on every rank, each
rank from different random weights, and every rank compares its parameters with one
process replaying the global batches. Besides the largest difference, the job records:

- ``overlap``, ``buckets``: the sizes (elements) of the all-reduces that had started when
  the plain CNN's first ``backward()`` returned, beside what the reference starts (every
  gradient, or every bucket of ``BUCKET_BYTES``, in reverse parameter order). It counts
  calls of ``dist.all_reduce``, the name the exercise files use.
- ``zero1`` (the learner's ``ShardedOptimizer`` behind PyTorch's DDP, with SGD and Adam):
  each rank's optimizer-state bytes for the course's CNN with Adam, beside a replicated
  Adam's.

    torchrun --standalone --nproc-per-node=2 -m workshop_lib.inside_ddp.verify \\
        --stage buckets --file my_buckets.py --out result.json
"""
import argparse
import contextlib
import functools
import importlib.util
import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from workshop_lib import cli, data, distributed, models
from workshop_lib.errors import CourseError, exit_cleanly_on_course_error, record_errors
from workshop_lib.inside_ddp import buckets, replay, zero1

CLASSES = {"overlap": "OverlappedDataParallel", "buckets": "BucketedDataParallel",
           "zero1": "ShardedOptimizer"}
BUCKET_BYTES = 4096  # several buckets even for the check's small CNN


def load_class(path, name):
    """The class ``name`` defined in the file ``path`` (a learner's version)."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, name):
        raise CourseError(f"{path} defines no class {name}")
    return getattr(module, name)


@contextlib.contextmanager
def recorded_all_reduces(size=torch.Tensor.numel):
    """Yield a list that receives ``size(tensor)`` (the element count, unless another
    ``size`` is given) of every ``dist.all_reduce`` call."""
    calls, original = [], dist.all_reduce

    def all_reduce(tensor, *args, **kwargs):
        calls.append(size(tensor))
        return original(tensor, *args, **kwargs)

    dist.all_reduce = all_reduce
    try:
        yield calls
    finally:
        dist.all_reduce = original


def largest_over_ranks(value):
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def train_recorded(rank, world_size, kind, wrap, make_optimizer):
    """``replay.train``; also the sizes of the all-reduces started in the first backward."""
    marks = []
    with recorded_all_reduces() as calls:
        params = replay.train(rank, world_size, kind, wrap, make_optimizer,
                              after_backward=lambda: marks.append(len(calls)))
    return params, calls[:marks[0]]


def check_wrapper(rank, world_size, stage, wrapper_class):
    wrap = wrapper_class if stage == "overlap" else functools.partial(
        wrapper_class, bucket_bytes=BUCKET_BYTES)
    sgd_class, settings = replay.OPTIMIZERS["sgd"]
    make_optimizer = functools.partial(sgd_class, **settings)
    result = {"differences": {}}
    for kind in replay.MODELS:
        params, started = train_recorded(rank, world_size, kind, wrap, make_optimizer)
        if kind == "cnn":
            result["started_in_backward"] = started
        result["differences"][f"{kind}/sgd"] = largest_over_ranks(
            replay.max_difference(params, replay.replay(kind, "sgd", world_size)))
    trainable = [p for p in reversed(list(replay.build("cnn", 0).parameters()))
                 if p.requires_grad]
    groups = ([[i] for i in range(len(trainable))] if stage == "overlap"
              else buckets.plan_buckets(trainable, BUCKET_BYTES))
    result["expected_in_backward"] = [sum(trainable[i].numel() for i in g) for g in groups]
    if stage == "buckets":
        result["bucket_bytes"] = BUCKET_BYTES
    return result


def check_optimizer(rank, world_size, sharded_class):
    result = {"differences": {}}
    for kind in replay.MODELS:
        for name, (optimizer_class, settings) in replay.OPTIMIZERS.items():
            wrap = functools.partial(DDP, find_unused_parameters=kind == "edge")
            make_optimizer = functools.partial(sharded_class, optimizer_class=optimizer_class,
                                               **settings)
            params = replay.train(rank, world_size, kind, wrap, make_optimizer)
            result["differences"][f"{kind}/{name}"] = largest_over_ranks(
                replay.max_difference(params, replay.replay(kind, name, world_size)))
    torch.manual_seed(0)
    model = models.build("cnn", data.DATASETS["digits"])
    adam_class, settings = replay.OPTIMIZERS["adam"]
    result["memory"] = zero1.compare_state_memory(model, adam_class, sharded_class,
                                                  **settings)
    return result


@record_errors  # a rank's error reaches torchrun's summary (and the lab's check)
@exit_cleanly_on_course_error
def main(argv=None):
    parser = cli.ArgumentParser(prog="torchrun ... -m workshop_lib.inside_ddp.verify",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stage", choices=list(CLASSES), required=True)
    parser.add_argument("--file", type=Path, required=True,
                        help="the learner's file defining the stage's class")
    parser.add_argument("--out", type=Path, help="write the result as JSON to this file")
    args = parser.parse_args(argv)
    learner_class = load_class(args.file, CLASSES[args.stage])
    # A short timeout: a rank left waiting in a collective the other never started fails
    # the check in seconds rather than half an hour.
    with distributed.process_group("gloo", timeout_s=30):
        rank, world_size = dist.get_rank(), dist.get_world_size()
        if args.stage == "zero1":
            result = check_optimizer(rank, world_size, learner_class)
        else:
            result = check_wrapper(rank, world_size, args.stage, learner_class)
    if rank == 0 and args.out:
        args.out.write_text(json.dumps({"stage": args.stage, "world_size": world_size,
                                        "steps": replay.STEPS, **result}))


if __name__ == "__main__":
    main()
