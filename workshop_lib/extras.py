"""Three things learners ask for next, each measured in one torchrun launch (notebook 03).

- Gradient accumulation with ``no_sync``: k micro-batches, one all-reduce, the same
  update as one k-times larger batch.
- Mixed precision: bf16 autocast against fp32, samples/s and loss.
- SyncBatchNorm: BatchNorm statistics over the global batch instead of each rank's own
  (CUDA only); on a CPU the demo measures how far apart the ranks' statistics drift,
  which is the problem SyncBatchNorm removes.

Every timing starts after warm-up steps (DDP builds its buckets, cuDNN picks its
kernels, the allocator fills its cache) and ends after the GPU is synchronized. On GPUs
the model is the profile's Wide ResNet in ``channels_last`` memory format, where bf16
Tensor Cores have work to do; on a CPU the small CNN.

    torchrun --standalone --nproc-per-node=2 -m workshop_lib.extras --out extras.json
"""
import contextlib
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler

from workshop_lib import cli, data, distributed, hardware, models
from workshop_lib.errors import CourseError, exit_cleanly_on_course_error

WARMUP_STEPS = 3


def build_model(info, device, batch_norm=True):
    """The model timed here: the small CNN on a CPU, Wide ResNet 16-4 on a GPU."""
    torch.manual_seed(0)
    if device.type == "cuda" and batch_norm:
        model = models.build("wrn-16-4", info).to(device, memory_format=torch.channels_last)
    else:
        model = models.SmallCNN(info.in_channels, info.num_classes, width=16,
                                batch_norm=batch_norm).to(device)
    return model


def wrap(model, device):
    return DDP(model, device_ids=[device] if device.type == "cuda" else None)


def count_allreduces(model):
    """Count the gradient all-reduces DDP launches, with a communication hook."""
    calls = {"n": 0}

    def hook(state, bucket):
        calls["n"] += 1
        return default_hooks.allreduce_hook(state, bucket)

    model.register_comm_hook(dist.group.WORLD, hook)
    return calls


def accumulation_step(model, optimizer, chunks, use_no_sync):
    """One optimizer step over the micro-batches ``chunks``."""
    optimizer.zero_grad(set_to_none=True)
    for i, (xb, yb) in enumerate(chunks):
        last = i == len(chunks) - 1
        # no_sync() skips the all-reduce: gradients add up locally until the last
        # micro-batch, whose backward all-reduces the accumulated sum once.
        with model.no_sync() if use_no_sync and not last else contextlib.nullcontext():
            (F.cross_entropy(model(xb), yb) / len(chunks)).backward()
    optimizer.step()


