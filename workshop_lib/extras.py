"""Three things learners ask for next, each measured in one torchrun launch (notebook 03).

- Gradient accumulation with ``no_sync``: k micro-batches, one all-reduce, the same
  update as one k-times larger batch.
- Mixed precision: bf16 autocast against fp32, samples/s and loss.
- SyncBatchNorm: BatchNorm statistics over the global batch instead of each rank's own
  (CUDA only); on a CPU the demo measures how far apart the ranks' statistics drift,
  which is the problem SyncBatchNorm removes.

    torchrun --standalone --nproc-per-node=2 -m workshop_lib.extras --out extras.json
"""
import argparse
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

from workshop_lib import data, hardware, models


def small_model(info, batch_norm):
    torch.manual_seed(0)
    return models.SmallCNN(info.in_channels, info.num_classes, width=16, batch_norm=batch_norm)


def count_allreduces(model):
    """Count the gradient all-reduces DDP launches, with a communication hook."""
    calls = {"n": 0}

    def hook(state, bucket):
        calls["n"] += 1
        return default_hooks.allreduce_hook(state, bucket)

    model.register_comm_hook(dist.group.WORLD, hook)
    return calls


def accumulate_once(x, y, info, device, micro_batches, use_no_sync):
    """One optimizer step over ``micro_batches`` micro-batches, from a fresh model."""
    model = DDP(small_model(info, batch_norm=False).to(device))
    calls = count_allreduces(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    chunks = list(zip(x.chunk(micro_batches), y.chunk(micro_batches), strict=True))
    hardware_sync(device)
    start = time.perf_counter()
    for i, (xb, yb) in enumerate(chunks):
        last = i == len(chunks) - 1
        # no_sync() skips the all-reduce: gradients add up locally until the last
        # micro-batch, whose backward all-reduces the accumulated sum once.
        with model.no_sync() if use_no_sync and not last else contextlib.nullcontext():
            (F.cross_entropy(model(xb), yb) / micro_batches).backward()
    optimizer.step()
    hardware_sync(device)
    return time.perf_counter() - start, calls["n"], list(model.module.parameters())


def accumulation(x, y, info, device, micro_batches=4, repeats=5):
    """Accumulate with and without no_sync (median of ``repeats``); compare with one batch."""
    results = {}
    for name, use_no_sync in (("all_reduce_every_micro_batch", False), ("no_sync", True)):
        runs = [accumulate_once(x, y, info, device, micro_batches, use_no_sync)
                for _ in range(repeats)]
        results[name] = {"median_seconds": statistics.median(r[0] for r in runs),
                         "allreduce_calls": runs[0][1]}
        params = runs[0][2]
    big = DDP(small_model(info, batch_norm=False).to(device))
    optimizer = torch.optim.SGD(big.parameters(), lr=0.1)
    F.cross_entropy(big(x), y).backward()
    optimizer.step()
    difference = max((a - b).abs().max().item()
                     for a, b in zip(params, big.module.parameters(), strict=True))
    return {**results, "micro_batches": micro_batches, "repeats": repeats,
            "max_abs_difference_vs_one_big_batch": difference}


def mixed_precision(x, y, info, device, steps=20):
    """Throughput and final loss of the same steps in fp32 and under bf16 autocast."""
    results = {}
    for name, dtype in (("fp32", None), ("bf16_autocast", torch.bfloat16)):
        model = DDP(small_model(info, batch_norm=True).to(device))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        hardware_sync(device)
        start = time.perf_counter()
        for _ in range(steps):
            autocast = (torch.autocast(device.type, dtype=dtype) if dtype
                        else contextlib.nullcontext())
            with autocast:
                loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        hardware_sync(device)
        seconds = time.perf_counter() - start
        results[name] = {"samples_per_s": steps * len(y) * dist.get_world_size() / seconds,
                         "final_loss": loss.item()}
    return results


def sync_batchnorm(x, y, info, device, steps=5):
    """Per-rank BatchNorm running means: how far apart they drift, and SyncBatchNorm's fix."""
    model = small_model(info, batch_norm=True)
    supported = device.type == "cuda"
    if supported:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    # No buffer sync before each forward: each rank keeps its own statistics, to see them.
    model = DDP(model.to(device), forward_sync_buffers=False)
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


def hardware_sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=128, help="per process")
    parser.add_argument("--out", help="write the results as JSON to this file (rank 0)")
    args = parser.parse_args(argv)
    local_rank = int(os.environ["LOCAL_RANK"])
    local_world_size = int(os.environ["LOCAL_WORLD_SIZE"])
    device = hardware.pick_device("auto", local_rank, local_world_size)
    hardware.configure_cpu_threads(device, local_world_size)
    dist.init_process_group(hardware.backend_for(device))
    try:
        rank = dist.get_rank()
        train_set, _, info = data.load("digits")
        sampler = DistributedSampler(train_set, dist.get_world_size(), rank, seed=0)
        idx = torch.tensor(list(sampler)[:args.batch_size])
        x, y = (t[idx].to(device) for t in train_set.tensors)
        results = {"device": str(device), "world_size": dist.get_world_size(),
                   "batch_size": args.batch_size,
                   "accumulation": accumulation(x, y, info, device),
                   "mixed_precision": mixed_precision(x, y, info, device),
                   "batchnorm": sync_batchnorm(x, y, info, device)}
        if rank == 0:
            print(json.dumps(results, indent=2))
            if args.out:
                with open(args.out, "w") as f:
                    json.dump(results, f)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
