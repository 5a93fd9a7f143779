"""The measurements one process takes alone: loop overhead, the data path (in memory, a
DataLoader, record shards), and the step in fp32, bf16, fp16 and with gradient
checkpointing.

Rank 0 runs these after the process group has been left, while the other ranks have
exited: no rank waits in a collective for minutes of single-process work (with Wide
ResNet 16-10 on GPUs these sections outlast any sensible collective timeout).
"""
import copy
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

from workshop_lib import data, hardware, memory, scaling, shards, train
from workshop_lib.precision import PLAIN, Precision
from workshop_lib.stopwatch import Stopwatch
from workshop_lib.train import train_step  # the step learners run, timed as it is


def alone(plan, device, train_set, info):
    """Loop overhead for every config, and the data path for the course's step."""
    started = time.perf_counter()
    # These windows are whole epochs: --quick cuts the epoch short.
    epoch_set = train_set if not plan.epoch_samples else TensorDataset(
        *(t[:plan.epoch_samples] for t in train_set.tensors))
    results = {"loop_overhead": {
        config.name: loop_overhead(plan, device, epoch_set, info, config)
        for config in plan.configs}}
    log(f"loop overhead done ({time.perf_counter() - started:.0f} s)")
    with tempfile.TemporaryDirectory(prefix="bench-shards-") as scratch:
        results["data_path"] = data_path(plan, device, epoch_set, info, plan.configs[0],
                                         scratch)
    log(f"data path done ({time.perf_counter() - started:.0f} s)")
    results["precision"] = {config.name: precision(plan, device, train_set, info, config)
                            for config in plan.configs if config.name in plan.precision_configs}
    log(f"precision and checkpointing done ({time.perf_counter() - started:.0f} s)")
    return results


def log(message):
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def interleaved_epochs(plan, device, loops, samples_per_epoch):
    """Time each of ``loops`` (one epoch per call), alternating, for ``plan.rounds`` rounds."""
    epochs = {}
    for name, epoch in loops.items():
        epoch()  # warm-up
        with Stopwatch(device) as watch:
            epoch()
        epochs[name] = max(1, round(plan.window_s / watch.seconds))
    seconds = {name: [] for name in loops}
    # This process's CPU time too: against the wall time it says how much of the window
    # other work on the machine took from it.
    cpu_seconds = {name: [] for name in loops}
    names = list(loops)
    for r in range(plan.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            cpu_start = time.process_time()
            with Stopwatch(device) as watch:
                for _ in range(epochs[name]):
                    loops[name]()
            seconds[name].append(watch.seconds)
            cpu_seconds[name].append(time.process_time() - cpu_start)
    return {name: {"seconds": seconds[name], "cpu_seconds": cpu_seconds[name],
                   "samples": epochs[name] * samples_per_epoch} for name in loops}


def loop_overhead(plan, device, epoch_set, info, config):
    """train.train_epoch with a TensorLoader against the bare minimum, same batches."""
    b = config.batch_size
    library_model = config.build(info).to(device)
    bare_model = copy.deepcopy(library_model)
    generator = torch.Generator().manual_seed(0)
    loader = data.TensorLoader(epoch_set, b, RandomSampler(epoch_set, generator=generator),
                               device)
    library_optimizer = config.optimizer(library_model)
    # The schedule train.py builds: a warmup epoch, then cosine decay.
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        library_optimizer, lambda step: scaling.lr_factor(step, len(loader), 10**6))
    bare_optimizer = config.optimizer(bare_model)
    # The bare loop's data: one shuffled copy on the device, cut into the same batch
    # sizes once, outside the clock.
    order = torch.randperm(len(epoch_set), generator=generator).to(device)
    bare_batches = list(zip(loader.x[order].split(b), loader.y[order].split(b), strict=True))

    def library_epoch():
        train.train_epoch(library_model, loader, library_optimizer, scheduler, PLAIN,
                          accumulate=1, progress=False)

    def bare_epoch():
        for x, y in bare_batches:
            train_step(bare_model, bare_optimizer, x, y)

    loops = {"library": library_epoch, "bare": bare_epoch}
    return interleaved_epochs(plan, device, loops, samples_per_epoch=len(epoch_set))


