"""Where a step's time goes, read off a profiler trace: compute, communication, overlap.

The input is the ``traceEvents`` list of a Chrome/Perfetto trace that ``torch.profiler``
exported (``trace_rank{r}.json``); nothing here runs a model. Each profiled step is a
``record_function`` span named ``course step N`` on the training thread (category
``user_annotation``). On GPUs Kineto also mirrors every such span onto each GPU stream that
ran its work, as ``gpu_user_annotation`` events of the same name (torch 2.14's
``torch/profiler/_cupti/monitor_trace.py``): those are not steps, and only the host's span
counts. A trace of another program (no ``course step`` spans) is read step by step along
the profiler's own ``ProfilerStep#N`` spans, one per ``prof.step()``; their GPU work counts
by when it ran, inside the host's span (the course's spans end with a synchronize, so
they hold exactly their step's work; a ``ProfilerStep`` does not wait for its kernels,
and some of them run in the next one's span). Within a step:

- **communication**: the collectives. On a CPU (gloo) the training thread only launches
  each one (``c10d::allreduce_``, a fraction of a millisecond); ProcessGroupGloo runs it
  on one of its ``pt_gloo_runloop`` threads inside a ``gloo:all_reduce`` span (``gloo:``
  plus the collective's name), until the reduced result is in place, waiting for the
  other ranks included. A collective counts from its launch to the end of that span
  and, where the training thread sat blocked in its ``wait()`` (no operator of its own
  running), on until that thread's next operator: waking up and being scheduled again
  is part of what the step waited for. On GPUs (NCCL) the collective is a CUDA kernel on
  NCCL's own stream, ``ncclDevKernel_AllReduce_Sum_f32_RING_LL(...)`` (``ncclKernel_...``
  before NCCL 2.19), from the moment the stream starts it, waiting for the peers
  included; the CPU side shows only its launch (``nccl:all_reduce``, ``c10d::allreduce_``,
  ``record_param_comms``), which is not counted.
- **compute**: on a CPU, every operator the training thread runs (forward, backward,
  DDP's gradient copies, the optimizer) except those launches; on GPUs, every other
  kernel, copy and memset on the device.
- **overlapped**: communication time during which compute was running; **exposed**:
  communication time with no compute beside it (the step waited for it).

``other = step - compute - exposed`` is what neither covers: Python between operators,
and on a busy machine the training thread waiting for a core. On GPUs it is the time the
GPU ran nothing of the step (``gpu_idle_ms``): before its first kernel and in the gaps
between kernels, while the CPU was still launching them. A step whose GPU sits idle for
more than ``LAUNCH_BOUND`` of it is **launch-bound**: the CPU cannot issue kernels as
fast as the GPU runs them (small kernels on a fast GPU), and the step's time is the
host's, not the GPU's. Intervals are in the trace's microseconds; the step figures are in
milliseconds.
"""
import statistics

STEP_PREFIX = "course step "
PROFILER_STEP_PREFIX = "ProfilerStep#"  # torch.profiler's span for each prof.step()
HOST_SPAN = "user_annotation"  # record_function on the host ("gpu_user_annotation": mirrors)
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
NCCL_KERNEL_PREFIXES = ("ncclDevKernel_", "ncclKernel_")
# What the training thread runs to start a collective: c10d's dispatcher op, the backends'
# spans, and the communication record NCCL adds for the profiler.
LAUNCH_PREFIXES = ("c10d::", "gloo:", "nccl:", "record_param_comms")
LAUNCH_BOUND = 0.5  # a GPU step idle for more than this share of it is launch-bound


# -- Interval arithmetic on (start, end) pairs -------------------------------------------


def merge(intervals):
    """The union of ``intervals`` as sorted, disjoint (start, end) pairs."""
    merged = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def length(intervals):
    """Total length of merged intervals."""
    return sum(end - start for start, end in intervals)


def intersect(a, b):
    """The parts of merged ``a`` that merged ``b`` also covers."""
    result, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            result.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return result


def subtract(a, b):
    """The parts of merged ``a`` that merged ``b`` does not cover."""
    result = []
    for start, end in a:
        cursor = start
        for b_start, b_end in b:
            if b_end <= cursor or b_start >= end:
                continue
            if b_start > cursor:
                result.append((cursor, b_start))
            cursor = max(cursor, b_end)
        if cursor < end:
            result.append((cursor, end))
    return result


def clip(intervals, start, end):
    """``intervals`` cut to the window [start, end]."""
    return merge((max(s, start), min(e, end)) for s, e in intervals)


# -- From profiler events to step figures ------------------------------------------------


def span(event):
    return event["ts"], event["ts"] + event["dur"]


def is_nccl_kernel(event):
    return event.get("cat") == "kernel" and event["name"].startswith(NCCL_KERNEL_PREFIXES)


def is_launch(event):
    return event["name"].startswith(LAUNCH_PREFIXES)


def complete_events(events):
    """The events with a duration (``"ph": "X"``): operators, spans, kernels."""
    return [e for e in events if e.get("ph") == "X" and "dur" in e]


def step_spans(events):
    """The host's ``course step N`` spans in order or, in a trace with none, its
    ``ProfilerStep#N`` spans; [] when it has neither."""
    host_spans = [e for e in complete_events(events) if e.get("cat") == HOST_SPAN]
    for prefix in (STEP_PREFIX, PROFILER_STEP_PREFIX):
        steps = [e for e in host_spans if e["name"].startswith(prefix)]
        if steps:
            return sorted(steps, key=lambda e: e["ts"])
    return []