def accumulation(x, y, info, device, micro_batches=4, repeats=5):
    """Accumulate with and without no_sync, on one DDP model, alternating the two paths
    (median of ``repeats`` each, after warm-up); compare with one big batch."""
    model = wrap(build_model(info, device, batch_norm=False), device)
    calls = count_allreduces(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # timing only: no change
    chunks = list(zip(x.chunk(micro_batches), y.chunk(micro_batches), strict=True))
    paths = {"all_reduce_every_micro_batch": False, "no_sync": True}
    for use_no_sync in list(paths.values()) * WARMUP_STEPS:
        accumulation_step(model, optimizer, chunks, use_no_sync)
    seconds = {name: [] for name in paths}
    counts = {}
    for _ in range(repeats):
        for name, use_no_sync in paths.items():
            hardware.synchronize(device)
            before, start = calls["n"], time.perf_counter()
            accumulation_step(model, optimizer, chunks, use_no_sync)
            hardware.synchronize(device)
            seconds[name].append(time.perf_counter() - start)
            counts[name] = calls["n"] - before
    results = {name: {"median_seconds": statistics.median(seconds[name]),
                      "allreduce_calls": counts[name]} for name in paths}

    # Equal to one big batch: the same fresh model, once with accumulation, once not.
    stepped = {}
    for name, micro in (("accumulated", micro_batches), ("one_big_batch", 1)):
        fresh = wrap(build_model(info, device, batch_norm=False), device)
        accumulation_step(fresh, torch.optim.SGD(fresh.parameters(), lr=0.1),
                          list(zip(x.chunk(micro), y.chunk(micro), strict=True)), True)
        stepped[name] = list(fresh.module.parameters())
    difference = max((a - b).abs().max().item() for a, b in
                     zip(stepped["accumulated"], stepped["one_big_batch"], strict=True))
    return {**results, "micro_batches": micro_batches, "repeats": repeats,
            "max_abs_difference_vs_one_big_batch": difference}


def precision_step(model, optimizer, x, y, dtype):
    """One training step, under autocast to ``dtype`` (None: plain fp32)."""
    with torch.autocast(x.device.type, dtype=dtype) if dtype else contextlib.nullcontext():
        loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss


def mixed_precision(x, y, info, device, steps=20):
    """Throughput and final loss of the same steps in fp32 and under bf16 autocast."""
    if device.type == "cuda":
        x = x.contiguous(memory_format=torch.channels_last)
    results = {}
    for name, dtype in (("fp32", None), ("bf16_autocast", torch.bfloat16)):
        model = wrap(build_model(info, device), device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        for _ in range(WARMUP_STEPS):
            precision_step(model, optimizer, x, y, dtype)
        hardware.synchronize(device)
        start = time.perf_counter()
        for _ in range(steps):
            loss = precision_step(model, optimizer, x, y, dtype)
        hardware.synchronize(device)
        seconds = time.perf_counter() - start
        results[name] = {"samples_per_s": steps * len(y) * dist.get_world_size() / seconds,
                         "final_loss": loss.item()}
    return {**results, "steps": steps, "warmup_steps": WARMUP_STEPS}


def sync_batchnorm(x, y, info, device, steps=5):
    """Per-rank BatchNorm running means: how far apart they drift, and SyncBatchNorm's fix."""
    model = models.SmallCNN(info.in_channels, info.num_classes, width=16)
    supported = device.type == "cuda"
    if supported:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    # No buffer sync before each forward: each rank keeps its own statistics, to see them.
    model = DDP(model.to(device), device_ids=[device] if supported else None,
                forward_sync_buffers=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(steps):
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    first_bn = next(m for m in model.modules()
                    if isinstance(m, torch.nn.modules.batchnorm._BatchNorm))
    mean = first_bn.running_mean.clone()
    gathered = [torch.empty_like(mean) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mean)
    spread = max((g - gathered[0]).abs().max().item() for g in gathered)
    return {"sync_batchnorm_used": supported, "running_mean_spread_across_ranks": spread}


def measure(args, device):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    train_set, _, info = data.load(args.dataset, args.data_dir)
    sampler = DistributedSampler(train_set, world_size, rank, seed=0)
    idx = torch.tensor(list(sampler)[:args.batch_size])
    x, y = (t[idx].to(device) for t in train_set.tensors)
    return {"device": str(device), "world_size": world_size, "batch_size": args.batch_size,
            "dataset": info.name, "model": type(build_model(info, device)).__name__,
            "accumulation": accumulation(x, y, info, device),
            "mixed_precision": mixed_precision(x, y, info, device),
            "batchnorm": sync_batchnorm(x, y, info, device)}


@exit_cleanly_on_course_error
def main(argv=None):
    parser = cli.ArgumentParser(prog="torchrun ... -m workshop_lib.extras", description=__doc__)
    parser.add_argument("--batch-size", type=int, default=128, help="per process")
    parser.add_argument("--dataset", default="digits", choices=data.DATASET_CHOICES)
    parser.add_argument("--data-dir", default=data.DEFAULT_DATA_DIR)
    parser.add_argument("--device", default="auto", type=hardware.device_flag)
    parser.add_argument("--out", help="write the results as JSON to this file (rank 0)")
    args = parser.parse_args(argv)
    if "LOCAL_RANK" not in os.environ:
        raise CourseError("extras runs under torchrun: torchrun --standalone "
                          "--nproc-per-node=2 -m workshop_lib.extras [flags]")
    if args.batch_size < 4:
        raise CourseError(f"--batch-size must be at least 4 (four micro-batches), got "
                          f"{args.batch_size}")
    local_rank, local_world_size = int(os.environ["LOCAL_RANK"]), \
        int(os.environ["LOCAL_WORLD_SIZE"])
    device = hardware.pick_device(args.device, local_rank, local_world_size)
    hardware.configure_cpu_threads(device)
    with distributed.process_group(hardware.backend_for(device), device=device):
        results = measure(args, device)
        if dist.get_rank() == 0:
            print(json.dumps(results, indent=2))
            if args.out:
                with open(args.out, "w") as f:
                    json.dump(results, f)


if __name__ == "__main__":
    main()
