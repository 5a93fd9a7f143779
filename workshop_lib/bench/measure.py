"""The measurements every rank takes part in: the all-reduce sweep and the scaling windows
(with DDP against no_sync, against the no_sync step plus one all-reduce, against DDP's
defaults, and the trials of changes to the course's step, at N processes).

Every rank runs ``collective`` inside the process group. A world smaller than N runs on
the first ranks, in a subgroup, while the other ranks wait for it in a collective; the
wait is one window long (``plan.window_s``), never a whole section.
"""
import contextlib
import math
import os
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import RandomSampler, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from workshop_lib import data, ddp_compat, hardware, train_ddp
from workshop_lib.bench.plan import (
    BUFFER_SYNC,
    COURSE,
    FLAT,
    NO_SYNC,
    SYNC,
    Plan,
    scaling_windows,
)
from workshop_lib.errors import CourseError
from workshop_lib.precision import PLAIN
from workshop_lib.stopwatch import Stopwatch
from workshop_lib.train import train_step  # the step learners run, timed as it is
from workshop_lib.train_ddp import backward  # train_ddp's accumulation, micro-batch by micro-batch

# train_ddp.wrap's options, which a trial changes one at a time; test_bench pins them to
# the DDP that train_ddp.wrap builds.
COURSE_DDP_OPTIONS = {"forward_sync_buffers": False}


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
    trial_groups: dict = field(default_factory=dict)  # gloo_threads -> its own gloo group
    cores: frozenset = field(default_factory=lambda: frozenset(os.sched_getaffinity(0))
                             if hasattr(os, "sched_getaffinity") else frozenset())

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
    for threads in sorted({t.gloo_threads for t in plan.trials if t.gloo_threads}):
        world.trial_groups[threads] = gloo_group(world, threads)
    world.log(f"{plan.world_size} processes joined; measuring")
    started = time.perf_counter()
    results = {"allreduce": allreduce_sweep(world), **scaling(world)}
    world.log(f"scaling done ({time.perf_counter() - started:.0f} s)")
    if plan.world_size > 1 and plan.inside_ddp_steps:
        results["inside_ddp"] = inside_ddp(world)
        world.log(f"inside DDP done ({time.perf_counter() - started:.0f} s)")
    return results


def inside_ddp(world):
    """Notebook 07's wrappers (none, naive, overlapped, bucketed, PyTorch's DDP, and the
    bucket-size sweep) timed on all ranks by ``inside_ddp.timing``, with the bench's rounds."""
    from workshop_lib.inside_ddp import timing

    return timing.measure(world.rank, world.plan.world_size, rounds=world.plan.rounds,
                          steps=world.plan.inside_ddp_steps, device=world.device)


# -- All-reduce bus bandwidth ------------------------------------------------------------


def timed_allreduce(world, buffer, world_size):
    world.rendezvous(world_size)  # synchronised: the clock starts with the queue empty
    with Stopwatch(world.device) as watch:
        dist.all_reduce(buffer, group=world.group(world_size))
    return world.slowest(watch.seconds, world_size)


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


def gloo_group(world, threads):
    """All ranks in a gloo group of its own, on the loopback device, with ``threads``
    worker threads (gloo's default is 2, on the interface the host name resolves to).

    Neither can be asked of ``init_process_group`` or ``new_group`` (gloo's ignore their
    options), so this builds the group as c10d does, from private parts; None where this
    torch lacks them (the trial is then left out).
    """
    gloo = dist.ProcessGroupGloo
    try:
        options = gloo._Options()
        options._threads = threads
        # Local to each rank, and the same on all: where it fails (no "lo" on macOS, say),
        # it fails everywhere, before any rank waits for another.
        options._devices = [gloo.create_device(interface="lo")]
        options._timeout = timedelta(seconds=world.plan.timeout_s)
    except (AttributeError, TypeError, RuntimeError) as error:
        world.log(f"no gloo group of {threads} thread(s) on lo here ({error}); that trial "
                  f"is left out")
        return None
    try:
        store = dist.PrefixStore(f"bench_gloo_{threads}_threads",
                                 dist.distributed_c10d._get_default_store())
        size = world.plan.world_size
        backend = gloo(store, world.rank, size, options)
        group = dist.ProcessGroup(store, world.rank, size)
        group._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
        group._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO,
                                backend)
    except (AttributeError, TypeError) as error:
        world.log(f"no gloo group of {threads} thread(s) on lo in this torch ({error}); "
                  f"that trial is left out")
        return None
    return group