def step_number(span_event):
    """N of ``course step N`` or ``ProfilerStep#N``."""
    name = span_event["name"]
    prefix = STEP_PREFIX if name.startswith(STEP_PREFIX) else PROFILER_STEP_PREFIX
    return int(name[len(prefix):])


def on_device(events):
    """Whether the trace holds GPU activity (then compute and communication are kernels)."""
    return any(e.get("cat") in DEVICE_CATEGORIES for e in events)


def step_intervals(events, step):
    """Compute and communication intervals of one ``course step`` span, clipped to it, and
    the number of collectives in it."""
    start, end = span(step)
    inside = [e for e in complete_events(events) if e is not step
              and e["ts"] < end and e["ts"] + e["dur"] > start]
    if on_device(events):
        device = [e for e in inside if e.get("cat") in DEVICE_CATEGORIES]
        communication = [span(e) for e in device if is_nccl_kernel(e)]
        compute = [span(e) for e in device if not is_nccl_kernel(e)]
        collectives = len(communication)
    else:
        thread = [e for e in inside if (e.get("pid"), e.get("tid")) == (step.get("pid"),
                                                                          step.get("tid"))]
        launches = [e for e in thread if e["name"].startswith("c10d::")]
        works = [e for e in inside if e["name"].startswith("gloo:") and e not in thread]
        ops = merge(span(e) for e in thread if not e["name"].startswith(
            (STEP_PREFIX, PROFILER_STEP_PREFIX)))
        compute = subtract(ops, merge(span(e) for e in thread if is_launch(e)))
        communication = in_flight(launches, works, ops) + [
            span(e) for e in thread if is_launch(e)]
        collectives = max(len(launches), len(works))
    return clip(compute, start, end), clip(communication, start, end), collectives


def in_flight(launches, works, ops):
    """Each collective as the training thread lives it: from its launch, through its work
    on a gloo thread, until the training thread runs again if it sat waiting for it.

    The k-th launch is the k-th work to start (gloo's queue is first in, first out); the
    time between them is the work waiting for a gloo thread to pick it up. ``ops``: the
    training thread's merged operator intervals; where none covers the work's end, the
    thread was blocked in the collective's ``wait()`` and the collective lasts until the
    thread's next operator (the time it took to be woken and scheduled again).
    """
    launches = sorted(launches, key=lambda e: e["ts"])
    first = launches[0]["ts"] if launches else float("-inf")
    works = sorted((e for e in works if e["ts"] >= first), key=lambda e: e["ts"])
    intervals = []
    for i, work in enumerate(works):
        start, end = span(work)
        if i < len(launches):
            start = launches[i]["ts"]
        if not any(s <= end < e for s, e in ops):
            end = min((s for s, _ in ops if s >= end), default=end)
        intervals.append((start, end))
    return intervals


def step_figures(compute, communication, start, end):
    """Milliseconds of a step from its merged compute and communication intervals (us)."""
    overlapped = intersect(communication, compute)
    exposed = subtract(communication, compute)
    step_us = end - start
    return {
        "step_ms": step_us / 1e3,
        "compute_ms": length(compute) / 1e3,
        "communication_ms": length(communication) / 1e3,
        "overlapped_ms": length(overlapped) / 1e3,
        "exposed_ms": length(exposed) / 1e3,
        "other_ms": (step_us - length(compute) - length(exposed)) / 1e3,
    }


def relative_ms(intervals, origin):
    return [[round((s - origin) / 1e3, 4), round((e - origin) / 1e3, 4)] for s, e in intervals]


def analyse_trace(events):
    """One dict per step span (``step_spans``): its figures, its start (trace
    microseconds) and its compute, communication and exposed intervals in ms from the
    step's start."""
    steps = []
    gpu = on_device(events)
    for step in step_spans(events):
        start, end = span(step)
        compute, communication, collectives = step_intervals(events, step)
        figures = step_figures(compute, communication, start, end)
        if gpu:  # what the GPU ran none of: compute and exposed communication leave it
            figures["gpu_idle_ms"] = figures["other_ms"]
        steps.append({
            "step": step_number(step),
            "start_us": start,
            **figures,
            "collectives": collectives,
            "intervals": {
                "compute": relative_ms(compute, start),
                "communication": relative_ms(communication, start),
                "exposed": relative_ms(subtract(communication, compute), start),
            },
        })
    return steps


FIGURES = ("step_ms", "measured_ms", "compute_ms", "communication_ms", "overlapped_ms",
           "exposed_ms", "other_ms", "gpu_idle_ms")


def launch_bound(figures):
    """Whether a step (or a rank's median step) on a GPU left the GPU idle for more than
    ``LAUNCH_BOUND`` of it; False on a CPU, which has no such gaps to read."""
    idle = figures.get("gpu_idle_ms")
    return idle is not None and idle > LAUNCH_BOUND * figures["step_ms"]


def rank_totals(steps):
    """Per rank: the median of each figure over its steps, and how well compute plus
    exposed communication account for the measured step (their ratio, per step)."""
    totals = {key: statistics.median(s[key] for s in steps) for key in FIGURES
              if all(key in s for s in steps)}
    ratios = [(s["compute_ms"] + s["exposed_ms"]) / s["measured_ms"] for s in steps]
    totals["accounted"] = {"median": statistics.median(ratios), "min": min(ratios),
                           "max": max(ratios), "n": len(ratios)}
    return totals
