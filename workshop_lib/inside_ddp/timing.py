"""Step time of naive, overlapped, bucketed and PyTorch's DDP, and the bucket-size sweep.

Notebook 07, "Inside DDP", section 5 ("What overlap and buckets buy") shows these numbers;
the bench (``python -m workshop_lib.bench``) can call ``measure`` in its own ranks. Every
variant trains one model (the course's CNN by default; notebook 07 asks for its profile's
model and batch, a Wide ResNet on GPUs, where a step has communication worth hiding) with
the same batches and optimizer; what differs is only how gradients are averaged:

- ``local``: no averaging at all (each rank alone: the floor);
- ``naive``: notebook 02's wrapper, all-reduces one by one after backward;
- ``overlap``: ``overlap.py``, one asynchronous all-reduce per parameter, from hooks;
- ``buckets``: ``buckets.py`` at DDP's default 25 MB (one bucket for a small model);
- ``buckets_<bytes>``: the bucket-size sweep, by default the four powers of four below the
  model's gradient bytes (``sweep_for``): 4 KiB to 256 KiB for the CNN's 368 KiB;
- ``ddp``: the course's DDP wrap (``train_ddp.wrap``).

Timing follows the bench's rules: a warm-up window first; then rounds, each timing every
variant for one window in an order rotated by one each round (so a change of the machine's
load hits all alike); all ranks start a window together, GPU work is synchronized before
the clock is read, and a window takes the slowest rank's time. Each figure is the median
milliseconds per step over the rounds, with min, max and n. Beside them, ``messages``: the
bytes of each all-reduce a from-scratch wrapper starts in a step, which the all-reduce's
fitted latency and bandwidth price (``allreduce.predicted_s``).

    torchrun --standalone --nproc-per-node=2 -m workshop_lib.inside_ddp.timing
"""
import itertools
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data.distributed import DistributedSampler

from workshop_lib import allreduce_model as allreduce
from workshop_lib import cli, data, distributed, models, naive_ddp, train_ddp
from workshop_lib.errors import CourseError, exit_cleanly_on_course_error
from workshop_lib.inside_ddp.buckets import BucketedDataParallel
from workshop_lib.inside_ddp.overlap import OverlappedDataParallel
from workshop_lib.stopwatch import Stopwatch, summary

SWEEP_BYTES = (2**12, 2**14, 2**16, 2**18, 2**20)  # 4 KB ... 1 MB


def sweep_for(gradient_bytes, sizes=4):
    """The bucket sizes of a sweep for a model of ``gradient_bytes``: the ``sizes`` powers of
    four below it, smallest first. Below the smallest, every parameter is its own bucket;
    from the gradients' size up, one bucket holds them all (as DDP's 25 MB does for a small
    model, which the "buckets" variant times already)."""
    exponent = (max(gradient_bytes - 1, 1).bit_length() - 1) // 2  # 4**exponent < gradient_bytes
    return tuple(4 ** e for e in range(max(0, exponent - sizes + 1), exponent + 1))


def wrappers(device, sweep_bytes=SWEEP_BYTES):
    """Name -> how that variant wraps a model."""
    variants = {"local": lambda m: m, "naive": naive_ddp.NaiveDataParallel,
                "overlap": OverlappedDataParallel, "buckets": BucketedDataParallel,
                "ddp": lambda m: train_ddp.wrap(m, device)}
    for nbytes in sweep_bytes:
        variants[f"buckets_{nbytes}"] = lambda m, n=nbytes: BucketedDataParallel(m, n)
    return variants


def messages(model):
    """Bytes of each all-reduce a from-scratch wrapper starts per step, in order (None for
    no wrapper, or PyTorch's DDP, whose buckets are its own business)."""
    if isinstance(model, OverlappedDataParallel):  # and BucketedDataParallel
        groups = [sum(model.params[i].numel() * model.params[i].element_size() for i in group)
                  for group in model.groups]
        return groups + [4 * len(model.params)]  # + which parameters each rank used
    if isinstance(model, naive_ddp.NaiveDataParallel):
        return [p.numel() * p.element_size() for p in model.module.parameters()
                if p.requires_grad]
    return None


def train_step(model, optimizer, x, y):
    """``train.train_step``, with the from-scratch wrappers' ``sync_gradients()``."""
    optimizer.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    if hasattr(model, "sync_gradients"):
        model.sync_gradients()
    optimizer.step()