@dataclass
class TimedModel:
    """A model, its optimizer and its batches, stepped by the first ``world_size`` ranks."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    batches: object
    world_size: int
    group: object = None
    steps: int = 0  # per window, set by calibrate()
    one_float: torch.Tensor | None = None        # what the sync variant all-reduces
    gradient_buffer: torch.Tensor | None = None  # what the flat variant all-reduces


def wrap(model, device, group, variant=COURSE, trial=None, trial_group=None):
    """The course's DDP wrap, ``train_ddp.wrap``; for ``BUFFER_SYNC``, DDP with its
    defaults, which re-send BatchNorm's buffers from rank 0 before every forward; for a
    trial, the course's options with the trial's changes."""
    device_ids = [device] if device.type == "cuda" else None
    if variant == BUFFER_SYNC:
        return DDP(model, device_ids=device_ids, process_group=group,
                   **ddp_compat.buffer_sync(True))
    if trial is not None and (trial.ddp or trial.gloo_threads):
        return DDP(model, device_ids=device_ids, process_group=trial_group or group,
                   **ddp_compat.options(**{**COURSE_DDP_OPTIONS, **dict(trial.ddp)}))
    return train_ddp.wrap(model, device, process_group=group)


def model_for(world, config, world_size, variant=COURSE):
    """``config``'s model on this rank's device, DDP-wrapped where ranks share it;
    ``variant``: COURSE, BUFFER_SYNC or the name of a trial that changes DDP."""
    model = config.build(world.info).to(world.device)
    if world_size == 1:
        return model
    trial = next((t for t in world.plan.trials if t.name == variant), None)
    trial_group = world.trial_groups.get(trial.gloo_threads) if trial else None
    return wrap(model, world.device, world.group(world_size), variant, trial, trial_group)


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
    model = model_for(world, window.config, w, window.model_variant)
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
    trial = window.trial
    group = world.trial_groups.get(trial.gloo_threads) if trial else None
    run = TimedModel(model, window.config.optimizer(model), endless(loader, sampler), w,
              group or world.group(w))
    if w > 1:
        run.one_float = torch.zeros(1, device=world.device)
    if w > 1 and window.model_variant == COURSE:
        run.gradient_buffer = torch.zeros(sum(p.numel() for p in model.parameters()),
                                          device=world.device)
    return run


def window_steps(window, run):
    """Micro-batches a window takes: the run's calibrated steps, whole accumulation
    groups of them with an accumulating trial."""
    k = window.trial.accumulate if window is not None and window.trial else 1
    return max(1, run.steps // k) * k


def set_affinity(threads, cores):
    for tid in threads:
        with contextlib.suppress(ProcessLookupError):  # a thread that has ended since
            os.sched_setaffinity(tid, cores)


@contextlib.contextmanager
def pinned(world):
    """Every thread of this process (the training thread, gloo's workers) on one core of
    its own: the rank-th of the cores this process may use."""
    core = sorted(world.cores)[world.rank % len(world.cores)]
    threads = [int(tid) for tid in os.listdir("/proc/self/task")]
    set_affinity(threads, {core})
    try:
        yield
    finally:
        set_affinity([int(tid) for tid in os.listdir("/proc/self/task")], world.cores)


def accumulated_step(run, k):
    """One optimizer step over ``k`` micro-batches, as train_ddp.train_epoch takes it:
    no_sync() for all but the last backward, so one all-reduce per step (none inside an
    enclosing no_sync(), which the inner one leaves as it found it)."""
    for i in range(k):
        x, y = next(run.batches)
        with run.model.no_sync() if i < k - 1 else contextlib.nullcontext():
            backward(run.model, x, y, PLAIN, k)
    PLAIN.step(run.optimizer)
    run.optimizer.zero_grad(set_to_none=True)


def timed_window(world, run, window=None, steps=None):
    """Seconds for ``steps`` steps of ``run`` (its window's count by default), stepped as
    ``window``'s variant says (the course's step without a window)."""
    steps = steps or window_steps(window, run)
    variant = window.variant if window is not None else COURSE
    trial = window.trial if window is not None else None
    after = {SYNC: run.one_float, FLAT: run.gradient_buffer}.get(variant)
    with contextlib.ExitStack() as stack:
        if variant in (NO_SYNC, SYNC, FLAT):
            stack.enter_context(run.model.no_sync())
        if trial is not None and trial.pinned:
            stack.enter_context(pinned(world))
        world.rendezvous(run.world_size)
        watch = stack.enter_context(Stopwatch(world.device))
        if trial is not None and trial.accumulate > 1:
            for _ in range(steps // trial.accumulate):
                accumulated_step(run, trial.accumulate)
                if after is not None:  # once per optimizer step
                    dist.all_reduce(after, group=run.group)
        else:
            for _ in range(steps):
                train_step(run.model, run.optimizer, *next(run.batches))
                if after is not None:
                    dist.all_reduce(after, group=run.group)
    return world.slowest(watch.seconds, run.world_size)


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
    windows = [w for w in scaling_windows(world.plan) if runnable(world, w)]
    runs = build_runs(world, windows)
    world.log(f"scaling: {len(windows)} windows calibrated; {world.plan.rounds} rounds")
    seconds = {window.key: [] for window in windows}
    for r in range(world.plan.rounds):
        shift = r % len(windows)
        for window in windows[shift:] + windows[:shift]:
            if world.rank < window.world_size:
                seconds[window.key].append(timed_window(world, runs[window.run], window))
            world.rendezvous()
    # Rank 0 takes part in every run, so it knows every window's steps.
    steps = {window.key: window_steps(window, runs[window.run]) for window in windows
             if window.run in runs}
    return {"windows": seconds, "steps": steps}


def runnable(world, window):
    """False for a trial whose gloo group could not be built here."""
    trial = window.trial
    return not (trial and trial.gloo_threads and world.trial_groups.get(trial.gloo_threads)
                is None)
