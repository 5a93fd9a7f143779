"""Where the training time goes: scaling, loop overhead, communication, data path.

    python -m workshop_lib.bench --out runs/bench.json
    python -m workshop_lib.bench --quick                # a smoke run (tests use it)
    python -m workshop_lib.bench --batch-size 128 --width 64   # scale another step

One command measures, side by side, and prints a table (``--out`` gets the same figures
as JSON):

1. Scaling: samples/s with 1, 2, ... N processes at a fixed per-process batch (weak
   scaling) and at a fixed global batch (strong scaling); efficiency = speed-up / N,
   beside the efficiency predicted from one process's step time and the all-reduce floor.
2. Loop overhead: ``train.train_epoch`` fed by ``data.TensorLoader`` against a bare loop
   over the same model and data already on the device, as a ratio.
3. Communication: the all-reduce bus bandwidth from 1 KB to 256 MB; DDP's step against
   the same step under ``no_sync`` (no gradient all-reduce); and the floor
   ``2(N-1)/N * gradient bytes / bus bandwidth`` that no implementation can beat.
4. Data path: the device-resident ``TensorLoader`` against a ``DataLoader`` with workers.

Everything happens in one launch: the bench spawns N worker processes (one per GPU with
NCCL; on a CPU ``hardware.CPU_PROCESSES`` processes of one thread each with gloo), joins
them in one process group and takes every measurement there. Smaller worlds use
subgroups of it while the other ranks wait. Runs that are compared are interleaved round
by round, so a change in the machine's load hits both sides alike; each figure is the
median over the rounds with its min..max and n, and ratios are taken within a round.
Warm-up is excluded and GPU work is synchronized before every clock read.
BENCHMARKS.md records what this command measured, and on which machine.
"""
import argparse
import contextlib
import copy
import json
import math
import multiprocessing
import os
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, RandomSampler, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from workshop_lib import data, hardware, models, optim, profile, runlog, scaling, train
from workshop_lib.errors import CourseError, exit_cleanly_on_course_error

KB, MB = 2**10, 2**20
# The settings train.py uses by default; speed does not depend on them, only fairness.
LR, MOMENTUM, WEIGHT_DECAY = 0.05, 0.9, 5e-4
LOOP_OVERHEAD_TARGET = 0.95


@dataclass(frozen=True)
class StepConfig:
    """A training step to time: a model and a per-process batch size."""

    name: str
    model: str
    batch_size: int
    width: int = 0  # SmallCNN channels; 0 keeps the width the course trains

    def build(self, info):
        torch.manual_seed(0)
        if self.model == "cnn" and self.width:
            return models.SmallCNN(info.in_channels, info.num_classes, self.width)
        return models.build(self.model, info)

    @property
    def label(self):
        return f"{self.model} w{self.width}" if self.width else self.model


@dataclass(frozen=True)
class Plan:
    """What to measure, and how long: identical on every rank."""

    device_type: str
    world_size: int
    world_sizes: tuple
    dataset: str
    data_dir: str
    epoch_samples: int       # samples per epoch where a window is whole epochs; 0: all
    configs: tuple
    rounds: int
    window_s: float          # the length of one timed window
    warmup_steps: int
    allreduce_sizes: tuple   # bytes
    allreduce_budget_s: float
    allreduce_min_reps: int
    loader_workers: int
    timeout_s: float


def default_configs(device_type, model=None, batch_sizes=None, width=None, quick=False):
    """The course's own step (the profile's model and batch) and a step sized to scale
    (one per entry of ``batch_sizes`` when several are given, to compare them in one run).

    On a CPU the course's step (SmallCNN, batch 32 per process) takes ~8 ms, and DDP adds
    ~5 ms of synchronisation to it, so it scales poorly. The second step keeps the model
    and takes batch 512 per process: measured over 32..512 (BENCHMARKS.md), weak-scaling
    efficiency on 2 one-thread processes rose from ~0.56 at batch 32 to 0.82-0.87 at 256
    and 0.85-0.94 at 512, the issue's 0.85 target.
    On GPUs the second step is the original workshop's model, Wide ResNet 16-10 (17M
    parameters) at batch 128, whose 68 MB of gradients make communication matter.
    """
    course = profile.get_profile("gpu" if device_type == "cuda" else "cpu")
    if device_type == "cuda":
        model, default_batch = model or "wrn-16-10", 128
    else:
        # --quick only checks that everything runs: a 4x cheaper step is enough for that.
        model, default_batch = model or "cnn", 128 if quick else 512
    batch_sizes = batch_sizes or [default_batch]
    tuned = [StepConfig("scaling" if len(batch_sizes) == 1 else f"scaling-{b}", model, b,
                        width or 0) for b in batch_sizes]
    return (StepConfig("course", course.model, course.batch_size), *tuned)


