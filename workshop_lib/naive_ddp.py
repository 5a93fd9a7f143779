"""Data parallelism from scratch: what DistributedDataParallel does, without the speed.

Notebook 02 ("How DDP works inside") reads this file. Two collectives are all it takes:

1. When wrapping, broadcast rank 0's parameters and buffers, so every replica starts
   from the same weights (each process initialised its own copy at random).
2. After ``backward()``, all-reduce every gradient and divide by the world size: every
   replica now holds the mean gradient over the global batch and takes the same step.

DDP computes the same thing, but faster: it groups gradients into buckets and starts
all-reducing a bucket as soon as backward has produced it, overlapping communication
with the rest of the backward pass.

    torchrun --standalone --nproc-per-node=2 -m workshop_lib.naive_ddp --steps 20
"""
import argparse
import importlib.util
import itertools
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler

from workshop_lib import cli, data, distributed, models
from workshop_lib.errors import CourseError, exit_cleanly_on_course_error, record_errors


class NaiveDataParallel(nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module
        for tensor in itertools.chain(module.parameters(), module.buffers()):
            dist.broadcast(tensor.data, src=0)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def sync_gradients(self):
        """Call between ``loss.backward()`` and ``optimizer.step()``."""
        world_size = dist.get_world_size()
        for param in self.module.parameters():
            if param.grad is not None:
                dist.all_reduce(param.grad)  # sum over ranks ...
                param.grad /= world_size     # ... then mean: the global-batch gradient


def compare_with_ddp(rank, world_size, steps=20, batch_size=32, wrapper=NaiveDataParallel):
    """Train one model with ``wrapper`` (this file's NaiveDataParallel, or a learner's)
    and one with DDP on the same shards.

    Each rank starts from a *different* random initialisation (seed + rank) so that the
    broadcast is tested too. Returns the largest parameter difference between the two.
    """
    train_set, _, info = data.load("digits")
    sampler = DistributedSampler(train_set, world_size, rank, shuffle=True, seed=0)
    loader = data.TensorLoader(train_set, batch_size, sampler, "cpu")

    def make(wrapper):
        torch.manual_seed(1000 + rank)
        model = wrapper(models.SmallCNN(info.in_channels, info.num_classes, width=8,
                                        batch_norm=False))
        return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    naive, naive_opt = make(wrapper)
    ddp, ddp_opt = make(DDP)
    for _, (x, y) in zip(range(steps), itertools.cycle(loader), strict=False):
        for model, optimizer in ((naive, naive_opt), (ddp, ddp_opt)):
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()  # DDP all-reduces inside backward()
            if model is naive:
                model.sync_gradients()               # the naive wrapper does it afterwards
            optimizer.step()
    return max((a - b).abs().max().item()
               for a, b in zip(naive.module.parameters(), ddp.module.parameters(), strict=True))


def load_wrapper(path):
    """The class ``NaiveDataParallel`` defined in the file ``path`` (a learner's version)."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "NaiveDataParallel"):
        raise CourseError(f"{path} defines no class NaiveDataParallel")
    return module.NaiveDataParallel


@record_errors  # a rank's error reaches torchrun's summary (and the lab's check)
@exit_cleanly_on_course_error
def main(argv=None):
    parser = cli.ArgumentParser(prog="torchrun ... -m workshop_lib.naive_ddp",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--wrapper", type=Path, default=None,
                        help="a file defining NaiveDataParallel to check instead of this one")
    parser.add_argument("--out", help="also write the result as JSON to this file")
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        raise CourseError("naive_ddp runs under torchrun: torchrun --standalone "
                          "--nproc-per-node=2 -m workshop_lib.naive_ddp")
    if args.wrapper is not None and not args.wrapper.is_file():
        raise CourseError(f"--wrapper {args.wrapper}: no such file")
    wrapper = load_wrapper(args.wrapper) if args.wrapper else NaiveDataParallel
    # gloo on CPU tensors whatever the machine: the comparison is about arithmetic.
    with distributed.process_group("gloo"):
        rank, world_size = dist.get_rank(), dist.get_world_size()
        difference = compare_with_ddp(rank, world_size, args.steps, wrapper=wrapper)
        print(f"[rank {rank}/{world_size}] after {args.steps} steps, largest |naive - DDP| "
              f"parameter difference: {difference:.2e}", flush=True)
        if rank == 0 and args.out:
            with open(args.out, "w") as f:
                json.dump({"steps": args.steps, "world_size": world_size,
                           "max_abs_difference": difference}, f)


if __name__ == "__main__":
    main()
