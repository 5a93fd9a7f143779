"""One rank's part: train a few warm-up steps, profile the next ones, write the trace.

The step is the course's own, ``train.train_step`` on a model wrapped by
``train_ddp.wrap``, with the optimizer ``train_ddp.py`` builds by default; only the
profiler and a ``course step N`` span around each step are added.
"""
import contextlib
import os
import statistics
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils.data.distributed import DistributedSampler

from workshop_lib import data, models, optim, train_ddp
from workshop_lib.errors import CourseError
from workshop_lib.precision import Precision
from workshop_lib.stopwatch import Stopwatch
from workshop_lib.trace.timeline import STEP_PREFIX
from workshop_lib.train import train_step  # the step learners run, profiled as it is


def batches(train_set, batch_size, device, rank, world_size):
    """Full batches of this rank's shard, epoch after epoch (reshuffled as the scripts do)."""
    sampler = DistributedSampler(train_set, world_size, rank, shuffle=True, seed=0)
    loader = data.TensorLoader(train_set, batch_size, sampler, device, drop_last=True)
    if len(loader) == 0:
        raise CourseError(f"--batch-size {batch_size} is larger than a rank's {len(sampler)} "
                          f"samples; use a smaller --batch-size")
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def timed_steps(model, optimizer, batch_iter, precision, device, steps, profiled):
    """Seconds of each of ``steps`` steps; with ``profiled``, each inside a span."""
    seconds = []
    for i in range(steps):
        x, y = next(batch_iter)  # outside the clock: loading is not the step
        span = record_function(f"{STEP_PREFIX}{i}") if profiled else contextlib.nullcontext()
        # The span closes after the stopwatch's synchronise: it ends when the GPU's work does.
        with span, Stopwatch(device) as watch:
            train_step(model, optimizer, x, y, precision)
        seconds.append(watch.seconds)
    return seconds


def profile_steps(args, device, rank, world_size, out):
    """Warm up, profile ``args.steps`` DDP steps into ``out/trace_rank{rank}.json``, then
    time as many unprofiled steps. Returns the trace path, the model's facts, and the
    seconds of the profiled and unprofiled steps."""
    train_set, _, info = data.load(args.dataset, args.data_dir)
    torch.manual_seed(0)
    model = train_ddp.wrap(models.build(args.model, info).to(device), device)
    optimizer = optim.build("sgd", model.parameters(), optim.LR, optim.MOMENTUM,
                            optim.WEIGHT_DECAY)
    precision = Precision(args.amp, device)
    batch_iter = batches(train_set, args.batch_size, device, rank, world_size)
    # Warm-up: DDP rebuilds its buckets after the first step; allocators and gloo's
    # connections settle.
    timed_steps(model, optimizer, batch_iter, precision, device, args.warmup, profiled=False)
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    else:
        # Without a GPU, kineto (the profiler's engine) logs "ERROR: gpuGetDeviceCount
        # failed" on every rank; nothing is wrong. Its log level is read when it starts.
        os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    with profile(activities=activities) as profiler:
        profiled = timed_steps(model, optimizer, batch_iter, precision, device, args.steps,
                               profiled=True)
    path = Path(out) / f"trace_rank{rank}.json"
    profiler.export_chrome_trace(str(path))
    # The same steps without the profiler: what its own cost adds to the figures.
    unprofiled = timed_steps(model, optimizer, batch_iter, precision, device, args.steps,
                             profiled=False)
    facts = {"parameters": models.count_parameters(model.module),
             "gradient_bytes": sum(p.numel() * p.element_size()
                                   for p in model.module.parameters() if p.requires_grad),
             "dataset": info.name}
    return path, facts, profiled, statistics.median(unprofiled)