def make_plan(args, device):
    if args.nproc is not None:
        world_size = args.nproc
    else:
        world_size = torch.cuda.device_count() if device.type == "cuda" else hardware.CPU_PROCESSES
    if world_size < 1:
        raise CourseError(f"--nproc must be at least 1, got {world_size}")
    if device.type == "cuda" and world_size > torch.cuda.device_count():
        raise CourseError(f"--nproc {world_size} but {torch.cuda.device_count()} GPU(s) "
                          f"visible; one process per GPU: pass --nproc "
                          f"{torch.cuda.device_count()} or --device cpu")
    # Powers of two up to N, and N itself: 1, 2, 4, 8 on eight GPUs, 1, 2 on a CPU.
    world_sizes = sorted({w for w in (2**k for k in range(8)) if w <= world_size} | {world_size})
    if device.type == "cuda":
        dataset = data.resolve_name(args.dataset, args.data_dir)
    else:
        # A CPU bench must finish in minutes: the offline dataset unless told otherwise.
        dataset = "digits" if args.dataset == "auto" else data.resolve_name(args.dataset)
    # 1 KB to 256 MB in steps of 4x (a 256 MB gloo all-reduce takes under a second on
    # 2 cores, so a CPU can afford the whole range; --quick stops at 4 MB).
    largest = 4 * MB if args.quick else 256 * MB
    sizes = tuple(s for s in (KB * 4**k for k in range(10)) if s <= largest)
    return Plan(
        device_type=device.type, world_size=world_size, world_sizes=tuple(world_sizes),
        dataset=dataset, data_dir=str(args.data_dir),
        # Quick: short epochs, since a loop-overhead or data-path window is whole epochs.
        epoch_samples=512 if args.quick else 0,
        configs=default_configs(device.type, args.model, args.batch_size, args.width,
                                args.quick),
        rounds=args.rounds if args.rounds is not None else 3 if args.quick else 7,
        window_s=0.05 if args.quick else 0.4,
        warmup_steps=2 if args.quick else 5,
        allreduce_sizes=sizes,
        allreduce_budget_s=0.05 if args.quick else 0.5,
        allreduce_min_reps=3 if args.quick else 5,
        loader_workers=args.loader_workers if args.loader_workers is not None
        else min(4, hardware.cpu_cores()),
        timeout_s=args.timeout,
    )


# ---------------------------------------------------------------------------------------
# The measurements, run inside every worker process


