"""Uneven inputs: ranks that hold different numbers of batches (notebook 06).

    torchrun --standalone --nproc-per-node=2 -m workshop_lib.uneven_inputs \\
        --data-dir runs/five_shards --mode uneven --mode join

PyTorch calls this problem "uneven inputs" (``torch.distributed.algorithms.join``): with
record shards of different sizes, the rank that holds more batches waits in a gradient
all-reduce for ranks that have finished their epoch, until the collective timeout. Two
cures: every rank takes as many steps as the rank with the fewest samples can fill (the
course's ``shards.ShardSchedule``, ``equal``), or DDP's ``Join`` context manager, under
which a rank that ran out shadows the others' all-reduces with zeros (``join``).

A demo, not a training part: it imports the training scripts; nothing of the training
parts imports it.
"""
import contextlib
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join

from workshop_lib import cli, data, distributed, hardware, models, shards, train, train_ddp
from workshop_lib.errors import CourseError, exit_cleanly_on_course_error

MODES = ("equal", "uneven", "join")


def uneven_epoch(folder, mode, batch_size, device, info):
    """One epoch of DDP on the shards in ``folder``: ``equal`` steps (the course's
    loader), ``uneven`` steps (each rank all its shards hold: the hang) or uneven steps
    under DDP's ``Join`` (the other cure). Returns this rank's step count."""
    train_split, _ = shards.open_splits(folder)
    schedule = shards.ShardSchedule(train_split, dist.get_rank(), dist.get_world_size(),
                                    seed=0, equal_steps=mode == "equal")
    loader = shards.ShardLoader(schedule, batch_size, device)
    torch.manual_seed(0)
    model = train_ddp.wrap(models.build("cnn", info).to(device), device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    steps = 0
    # Join: a rank that runs out of batches shadows the others' all-reduces with zeros
    # until every rank is done, so no collective waits for a partner that left.
    with Join([model]) if mode == "join" else contextlib.nullcontext():
        for x, y in loader:
            train.train_step(model, optimizer, x, y)
            steps += 1
    dist.barrier()  # the job's next collective (evaluation's all-reduce, the next epoch...)
    return steps


def parse_args(argv=None):
    parser = cli.ArgumentParser(prog="torchrun ... -m workshop_lib.uneven_inputs",
                                description=__doc__)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--mode", choices=MODES, action="append",
                        help="equal (default), uneven or join; given twice or more, the "
                             "modes run in turn in the same job")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--dist-timeout", type=float, default=60)
    return parser.parse_args(argv)


@exit_cleanly_on_course_error
def main(argv=None):
    args = parse_args(argv)
    if "RANK" not in os.environ:
        raise CourseError("this demo runs under torchrun: torchrun --standalone "
                          "--nproc-per-node=2 -m workshop_lib.uneven_inputs --data-dir DIR")
    _, _, info = data.load(data_dir=args.data_dir, data_format="shards")
    device = torch.device("cpu")
    hardware.configure_cpu_threads(device)
    with distributed.process_group("gloo", args.dist_timeout):
        for mode in args.mode or ["equal"]:
            steps = uneven_epoch(args.data_dir, mode, args.batch_size, device, info)
            print(f"{mode}: {steps} steps on rank {dist.get_rank()}, done", flush=True)


if __name__ == "__main__":
    main()