SHARDS = 8  # the data path's record shards (notebook 06's default)


def data_path(plan, device, epoch_set, info, config, scratch):
    """Device-resident TensorLoader against a DataLoader with workers and against the
    record shards' reader (the same samples as WebDataset shards in ``scratch``): training
    fed by each, and each loader alone (batches moved to the device, no training)."""
    b, workers = config.batch_size, plan.loader_workers
    skipped = shards_skipped()
    if skipped is None:
        samples = list(zip(*epoch_set.tensors, strict=True))
        split = shards.Split(Path(scratch), "train",
                             tuple(shards.write(samples, scratch, SHARDS, "train")))
        shard_loader = shards.ShardLoader(shards.ShardSchedule(split, 0, 1, seed=0), b, device)
    else:
        log(skipped)
    model = config.build(info).to(device)
    optimizer = config.optimizer(model)
    tensor_loader = data.TensorLoader(
        epoch_set, b, RandomSampler(epoch_set, generator=torch.Generator().manual_seed(0)),
        device)
    # Workers forked, as a training script started by torchrun on Linux gets them (this
    # spawned process would default to spawn, whose workers import torch afresh).
    context = "fork" if workers and "fork" in multiprocessing.get_all_start_methods() else None
    data_loader = DataLoader(
        epoch_set, b, shuffle=True, num_workers=workers,
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
    if skipped is None:
        loops["train/shard_loader"] = lambda: train_on(shard_loader)
        loops["load/shard_loader"] = lambda: load_only(shard_loader)
    timings = interleaved_epochs(plan, device, loops, samples_per_epoch=len(epoch_set))
    return {"timings": timings, "workers": workers, "worker_startup_s": startup_s,
            "skipped": skipped}


def shards_skipped():
    """Why the record shards' part of the data path cannot run here (one line), or None:
    it needs webdataset, which a GPU image with torch alone lacks."""
    try:
        import webdataset  # noqa: F401 - only whether it imports
    except ImportError:
        return ("data path: record shards skipped, webdataset is not installed "
                "(pip install webdataset, or make setup)")
    return None


# (name, --amp, gradient checkpointing): the worked example's memory and speed levers.
PRECISION_VARIANTS = (("fp32", "off", False), ("bf16", "bf16", False), ("fp16", "fp16", False),
                      ("fp32 checkpointed", "off", True))


def step_memory(model, optimizer, batch, precision, device):
    """Bytes one step saves for backward, and (GPU) its peak allocation above what was
    allocated before it."""
    saved = memory.SavedForBackward(model)
    hardware.synchronize(device)
    before = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    memory.reset_peak(device)
    with saved:
        train_step(model, optimizer, *batch, precision)
    hardware.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before if device.type == "cuda" else None
    return saved.bytes, peak


def precision(plan, device, train_set, info, config):
    """The step in each of PRECISION_VARIANTS, interleaved round by round, and its memory."""
    loader = data.TensorLoader(
        train_set, config.batch_size,
        RandomSampler(train_set, generator=torch.Generator().manual_seed(0)), device,
        drop_last=True)
    batches = list(loader)[:8]  # the same few batches for every variant
    steps, saved, peak = {}, {}, {}
    for name, amp, checkpointed in PRECISION_VARIANTS:
        model = config.build(info, grad_checkpointing=checkpointed).to(device)
        optimizer, mode = config.optimizer(model), Precision(amp, device)
        saved[name], peak[name] = step_memory(model, optimizer, batches[0], mode, device)
        cycle = iter(range(10**12))

        def step(model=model, optimizer=optimizer, mode=mode, cycle=cycle):
            train_step(model, optimizer, *batches[next(cycle) % len(batches)], mode)

        steps[name] = step
    timings = interleaved_epochs(plan, device, steps, samples_per_epoch=config.batch_size)
    return {"timings": timings, "saved_bytes": saved, "peak_bytes": peak}
