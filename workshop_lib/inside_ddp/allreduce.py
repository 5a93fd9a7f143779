"""What one all-reduce costs: a fixed latency, plus the bytes over a bandwidth.

Notebook 07, "Inside DDP", section 5 ("What overlap and buckets buy") plots this beside
the bucket-size sweep. Every all-reduce pays a start-up cost whatever its size (a round
trip between the ranks; on a GPU also a kernel launch), then moves its bytes: a ring
all-reduce sends and receives ``2(N-1)/N`` of them on every rank. So

    time(bytes) = latency + 2(N-1)/N x bytes / bus bandwidth

and a model's gradients sent as ``k`` buckets cost ``k`` latencies plus the same bandwidth
term however they are split: that is the whole case for buckets, and for not making them
so large that the first one waits for the end of backward. ``sweep`` times all-reduces of
sizes from 1 KB up on the default group's ranks; ``fit`` fits the two terms (the bench's
own fit, ``bench.analyse.fit_allreduce``); ``predicted_s`` prices a list of buckets.
"""
import time

import torch
import torch.distributed as dist

from workshop_lib import hardware
from workshop_lib.bench.analyse import allreduce_model_s, fit_allreduce, summary

SIZES = tuple(2**k for k in range(10, 23, 2))  # 1 KB ... 4 MB, every factor of 4


def sweep(device, sizes=SIZES, reps=30, warmup=3):
    """Seconds per all-reduce of each size in ``sizes`` (bytes of float32), the slowest
    rank's, ``reps`` times each after ``warmup`` untimed ones (a collective: every rank
    calls it and gets the same rows ``{"bytes", "seconds": {median, min, max, n}}``)."""
    rows = []
    for nbytes in sizes:
        # Zeros: a sum of zeros never overflows over the repetitions.
        buffer = torch.zeros(nbytes // 4, device=device)
        flag = torch.zeros(1, device=device)
        for _ in range(warmup):  # connections, buffers
            dist.all_reduce(buffer)
        seconds = []
        for _ in range(reps):
            dist.all_reduce(flag)  # every rank starts the timed one together
            hardware.synchronize(device)
            start = time.perf_counter()
            dist.all_reduce(buffer)
            hardware.synchronize(device)
            seconds.append(time.perf_counter() - start)
        slowest = torch.tensor(seconds, dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # each repetition: the slowest rank
        rows.append({"bytes": nbytes, "seconds": summary(slowest.tolist())})
    return rows


def fit(rows, world_size):
    """``{"latency_s", "bus_bandwidth_gb_s", "relative_rms_error", "sizes"}``."""
    return fit_allreduce(rows, world_size)


def predicted_s(fitted, world_size, bucket_bytes):
    """Seconds the fitted model gives for all-reducing buckets of ``bucket_bytes`` (a list)
    one after the other: one latency per bucket, plus the bandwidth term of all the bytes."""
    return sum(allreduce_model_s(fitted, world_size, nbytes)["total_s"]
               for nbytes in bucket_bytes)
