"""What one all-reduce costs: a fixed latency, plus the bytes over a bandwidth.

Every all-reduce pays a start-up cost whatever its size (a round
trip between the ranks; on a GPU also a kernel launch), then moves its bytes: a ring
all-reduce sends and receives ``2(N-1)/N`` of them on every rank. So

    time(bytes) = latency + 2(N-1)/N x bytes / bus bandwidth

and a model's gradients sent as ``k`` buckets cost ``k`` latencies plus the same bandwidth
term however they are split: that is the whole case for buckets, and for not making them
so large that the first one waits for the end of backward. ``sweep`` times all-reduces of
sizes from 1 KB up on the default group's ranks; ``fit`` fits the two terms; ``model_s``
and ``predicted_s`` price one message and a list of buckets.

The one cost model of the course, below everything that uses it: the bench fits it to its
own sweep, the trace sets a step's exposed communication against it, notebook 07 plots it
beside the bucket-size sweep, and the findings price buckets with it.
"""
import math

import torch
import torch.distributed as dist

from workshop_lib.stopwatch import Stopwatch, summary

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
            with Stopwatch(device) as watch:
                dist.all_reduce(buffer)
            seconds.append(watch.seconds)
        slowest = torch.tensor(seconds, dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # each repetition: the slowest rank
        rows.append({"bytes": nbytes, "seconds": summary(slowest.tolist())})
    return rows


def floor_s(world_size, nbytes, bus_bandwidth_gb_s):
    """The ring all-reduce's bandwidth term: each rank sends and receives 2(N-1)/N of the
    data. 0 when no bandwidth was resolved (``fit`` gives None): the sweep saw none."""
    if bus_bandwidth_gb_s is None:
        return 0.0
    return 2 * (world_size - 1) / world_size * nbytes / (bus_bandwidth_gb_s * 1e9)


def fit(rows, world_size):
    """``time(bytes) = latency + 2(N-1)/N * bytes / bus bandwidth``, fitted by least squares
    to the sweep's median times, each size weighted by 1/time^2.

    The weights make it a fit of relative errors: unweighted, the largest messages (a
    quarter of a second at 256 MB) would decide both terms, and the latency, a fraction
    of a millisecond, would be whatever their noise left. A negative latency (noise at
    the small sizes) is fitted again as zero. A sweep whose times do not grow with size
    (noise larger than the bandwidth term, as on shared CPU cores) resolves no bandwidth:
    ``bus_bandwidth_gb_s`` is None, and the latency is the weighted mean time, never a
    negative bandwidth. ``bandwidth_text`` says which.
    """
    x = [2 * (world_size - 1) / world_size * row["bytes"] for row in rows]
    t = [row["seconds"]["median"] for row in rows]
    w = [1 / ti**2 for ti in t]
    sw, swx, swt = sum(w), sum(wi * xi for wi, xi in zip(w, x, strict=True)), \
        sum(wi * ti for wi, ti in zip(w, t, strict=True))
    swxx = sum(wi * xi * xi for wi, xi in zip(w, x, strict=True))
    swxt = sum(wi * xi * ti for wi, xi, ti in zip(w, x, t, strict=True))
    seconds_per_byte = (sw * swxt - swx * swt) / (sw * swxx - swx**2)
    latency = (swt - seconds_per_byte * swx) / sw
    if seconds_per_byte <= 0:  # no growth with size: a constant time fits best
        latency, seconds_per_byte = swt / sw, 0.0
    elif latency < 0:
        latency, seconds_per_byte = 0.0, swxt / swxx
    errors = [(latency + seconds_per_byte * xi - ti) / ti for xi, ti in zip(x, t, strict=True)]
    return {"latency_s": latency,
            "bus_bandwidth_gb_s": 1 / seconds_per_byte / 1e9 if seconds_per_byte else None,
            "relative_rms_error": math.sqrt(sum(e * e for e in errors) / len(errors)),
            "sizes": len(rows)}


def bandwidth_text(fitted, spec=".2f"):
    """The fitted bus bandwidth in words: "3.00 GB/s", or that the sweep resolved none."""
    if fitted["bus_bandwidth_gb_s"] is None:
        return "not resolved (the sweep's times did not grow with size)"
    return f"{fitted['bus_bandwidth_gb_s']:{spec}} GB/s"


def model_s(fitted, world_size, nbytes):
    """The fitted model's two terms, and their sum, for one all-reduce of ``nbytes``."""
    bandwidth = floor_s(world_size, nbytes, fitted["bus_bandwidth_gb_s"])
    return {"latency_s": fitted["latency_s"], "bandwidth_s": bandwidth,
            "total_s": fitted["latency_s"] + bandwidth}


def predicted_s(fitted, world_size, bucket_bytes):
    """Seconds the fitted model gives for all-reducing buckets of ``bucket_bytes`` (a list)
    one after the other: one latency per bucket, plus the bandwidth term of all the bytes."""
    return sum(model_s(fitted, world_size, nbytes)["total_s"]
               for nbytes in bucket_bytes)