def timed_window(model, optimizer, batches, steps, device):
    """Seconds per step over ``steps`` steps, the slowest rank's."""
    flag = torch.zeros(1, device=device)
    dist.all_reduce(flag)  # every rank starts the window together
    with Stopwatch(device) as watch:
        for _ in range(steps):
            train_step(model, optimizer, *next(batches))
    seconds = torch.tensor([watch.seconds], dtype=torch.float64, device=device)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    return seconds.item() / steps


def measure(rank, world_size, rounds=9, steps=20, batch_size=32, dataset="digits",
            sweep_bytes=None, device="cpu", model_name="cnn"):
    """Every variant's step time on the default group's ranks, training ``model_name`` at
    ``batch_size`` per rank, with the buckets of ``sweep_bytes`` (None: ``sweep_for`` the
    model). A collective: all ranks call it; every rank returns the same dict."""
    device = torch.device(device)
    train_set, _, info = data.load(dataset)
    sampler = DistributedSampler(train_set, world_size, rank, seed=0)
    loader = data.TensorLoader(train_set, batch_size, sampler, device, drop_last=True)
    batches = itertools.cycle(list(loader))
    if sweep_bytes is None:
        sweep_bytes = sweep_for(sum(p.numel() * 4 for p in models.build(model_name, info)
                                    .parameters()))
    runs = {}
    for name, wrap in wrappers(device, sweep_bytes).items():
        torch.manual_seed(0)
        model = wrap(models.build(model_name, info).to(device))
        runs[name] = (model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
        timed_window(*runs[name], batches, steps, device)  # warm-up
    ms = {name: [] for name in runs}
    names = list(runs)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            ms[name].append(1000 * timed_window(*runs[name], batches, steps, device))
    gradient_bytes = sum(p.numel() * p.element_size() for p in runs["local"][0].parameters())
    return {"world_size": world_size, "model": model_name, "batch_size": batch_size,
            "dataset": info.name,
            "gradient_bytes": gradient_bytes, "rounds": rounds, "steps_per_window": steps,
            "messages": {name: messages(model) for name, (model, _) in runs.items()
                         if messages(model) is not None},
            "step_ms": {name: summary(v) for name, v in ms.items()}}


def bucket_sweep_rows(results):
    """The bucket-size sweep beside the all-reduce model: one row per bucket size, with the
    all-reduces a step and the communication the fitted latency and bandwidth predict."""
    timing, fit = results["timing"], results["allreduce_fit"]
    names = sorted((n for n in timing["step_ms"] if n.startswith("buckets_")),
                   key=lambda n: int(n.removeprefix("buckets_"))) + ["buckets"]
    return [{"name": name, "bucket_bytes": int(name.removeprefix("buckets_")) if "_" in name
             else 25 * 2**20, "all_reduces": len(timing["messages"][name]),
             "step_ms": timing["step_ms"][name]["median"],
             "predicted_ms": 1000 * allreduce.predicted_s(fit, timing["world_size"],
                                                          timing["messages"][name])}
            for name in names]



@exit_cleanly_on_course_error
def main(argv=None):
    parser = cli.ArgumentParser(prog="torchrun ... -m workshop_lib.inside_ddp.timing",
                                description="Step time of naive, overlapped, bucketed and "
                                            "PyTorch's DDP, and the bucket-size sweep, as JSON "
                                            "on rank 0's standard output.")
    parser.add_argument("--rounds", type=int, default=9, help="rounds (the median's n)")
    parser.add_argument("--steps", type=int, default=20, help="steps per window")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.steps < 1:
        parser.error("--rounds and --steps need 1 or more")
    if "RANK" not in os.environ:
        raise CourseError("timing runs under torchrun: torchrun --standalone "
                          "--nproc-per-node=2 -m workshop_lib.inside_ddp.timing")
    torch.set_num_threads(1)  # one thread per rank: ranks never fight over a core
    with distributed.process_group("gloo"):
        rank = dist.get_rank()
        result = measure(rank, dist.get_world_size(), rounds=args.rounds, steps=args.steps,
                         sweep_bytes=SWEEP_BYTES)
    if rank == 0:
        json.dump(result, sys.stdout, indent=1)
        print()


if __name__ == "__main__":
    main()