def synchronize(device):
    """Wait for queued GPU work, so that a clock read after it measures it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_step(model, optimizer, x, y):
    """The step of train.train_epoch, without the scheduler and the loss bookkeeping."""
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def endless(loader, sampler):
    """Batches from ``loader``, epoch after epoch (reshuffled as the scripts do)."""
    epoch = 0
    while True:
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def gradient_bytes(model):
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


class ScalingRun:
    """One model trained by the first ``world_size`` ranks at one per-process batch."""

    def __init__(self, bench, config, world_size, batch_size, ddp_options=None):
        self.config, self.world_size, self.batch_size = config, world_size, batch_size
        self.group = bench.group(world_size)
        device = bench.device
        model = config.build(bench.info).to(device)
        if world_size > 1:
            # As train_ddp.py wraps it, unless ddp_options say otherwise.
            model = DDP(model, device_ids=[device] if device.type == "cuda" else None,
                        process_group=self.group, **(ddp_options or {}))
        self.model = model
        self.optimizer = optim.build("sgd", model.parameters(), LR, MOMENTUM, WEIGHT_DECAY)
        if world_size > 1:
            sampler = DistributedSampler(bench.train_set, world_size, bench.rank, seed=0)
        else:
            sampler = RandomSampler(bench.train_set, generator=torch.Generator().manual_seed(0))
        # Full batches only, so that every window does the same work.
        loader = data.TensorLoader(bench.train_set, batch_size, sampler, device, drop_last=True)
        if len(loader) == 0:
            raise CourseError(
                f"batch {batch_size} per process on {world_size} process(es) is larger than "
                f"a process's {len(sampler)} samples of {bench.plan.dataset} (strong scaling "
                f"runs one process at --batch-size x {bench.plan.world_size}); use a smaller "
                f"--batch-size"
            )
        self.batches = endless(loader, sampler)
        self.steps = 0  # per window, set by calibrate()


def run_key(config_name, world_size, batch_size, variant=None):
    key = f"{config_name}/{world_size}x{batch_size}"
    return f"{key}/{variant}" if variant else key


class Bench:
    def __init__(self, rank, plan, device):
        self.rank, self.plan, self.device = rank, plan, device
        train_set, _, self.info = data.load(plan.dataset, plan.data_dir)
        self.train_set = train_set
        # The data of the sections whose windows are whole epochs (loop overhead, data path).
        self.epoch_set = train_set if not plan.epoch_samples else TensorDataset(
            *(t[:plan.epoch_samples] for t in train_set.tensors))
        # Every rank creates every subgroup, in the same order (a collective call).
        self.groups = {w: dist.new_group(list(range(w))) for w in plan.world_sizes
                       if 1 < w < plan.world_size}

    def group(self, world_size):
        if world_size == 1:
            return None
        return self.groups.get(world_size)  # None: the whole world

    def log(self, message):
        if self.rank == 0:
            print(f"[bench] {message}", file=sys.stderr, flush=True)

    def rendezvous(self, world_size=None):
        """Wait until the first ``world_size`` ranks (default all) get here."""
        world_size = world_size or self.plan.world_size
        if world_size > 1:
            flag = torch.zeros(1, device=self.device)
            dist.all_reduce(flag, group=self.group(world_size))
        synchronize(self.device)

    def slowest(self, seconds, world_size):
        """The longest of the ranks' times: a group moves at its slowest member's pace."""
        if world_size == 1:
            return seconds
        t = torch.tensor([seconds], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group(world_size))
        return t.item()

    # -- 3a. all-reduce bus bandwidth ----------------------------------------------------

    def timed_allreduce(self, buffer, world_size):
        self.rendezvous(world_size)
        start = time.perf_counter()
        dist.all_reduce(buffer, group=self.group(world_size))
        synchronize(self.device)
        return self.slowest(time.perf_counter() - start, world_size)

    def allreduce_sweep(self):
        plan, sweeps = self.plan, {}
        for w in plan.world_sizes[1:]:
            if self.rank < w:
                rows = []
                for nbytes in plan.allreduce_sizes:
                    # Zeros: a sum of zeros never overflows into inf over the repetitions.
                    buffer = torch.zeros(nbytes // 4, device=self.device)
                    self.timed_allreduce(buffer, w)  # warm-up: connections, buffers
                    probe = self.timed_allreduce(buffer, w)  # the same on every rank
                    reps = min(200, max(plan.allreduce_min_reps,
                                        int(plan.allreduce_budget_s / probe)))
                    rows.append({"bytes": nbytes, "seconds": [
                        self.timed_allreduce(buffer, w) for _ in range(reps)]})
                    del buffer
                sweeps[str(w)] = rows
            self.rendezvous()
            self.log(f"all-reduce sweep over {w} ranks done")
        return sweeps

    # -- 1 and 3b. scaling, and DDP against no_sync -------------------------------------

    def window(self, run, no_sync=False, steps=None):
        """Seconds for ``steps`` steps of ``run`` (its calibrated count by default)."""
        steps = steps or run.steps
        self.rendezvous(run.world_size)
        context = run.model.no_sync() if no_sync else contextlib.nullcontext()
        start = time.perf_counter()
        with context:
            for _ in range(steps):
                train_step(run.model, run.optimizer, *next(run.batches))
        synchronize(self.device)
        return self.slowest(time.perf_counter() - start, run.world_size)

    def calibrate(self, run):
        """Warm up, then pick the steps per window from a short timed probe."""
        self.window(run, steps=self.plan.warmup_steps)
        probe_steps = 3
        step_s = self.window(run, steps=probe_steps) / probe_steps
        run.steps = max(3, math.ceil(self.plan.window_s / step_s))

    def scaling(self):
        """Every run's windows, interleaved. At N ranks the weak-scaling run is also timed
        under no_sync (no gradient all-reduce), and beside it a run whose DDP does not
        re-send BatchNorm's buffers from rank 0 before every forward."""
        plan, n = self.plan, self.plan.world_size
        runs, measurements = {}, []  # measurements: (window key, run key, world size, no_sync)

        def add_run(key, config, w, batch, ddp_options=None):
            if self.rank < w:
                run = ScalingRun(self, config, w, batch, ddp_options)
                self.calibrate(run)
                runs[key] = run

        for config in plan.configs:
            for w in plan.world_sizes:
                for batch in sorted({config.batch_size, config.batch_size * n // w}):
                    key = run_key(config.name, w, batch)
                    add_run(key, config, w, batch)
                    measurements.append((f"{key}/default", key, w, False))
            if n > 1:
                key = run_key(config.name, n, config.batch_size)
                measurements.append((f"{key}/no_sync", key, n, True))
                add_run(f"{key}/no_buffer_sync", config, n, config.batch_size,
                        {"forward_sync_buffers": False})
                measurements.append((f"{key}/no_buffer_sync", f"{key}/no_buffer_sync", n, False))
            self.rendezvous()
        self.log(f"scaling: {len(measurements)} runs calibrated; {plan.rounds} rounds")

        windows = {window: [] for window, *_ in measurements}
        for r in range(plan.rounds):
            # Rotate the order each round, so no run always follows the same neighbour.
            shift = r % len(measurements)
            for window, key, w, no_sync in measurements[shift:] + measurements[:shift]:
                if self.rank < w:
                    windows[window].append(self.window(runs[key], no_sync=no_sync))
                self.rendezvous()
        # Rank 0 takes part in every run, so it knows every run's steps per window.
        steps = {window: runs[key].steps for window, key, *_ in measurements if key in runs}
        parameters = {}
        for config in plan.configs:
            model = config.build(self.info)
            parameters[config.name] = {"parameters": models.count_parameters(model),
                                       "gradient_bytes": gradient_bytes(model)}
        return {"windows": windows, "steps": steps, "models": parameters}

    # -- 2. loop overhead ----------------------------------------------------------------

    def loop_overhead(self, config):
        """train.train_epoch with a TensorLoader against the bare minimum, same batches."""
        device, b = self.device, config.batch_size
        library_model = config.build(self.info).to(device)
        bare_model = copy.deepcopy(library_model)
        generator = torch.Generator().manual_seed(0)
        loader = data.TensorLoader(self.epoch_set, b, RandomSampler(self.epoch_set,
                                   generator=generator), device)
        library_optimizer = optim.build("sgd", library_model.parameters(), LR, MOMENTUM,
                                        WEIGHT_DECAY)
        # The schedule train.py builds: a warmup epoch, then cosine decay.
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            library_optimizer, lambda step: scaling.lr_factor(step, len(loader), 10**6))
        bare_optimizer = optim.build("sgd", bare_model.parameters(), LR, MOMENTUM, WEIGHT_DECAY)
        # The bare loop's data: one shuffled copy on the device, cut into the same batch
        # sizes once, outside the clock.
        order = torch.randperm(len(self.epoch_set), generator=generator).to(device)
        bare_batches = list(zip(loader.x[order].split(b), loader.y[order].split(b),
                                strict=True))

        def library_epoch():
            train.train_epoch(library_model, loader, library_optimizer, scheduler,
                              progress=False)

        def bare_epoch():
            for x, y in bare_batches:
                train_step(bare_model, bare_optimizer, x, y)

        loops = {"library": library_epoch, "bare": bare_epoch}
        return self.interleaved_epochs(loops, samples_per_epoch=len(self.epoch_set))

    def interleaved_epochs(self, loops, samples_per_epoch):
        """Time each of ``loops`` (one epoch per call), alternating, for ``rounds`` rounds."""
        epochs = {}
        for name, epoch in loops.items():
            epoch()  # warm-up
            synchronize(self.device)
            start = time.perf_counter()
            epoch()
            synchronize(self.device)
            epochs[name] = max(1, round(self.plan.window_s / (time.perf_counter() - start)))
        seconds = {name: [] for name in loops}
        # This process's CPU time too: against the wall time it says how much of the
        # window other work on the machine took from it.
        cpu_seconds = {name: [] for name in loops}
        names = list(loops)
        for r in range(self.plan.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                synchronize(self.device)
                start, cpu_start = time.perf_counter(), time.process_time()
                for _ in range(epochs[name]):
                    loops[name]()
                synchronize(self.device)
                seconds[name].append(time.perf_counter() - start)
                cpu_seconds[name].append(time.process_time() - cpu_start)
        return {name: {"seconds": seconds[name], "cpu_seconds": cpu_seconds[name],
                       "samples": epochs[name] * samples_per_epoch} for name in loops}

    # -- 4. data path --------------------------------------------------------------------

    def data_path(self, config):
        """Device-resident TensorLoader against a DataLoader with workers: training fed by
        each, and each loader alone (batches moved to the device, no training)."""
        device, b, workers = self.device, config.batch_size, self.plan.loader_workers
        model = config.build(self.info).to(device)
        optimizer = optim.build("sgd", model.parameters(), LR, MOMENTUM, WEIGHT_DECAY)
        tensor_loader = data.TensorLoader(
            self.epoch_set, b,
            RandomSampler(self.epoch_set, generator=torch.Generator().manual_seed(0)), device)
        # Workers forked, as a training script started by torchrun on Linux gets them (this
        # spawned process would default to spawn, whose workers import torch afresh).
        context = "fork" if workers and "fork" in multiprocessing.get_all_start_methods() \
            else None
        data_loader = DataLoader(
            self.epoch_set, b, shuffle=True, num_workers=workers,
            persistent_workers=workers > 0, pin_memory=device.type == "cuda",
            generator=torch.Generator().manual_seed(0), multiprocessing_context=context)
        start = time.perf_counter()
        next(iter(data_loader))  # worker start-up: paid once per run with persistent workers
        startup_s = time.perf_counter() - start

        def train_on(loader):
            for x, y in loader:
                train_step(model, optimizer, x.to(device, non_blocking=True),
                           y.to(device, non_blocking=True))

        def load_only(loader):
            for x, y in loader:  # the copies to the device are the work timed here
                x.to(device, non_blocking=True), y.to(device, non_blocking=True)

        loops = {
            "train/tensor_loader": lambda: train_on(tensor_loader),
            "train/data_loader": lambda: train_on(data_loader),
            "load/tensor_loader": lambda: load_only(tensor_loader),
            "load/data_loader": lambda: load_only(data_loader),
        }
        timings = self.interleaved_epochs(loops, samples_per_epoch=len(self.epoch_set))
        return {"timings": timings, "workers": workers, "worker_startup_s": startup_s}

    def run(self):
        started = time.perf_counter()
        results = {"allreduce": self.allreduce_sweep()}
        results.update(self.scaling())
        self.log(f"scaling done ({time.perf_counter() - started:.0f} s)")
        results["loop_overhead"], results["data_path"] = {}, {}
        if self.rank == 0:
            for config in self.plan.configs:
                results["loop_overhead"][config.name] = self.loop_overhead(config)
            self.log(f"loop overhead done ({time.perf_counter() - started:.0f} s)")
            results["data_path"] = self.data_path(self.plan.configs[0])
            self.log(f"data path done ({time.perf_counter() - started:.0f} s)")
        self.rendezvous()  # the other ranks wait here, idle, for rank 0's single-process parts
        return results


def _worker(rank, plan_dict, port, result_path):
    plan = Plan(**{**plan_dict, "configs": tuple(StepConfig(**c) for c in plan_dict["configs"])})
    if plan.device_type == "cuda":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)  # one thread per rank: ranks never fight over a core
    dist.init_process_group(hardware.backend_for(device), init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=plan.world_size,
                            timeout=timedelta(seconds=plan.timeout_s))
    try:
        bench = Bench(rank, plan, device)
        bench.log(f"{plan.world_size} processes joined; measuring")
        results = bench.run()
        if rank == 0:
            Path(result_path).write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(plan):
    """Run the measurements in ``plan.world_size`` fresh processes; rank 0's raw results.

    Spawned, not forked: a fork of a process whose OpenMP pool is running can deadlock.
    """
    if plan.device_type == "cpu":
        os.environ["OMP_NUM_THREADS"] = "1"  # the workers' OpenMP pools start with one thread
    with tempfile.TemporaryDirectory() as folder:
        result_path = Path(folder) / "raw.json"
        try:
            mp.start_processes(_worker, args=(asdict(plan), free_port(), str(result_path)),
                               nprocs=plan.world_size, start_method="spawn", join=True)
        except mp.ProcessRaisedException as error:
            # A worker's CourseError (say, a batch larger than a rank's share of the data)
            # is the learner's to fix: one line, as everywhere in the course.
            last_line = str(error).strip().splitlines()[-1]
            if last_line.startswith(f"{CourseError.__module__}.CourseError: "):
                raise CourseError(last_line.split(": ", 1)[1]) from None
            raise
        return json.loads(result_path.read_text())


# ---------------------------------------------------------------------------------------
# From raw timings to figures


def summary(values):
    """Median, min, max and n of a list of numbers."""
    ordered = sorted(values)
    return {"median": statistics.median(ordered), "min": ordered[0], "max": ordered[-1],
            "n": len(ordered)}


def per_round(numerators, denominators, scale=1.0):
    """Summary of ratios taken within each round (both runs saw the same machine load)."""
    return summary([a / b * scale for a, b in zip(numerators, denominators, strict=True)])


def allreduce_floor_s(world_size, nbytes, bus_bandwidth_gb_s):
    """The ring all-reduce's minimum: each rank sends and receives 2(N-1)/N of the data."""
    return 2 * (world_size - 1) / world_size * nbytes / (bus_bandwidth_gb_s * 1e9)


def bus_bandwidth_at(rows, nbytes):
    """Measured bus bandwidth at ``nbytes``, interpolated in log-log between sizes."""
    points = [(row["bytes"], row["bus_bandwidth_gb_s"]["median"]) for row in rows]
    if nbytes <= points[0][0]:
        return points[0][1]
    for (b0, v0), (b1, v1) in zip(points, points[1:], strict=False):
        if nbytes <= b1:
            f = math.log(nbytes / b0) / math.log(b1 / b0)
            return math.exp(math.log(v0) + f * (math.log(v1) - math.log(v0)))
    return points[-1][1]


def analyse(raw, plan):
    n = plan.world_size
    allreduce = {}
    for size, rows in raw["allreduce"].items():
        w = int(size)
        allreduce[w] = [{
            "bytes": row["bytes"],
            "seconds": summary(row["seconds"]),
            "bus_bandwidth_gb_s": summary(
                [row["bytes"] / s * 2 * (w - 1) / w / 1e9 for s in row["seconds"]]),
        } for row in rows]

    windows, steps = raw["windows"], raw["steps"]

    def samples_per_s(config, w, batch, variant):
        window = run_key(config.name, w, batch, variant)
        return [steps[window] * batch * w / s for s in windows[window]]

    def step_s(config, w, batch, variant):
        window = run_key(config.name, w, batch, variant)
        return [s / steps[window] for s in windows[window]]

    scaling_rows, exposed_rows = [], []
    for config in plan.configs:
        model_facts = raw["models"][config.name]
        for mode in ("weak", "strong"):
            def batch_for(w, mode=mode, config=config):
                return config.batch_size if mode == "weak" else config.batch_size * n // w
            base = samples_per_s(config, 1, batch_for(1), "default")
            one_step_s = statistics.median(step_s(config, 1, batch_for(1), "default"))
            for w in plan.world_sizes:
                sps = samples_per_s(config, w, batch_for(w), "default")
                predicted = None
                if mode == "weak" and w > 1:
                    bandwidth = bus_bandwidth_at(allreduce[w], model_facts["gradient_bytes"])
                    floor = allreduce_floor_s(w, model_facts["gradient_bytes"], bandwidth)
                    predicted = one_step_s / (one_step_s + floor)
                scaling_rows.append({
                    "config": config.name, "model": config.label, "mode": mode,
                    "world_size": w, "batch_size": batch_for(w),
                    "global_batch_size": batch_for(w) * w,
                    "samples_per_s": summary(sps), "speedup": per_round(sps, base),
                    "efficiency": per_round(sps, base, 1 / w),
                    "predicted_efficiency": predicted,
                })
        if n > 1:
            b = config.batch_size
            ddp, no_sync = step_s(config, n, b, "default"), step_s(config, n, b, "no_sync")
            no_buffer_sync = step_s(config, n, b, "no_buffer_sync")
            bandwidth = bus_bandwidth_at(allreduce[n], model_facts["gradient_bytes"])
            exposed_rows.append({
                "config": config.name, "model": config.label, "world_size": n,
                "batch_size": b, **model_facts,
                "ddp_step_s": summary(ddp), "no_sync_step_s": summary(no_sync),
                "exposed_s": summary([d - s for d, s in zip(ddp, no_sync, strict=True)]),
                "exposed_fraction": per_round([d - s for d, s in zip(ddp, no_sync, strict=True)],
                                              ddp),
                "bus_bandwidth_gb_s": bandwidth,
                "floor_s": allreduce_floor_s(n, model_facts["gradient_bytes"], bandwidth),
                "no_sync_efficiency": per_round(samples_per_s(config, n, b, "no_sync"),
                                                samples_per_s(config, 1, b, "default"), 1 / n),
                # DDP(forward_sync_buffers=False): BatchNorm's running statistics stay
                # per rank during training instead of being re-sent before every forward.
                "no_buffer_sync_step_s": summary(no_buffer_sync),
                "no_buffer_sync_speedup": per_round(ddp, no_buffer_sync),
            })

    loop_rows = []
    for config in plan.configs:
        timings = raw["loop_overhead"][config.name]
        library, bare = timings["library"], timings["bare"]
        library_rate = [library["samples"] / s for s in library["seconds"]]
        bare_rate = [bare["samples"] / s for s in bare["seconds"]]
        loop_rows.append({
            "config": config.name, "model": config.label, "batch_size": config.batch_size,
            "library_samples_per_s": summary(library_rate),
            "bare_samples_per_s": summary(bare_rate),
            "ratio": per_round(library_rate, bare_rate), "target": LOOP_OVERHEAD_TARGET,
            # The same ratio from CPU time: on a CPU (one thread, no workers, no
            # communication) the work itself, with other processes' share taken out.
            "ratio_by_cpu_time": per_round(bare["cpu_seconds"], library["cpu_seconds"],
                                           library["samples"] / bare["samples"]),
            "on_cpu_share": summary([c / s for t in (library, bare)
                                     for c, s in zip(t["cpu_seconds"], t["seconds"],
                                                     strict=True)]),
        })

    path = raw["data_path"]
    rates = {name: [t["samples"] / s for s in t["seconds"]]
             for name, t in path["timings"].items()}
    data_rows = []
    for what in ("train", "load"):
        tensor_loader, data_loader = rates[f"{what}/tensor_loader"], rates[f"{what}/data_loader"]
        data_rows.append({"what": what,
                          "tensor_loader_samples_per_s": summary(tensor_loader),
                          "data_loader_samples_per_s": summary(data_loader),
                          "ratio": per_round(tensor_loader, data_loader)})
    return {
        "scaling": scaling_rows,
        "loop_overhead": loop_rows,
        "communication": {
            "allreduce": {str(w): rows for w, rows in allreduce.items()},
            "exposed": exposed_rows,
        },
        "data_path": {"config": plan.configs[0].name, "model": plan.configs[0].label,
                      "batch_size": plan.configs[0].batch_size,
                      "workers": path["workers"], "worker_startup_s": path["worker_startup_s"],
                      "rows": data_rows},
    }


# ---------------------------------------------------------------------------------------
# The table


def format_stats(stats, spec, scale=1.0):
    """``median [min..max]`` of a summary, each number formatted with ``spec``."""
    return (f"{format(stats['median'] * scale, spec)} "
            f"[{format(stats['min'] * scale, spec)}..{format(stats['max'] * scale, spec)}]")


def format_bytes(nbytes):
    return f"{nbytes // MB} MB" if nbytes >= MB else f"{nbytes // KB} KB"


def format_report(report):
    setup = report["setup"]
    lines = [
        f"workshop_lib.bench: {setup['device']}, {setup['backend']}, "
        f"{setup['world_size']} process(es) x {setup['threads_per_process'] or 'one GPU'} "
        f"{'thread' if setup['threads_per_process'] else ''}, dataset {setup['dataset']}, "
        f"torch {report['hardware']['torch']}, {report['hardware']['cpu_cores']} CPU cores",
        f"load average (1 min): {report['load_average']['start'][0]:.2f} at start, "
        f"{report['load_average']['end'][0]:.2f} at end; wall {report['wall_s']:.0f} s",
        f"figures: median [min..max] over n={setup['rounds']} rounds; the runs compared are "
        f"interleaved within each round",
    ]
    on_cpu = min(r["on_cpu_share"]["median"] for r in report["loop_overhead"])
    if setup["device"] == "cpu" and on_cpu < 0.9:
        lines.append(f"warning: other processes held the CPU for {1 - on_cpu:.0%} of a "
                     f"single-process window; the figures are noisy (see the load average)")
    lines += [
        "",
        "1. Scaling (efficiency = speed-up / processes; predicted: one process's step plus "
        "the all-reduce floor, no overlap)",
    ]
    rows = [{
        "config": r["config"], "model": r["model"], "mode": r["mode"],
        "procs": r["world_size"], "batch": r["batch_size"], "global": r["global_batch_size"],
        "sps": format_stats(r["samples_per_s"], ",.0f"),
        "speedup": format_stats(r["speedup"], ".2f"),
        "efficiency": format_stats(r["efficiency"], ".2f"),
        "predicted": "" if r["predicted_efficiency"] is None
        else f"{r['predicted_efficiency']:.2f}",
    } for r in report["scaling"]]
    lines.append(runlog.format_table(rows, {
        "config": ("config", ""), "model": ("model", ""), "mode": ("mode", ""),
        "procs": ("procs", "d"), "batch": ("batch/proc", "d"), "global": ("global", "d"),
        "sps": ("samples/s", ""), "speedup": ("speed-up", ""),
        "efficiency": ("efficiency", ""), "predicted": ("predicted", "")}))

    lines += ["", "2. Loop overhead: train.train_epoch + TensorLoader vs a bare loop "
              f"(target ratio >= {LOOP_OVERHEAD_TARGET})"]
    rows = [{"config": r["config"], "model": r["model"], "batch": r["batch_size"],
             "library": format_stats(r["library_samples_per_s"], ",.0f"),
             "bare": format_stats(r["bare_samples_per_s"], ",.0f"),
             "ratio": format_stats(r["ratio"], ".3f"),
             "ratio_cpu": format_stats(r["ratio_by_cpu_time"], ".3f"),
             "on_cpu": format_stats(r["on_cpu_share"], ".2f")} for r in report["loop_overhead"]]
    lines.append(runlog.format_table(rows, {
        "config": ("config", ""), "model": ("model", ""), "batch": ("batch", "d"),
        "library": ("library samples/s", ""), "bare": ("bare samples/s", ""),
        "ratio": ("ratio", ""), "ratio_cpu": ("ratio by CPU time", ""),
        "on_cpu": ("on-CPU share", "")}))

    communication = report["communication"]
    lines += ["", "3. Communication"]
    for w, sweep in communication["allreduce"].items():
        lines.append(f"all-reduce over {w} ranks (bus bandwidth = bytes / time * 2(N-1)/N)")
        rows = [{"size": format_bytes(r["bytes"]),
                 "time": format_stats(r["seconds"], ".3f", 1e3),
                 "bandwidth": format_stats(r["bus_bandwidth_gb_s"], ".3f"),
                 "n": r["seconds"]["n"]} for r in sweep]
        lines.append(runlog.format_table(rows, {
            "size": ("size", ""), "time": ("time ms", ""), "bandwidth": ("bus GB/s", ""),
            "n": ("n", "d")}))
    if communication["exposed"]:
        lines.append("exposed communication: DDP step vs the same step under no_sync; floor "
                     "= 2(N-1)/N * gradient bytes / bus bandwidth at that size")
        rows = [{"config": r["config"], "model": r["model"], "procs": r["world_size"],
                 "batch": r["batch_size"], "grad": f"{r['gradient_bytes'] / MB:.2f}",
                 "ddp": format_stats(r["ddp_step_s"], ".2f", 1e3),
                 "no_sync": format_stats(r["no_sync_step_s"], ".2f", 1e3),
                 "exposed": format_stats(r["exposed_s"], ".2f", 1e3),
                 "floor": f"{r['floor_s'] * 1e3:.3f}",
                 "no_sync_eff": format_stats(r["no_sync_efficiency"], ".2f")}
                for r in communication["exposed"]]
        lines.append(runlog.format_table(rows, {
            "config": ("config", ""), "model": ("model", ""), "procs": ("procs", "d"),
            "batch": ("batch/proc", "d"), "grad": ("grad MB", ""),
            "ddp": ("DDP step ms", ""), "no_sync": ("no_sync step ms", ""),
            "exposed": ("exposed ms", ""), "floor": ("floor ms", ""),
            "no_sync_eff": ("efficiency without all-reduce", "")}))
        lines.append("the same DDP step with forward_sync_buffers=False (BatchNorm buffers not "
                     "re-sent from rank 0 before every forward)")
        rows = [{"config": r["config"], "model": r["model"], "procs": r["world_size"],
                 "batch": r["batch_size"], "ddp": format_stats(r["ddp_step_s"], ".2f", 1e3),
                 "no_buffer_sync": format_stats(r["no_buffer_sync_step_s"], ".2f", 1e3),
                 "speedup": format_stats(r["no_buffer_sync_speedup"], ".2f")}
                for r in communication["exposed"]]
        lines.append(runlog.format_table(rows, {
            "config": ("config", ""), "model": ("model", ""), "procs": ("procs", "d"),
            "batch": ("batch/proc", "d"), "ddp": ("DDP step ms", ""),
            "no_buffer_sync": ("without buffer sync ms", ""), "speedup": ("speed-up", "")}))

    path = report["data_path"]
    lines += ["", f"4. Data path ({path['config']} step, {path['model']}, batch "
              f"{path['batch_size']}): device-resident TensorLoader vs DataLoader with "
              f"{path['workers']} workers (start-up {path['worker_startup_s']:.2f} s, "
              f"not in the figures)"]
    rows = [{"what": "training" if r["what"] == "train" else "loading only",
             "tensor": format_stats(r["tensor_loader_samples_per_s"], ",.0f"),
             "loader": format_stats(r["data_loader_samples_per_s"], ",.0f"),
             "ratio": format_stats(r["ratio"], ".2f")} for r in path["rows"]]
    lines.append(runlog.format_table(rows, {
        "what": ("samples/s", ""), "tensor": ("TensorLoader", ""),
        "loader": ("DataLoader", ""), "ratio": ("ratio", "")}))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m workshop_lib.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/bench.json"),
                        help="the figures as JSON (default: %(default)s)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 3 rounds, short windows and epochs, all-reduces up "
                             "to 4 MB, a smaller scaling step on a CPU")
    parser.add_argument("--device", default="auto", type=hardware.device_flag)
    parser.add_argument("--nproc", type=int, default=None,
                        help="processes at most (default: one per GPU, else "
                             f"{hardware.CPU_PROCESSES})")
    parser.add_argument("--dataset", default="auto", choices=data.DATASET_CHOICES,
                        help="auto: digits on a CPU; fashion-mnist if downloaded on GPUs")
    parser.add_argument("--data-dir", type=Path, default=data.DEFAULT_DATA_DIR)
    parser.add_argument("--model", default=None,
                        help="the second step's model (default: cnn on a CPU, wrn-16-10 on GPUs)")
    parser.add_argument("--width", type=int, default=None, help="its SmallCNN width")
    parser.add_argument("--batch-size", type=int, nargs="+", default=None,
                        help="its batch per process (default: 512 on a CPU, 128 on GPUs); "
                             "several values compare several steps in one run")
    parser.add_argument("--rounds", type=int, default=None,
                        help="interleaved rounds per figure (default: 7; 3 with --quick)")
    parser.add_argument("--loader-workers", type=int, default=None,
                        help="DataLoader workers (default: the cores, at most 4)")
    parser.add_argument("--timeout", type=float, default=900,
                        help="seconds a rank waits for the others before failing")
    return parser.parse_args(argv)


