"""The measurements every rank takes part in: the all-reduce sweep and the scaling windows
(with DDP against no_sync and against DDP's defaults at N processes).

Every rank runs ``collective`` inside the process group. A world smaller than N runs on
the first ranks, in a subgroup, while the other ranks wait for it in a collective; the
wait is one window long (``plan.window_s``), never a whole section.
"""
import contextlib
import math
import sys
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import RandomSampler, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from workshop_lib import data, hardware, train_ddp
from workshop_lib.bench.plan import BUFFER_SYNC, NO_SYNC, Plan, scaling_windows
from workshop_lib.errors import CourseError
from workshop_lib.train import train_step  # the step learners run, timed as it is


@dataclass
class World:
    """This rank's part in the measurements: its rank, the plan, its device, its data and
    the subgroups of the smaller worlds."""

    rank: int
    plan: Plan
    device: torch.device
    train_set: TensorDataset
    info: data.DatasetInfo
    groups: dict = field(default_factory=dict)

    def group(self, world_size):
        """The process group of the first ``world_size`` ranks (None: the whole world)."""
        return self.groups.get(world_size)

    def log(self, message):
        if self.rank == 0:
            print(f"[bench] {message}", file=sys.stderr, flush=True)

    def rendezvous(self, world_size=None):
        """Wait until the first ``world_size`` ranks (default all) get here."""
        world_size = world_size or self.plan.world_size
        if world_size > 1:
            flag = torch.zeros(1, device=self.device)
            dist.all_reduce(flag, group=self.group(world_size))
        hardware.synchronize(self.device)

    def slowest(self, seconds, world_size):
        """The longest of the ranks' times: a group moves at its slowest member's pace."""
        if world_size == 1:
            return seconds
        t = torch.tensor([seconds], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group(world_size))
        return t.item()


def collective(rank, plan, device, train_set, info):
    """The all-reduce sweep and the scaling windows; every rank calls this in the group."""
    # Every rank creates every subgroup, in the same order (a collective call).
    groups = {w: dist.new_group(list(range(w))) for w in plan.world_sizes
              if 1 < w < plan.world_size}
    world = World(rank, plan, device, train_set, info, groups)
    world.log(f"{plan.world_size} processes joined; measuring")
    started = time.perf_counter()
    results = {"allreduce": allreduce_sweep(world), **scaling(world)}
    world.log(f"scaling done ({time.perf_counter() - started:.0f} s)")
    return results


# -- All-reduce bus bandwidth ------------------------------------------------------------


def timed_allreduce(world, buffer, world_size):
    world.rendezvous(world_size)
    start = time.perf_counter()
    dist.all_reduce(buffer, group=world.group(world_size))
    hardware.synchronize(world.device)
    return world.slowest(time.perf_counter() - start, world_size)