@exit_cleanly_on_course_error
def main(argv=None):
    args = parse_args(argv)
    if args.model is not None and args.model not in models.MODELS:
        raise CourseError(f"unknown model {args.model!r}; choose one of {', '.join(models.MODELS)}")
    given = {"--batch-size": min(args.batch_size) if args.batch_size else None,
             "--rounds": args.rounds, "--width": args.width, "--timeout": args.timeout}
    for flag, value in given.items():
        if value is not None and not value > 0:
            raise CourseError(f"{flag} must be positive, got {value}")
    if args.loader_workers is not None and args.loader_workers < 0:
        raise CourseError(f"--loader-workers must be 0 or more, got {args.loader_workers}")
    device = hardware.pick_device(args.device)
    plan = make_plan(args, device)
    load_start = os.getloadavg()
    start = time.perf_counter()
    raw = launch(plan)
    report = {
        "command": " ".join(["python -m workshop_lib.bench", *(argv or sys.argv[1:])]),
        "setup": {"device": device.type, "backend": hardware.backend_for(device),
                  "world_size": plan.world_size, "world_sizes": list(plan.world_sizes),
                  "threads_per_process": 1 if device.type == "cpu" else 0,
                  "dataset": plan.dataset, "epoch_samples": plan.epoch_samples or None,
                  "rounds": plan.rounds, "quick": args.quick,
                  "window_s": plan.window_s,
                  "configs": [asdict(c) for c in plan.configs]},
        "hardware": hardware.describe(),
        **analyse(raw, plan),
        "load_average": {"start": load_start, "end": os.getloadavg()},
        "wall_s": time.perf_counter() - start,
    }
    print(format_report(report), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