def allreduce_sweep(world):
    """Seconds per all-reduce of each size in the plan, over each world of 2 ranks or more."""
    plan, sweeps = world.plan, {}
    for w in plan.world_sizes[1:]:
        if world.rank < w:
            rows = []
            for nbytes in plan.allreduce_sizes:
                # Zeros: a sum of zeros never overflows into inf over the repetitions.
                buffer = torch.zeros(nbytes // 4, device=world.device)
                timed_allreduce(world, buffer, w)  # warm-up: connections, buffers
                probe = timed_allreduce(world, buffer, w)  # the same on every rank
                reps = min(200, max(plan.allreduce_min_reps,
                                    int(plan.allreduce_budget_s / probe)))
                rows.append({"bytes": nbytes, "seconds": [
                    timed_allreduce(world, buffer, w) for _ in range(reps)]})
                del buffer
            sweeps[str(w)] = rows
        world.rendezvous()
        world.log(f"all-reduce sweep over {w} ranks done")
    return sweeps


# -- Scaling, and DDP against no_sync and against DDP's defaults -------------------------


@dataclass
class Run:
    """A model, its optimizer and its batches, stepped by the first ``world_size`` ranks."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    batches: object
    world_size: int
    steps: int = 0  # per window, set by calibrate()


def wrap(model, device, group, buffer_sync=False):
    """The course's DDP wrap, ``train_ddp.wrap``; with ``buffer_sync``, DDP with its
    defaults, which re-send BatchNorm's buffers from rank 0 before every forward."""
    if buffer_sync:
        return DDP(model, device_ids=[device] if device.type == "cuda" else None,
                   process_group=group, forward_sync_buffers=True)
    return train_ddp.wrap(model, device, process_group=group)


def model_for(world, config, world_size, buffer_sync=False):
    """``config``'s model on this rank's device, DDP-wrapped where ranks share it."""
    model = config.build(world.info).to(world.device)
    if world_size == 1:
        return model
    return wrap(model, world.device, world.group(world_size), buffer_sync)


def endless(loader, sampler):
    """Batches from ``loader``, epoch after epoch (reshuffled as the scripts do)."""
    epoch = 0
    while True:
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def build_run(world, window):
    w, batch_size, train_set = window.world_size, window.batch_size, world.train_set
    model = model_for(world, window.config, w, buffer_sync=window.variant == BUFFER_SYNC)
    if w > 1:
        sampler = DistributedSampler(train_set, w, world.rank, seed=0)
    else:
        sampler = RandomSampler(train_set, generator=torch.Generator().manual_seed(0))
    # Full batches only, so that every window does the same work.
    loader = data.TensorLoader(train_set, batch_size, sampler, world.device, drop_last=True)
    if len(loader) == 0:
        raise CourseError(
            f"batch {batch_size} per process on {w} process(es) is larger than a process's "
            f"{len(sampler)} samples of {world.plan.dataset} (strong scaling runs one "
            f"process at --batch-size x {world.plan.world_size}); use a smaller --batch-size"
        )
    return Run(model, window.config.optimizer(model), endless(loader, sampler), w)


def timed_window(world, run, no_sync=False, steps=None):
    """Seconds for ``steps`` steps of ``run`` (its calibrated count by default)."""
    steps = steps or run.steps
    world.rendezvous(run.world_size)
    context = run.model.no_sync() if no_sync else contextlib.nullcontext()
    start = time.perf_counter()
    with context:
        for _ in range(steps):
            train_step(run.model, run.optimizer, *next(run.batches))
    hardware.synchronize(world.device)
    return world.slowest(time.perf_counter() - start, run.world_size)


def calibrate(world, run):
    """Warm up, then pick the steps per window from a short timed probe."""
    timed_window(world, run, steps=world.plan.warmup_steps)
    probe_steps = 3
    step_s = timed_window(world, run, steps=probe_steps) / probe_steps
    run.steps = max(3, math.ceil(world.plan.window_s / step_s))


def build_runs(world, windows):
    """This rank's runs, built and calibrated; all ranks meet after each config's runs."""
    runs = {}
    for i, window in enumerate(windows):
        if world.rank < window.world_size and window.run not in runs:
            runs[window.run] = build_run(world, window)
            calibrate(world, runs[window.run])
        if i + 1 == len(windows) or windows[i + 1].config != window.config:
            world.rendezvous()
    return runs


def scaling(world):
    """Every window's seconds over the rounds, and the steps each window takes.

    The windows are interleaved: each round times every window once, in an order rotated
    by one each round, so no window always follows the same neighbour and a change in
    the machine's load hits all of them alike.
    """
    windows = scaling_windows(world.plan)
    runs = build_runs(world, windows)
    world.log(f"scaling: {len(windows)} windows calibrated; {world.plan.rounds} rounds")
    seconds = {window.key: [] for window in windows}
    for r in range(world.plan.rounds):
        shift = r % len(windows)
        for window in windows[shift:] + windows[:shift]:
            if world.rank < window.world_size:
                seconds[window.key].append(
                    timed_window(world, runs[window.run], no_sync=window.variant == NO_SYNC))
            world.rendezvous()
    # Rank 0 takes part in every run, so it knows every window's steps.
    steps = {window.key: runs[window.run].steps for window in windows if window.run in runs}
    return {"windows": seconds, "steps": steps}
