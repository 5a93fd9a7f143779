"""The step timeline: interval arithmetic and event reading on hand-built traces and on
real traces of multi-GPU jobs (tests/fixtures/kineto), the summary, its table and plot,
the command's errors, and one real 2-rank CPU run (slow).

The hand-built traces below follow the shape ``torch.profiler`` exports in torch 2.14: on
a CPU the training thread launches ``c10d::allreduce_`` and a ``pt_gloo_runloop``
thread runs ``gloo:all_reduce``; on GPUs NCCL's all-reduce is a ``ncclDevKernel_...``
kernel on its own stream. Times are in microseconds, as in the trace files.
"""
import gzip
import hashlib
import json

import matplotlib
import numpy as np
import pytest

import workshop_lib.trace.__main__ as command
from conftest import REPO, run_course_command
from workshop_lib import plots
from workshop_lib.trace import timeline

matplotlib.use("Agg")

TRAIN, GLOO = 1, 2  # thread ids: the training thread, a gloo worker thread


def op(name, start, end, tid=TRAIN, cat="cpu_op", pid=100):
    return {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid, "ts": start,
            "dur": end - start}


def step(n, start, end):
    return op(f"{timeline.STEP_PREFIX}{n}", start, end, cat="user_annotation")


def test_interval_arithmetic():
    a = timeline.merge([(5, 8), (0, 2), (1, 3), (8, 9), (4, 4)])
    assert a == [(0, 3), (5, 9)]  # overlapping and touching intervals join; empty ones go
    assert timeline.length(a) == 7
    b = [(2, 6)]
    assert timeline.intersect(a, b) == [(2, 3), (5, 6)]
    assert timeline.subtract(a, b) == [(0, 2), (6, 9)]
    assert timeline.subtract(b, a) == [(3, 5)]
    assert timeline.intersect(a, []) == [] and timeline.subtract(a, []) == a
    assert timeline.clip([(0, 3), (5, 9)], 1, 6) == [(1, 3), (5, 6)]
    # Every part of a is either covered by b or not.
    assert timeline.length(timeline.intersect(a, b)) + timeline.length(
        timeline.subtract(a, b)) == timeline.length(a)


def cpu_step():
    """One DDP step on a CPU: forward, backward, one bucket's all-reduce launched at the
    end of backward, the training thread blocked until it is done, then the optimizer."""
    return [
        step(0, 0, 10_000),
        op("DistributedDataParallel.forward", 100, 4_000, cat="user_annotation"),
        op("aten::conv2d", 200, 3_000),  # nested inside the forward: counted once
        op("autograd::engine::evaluate_function: ConvolutionBackward0", 4_000, 7_000),
        op("c10d::allreduce_", 7_000, 7_100),
        op("gloo:all_reduce", 7_300, 9_000, tid=GLOO, cat="user_annotation"),
        # The thread runs again 200 us after the work ended: waking up is the collective's.
        op("torch.distributed.ddp.reducer::copy_bucket_to_grad", 9_200, 9_300),
        op("Optimizer.step#SGD.step", 9_300, 9_800, cat="user_annotation"),
    ]


def test_cpu_step_blocked_on_its_all_reduce():
    [figures] = timeline.analyse_trace(cpu_step())
    assert figures["step"] == 0 and figures["collectives"] == 1
    assert figures["step_ms"] == pytest.approx(10.0)
    assert figures["compute_ms"] == pytest.approx((7_000 - 100 + 9_800 - 9_200) / 1e3)
    # From the launch to the thread's next operator; nothing computed meanwhile.
    assert figures["communication_ms"] == pytest.approx((9_200 - 7_000) / 1e3)
    assert figures["overlapped_ms"] == 0
    assert figures["exposed_ms"] == pytest.approx(2.2)
    assert figures["other_ms"] == pytest.approx(0.1 + 0.2)  # before the forward, at the end
    assert figures["intervals"]["exposed"] == [[7.0, 9.2]]
    assert figures["intervals"]["compute"][0] == [0.1, 7.0]


def test_cpu_all_reduce_hidden_behind_backward():
    """A first bucket launched mid-backward runs beside it: overlapped, not exposed."""
    events = cpu_step() + [
        op("c10d::allreduce_", 5_000, 5_050),  # inside the backward operator
        op("gloo:all_reduce", 5_100, 6_500, tid=GLOO, cat="user_annotation"),
    ]
    [figures] = timeline.analyse_trace(events)
    assert figures["collectives"] == 2
    # The launch is communication, carved out of the backward operator around it.
    assert figures["compute_ms"] == pytest.approx((7_000 - 100 - 50 + 600) / 1e3)
    assert figures["overlapped_ms"] == pytest.approx((6_500 - 5_050) / 1e3)
    assert figures["exposed_ms"] == pytest.approx(0.05 + 2.2)
    assert figures["communication_ms"] == pytest.approx(
        figures["overlapped_ms"] + figures["exposed_ms"])


def test_a_work_waiting_for_a_gloo_thread_counts_from_its_launch():
    events = [step(0, 0, 1_000), op("aten::mm", 0, 100), op("c10d::allreduce_", 100, 110),
              op("gloo:all_reduce", 600, 700, tid=GLOO, cat="user_annotation"),
              op("aten::copy_", 700, 800)]
    [figures] = timeline.analyse_trace(events)
    assert figures["exposed_ms"] == pytest.approx(0.6)  # 100..700: queued, then the work


def gpu_step_events():
    nccl = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    return [
        step(0, 0, 10_000),
        op("aten::conv2d", 0, 300),  # host launches: not the GPU's compute
        op("nccl:all_reduce", 300, 320),
        op("void cudnn::conv_kernel", 1_000, 5_000, tid=7, cat="kernel", pid=0),
        op(nccl, 4_000, 6_000, tid=20, cat="kernel", pid=0),
        op("nccl:all_reduce", 4_000, 6_000, tid=20, cat="gpu_user_annotation", pid=0),
        op("Memcpy DtoD", 6_500, 7_000, tid=7, cat="gpu_memcpy", pid=0),
        op("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", 8_000, 8_500, tid=20,
           cat="kernel", pid=0),  # NCCL before 2.19 names its kernels so
        op("void later_kernel", 11_000, 12_000, tid=7, cat="kernel", pid=0),  # next step
    ]


def test_gpu_step_reads_kernels_and_nccl():
    [figures] = timeline.analyse_trace(gpu_step_events())
    assert figures["collectives"] == 2
    assert figures["compute_ms"] == pytest.approx(4.0 + 0.5)
    assert figures["communication_ms"] == pytest.approx(2.0 + 0.5)
    assert figures["overlapped_ms"] == pytest.approx(1.0)
    assert figures["exposed_ms"] == pytest.approx(1.0 + 0.5)


def test_a_gpu_step_whose_kernels_leave_gaps_is_launch_bound():
    """The GPU idle between kernels (nothing of the step running on it) is the step's
    ``gpu_idle_ms``; more than half the step idle makes it launch-bound."""
    [busy] = timeline.analyse_trace(gpu_step_events())
    assert busy["gpu_idle_ms"] == pytest.approx(10.0 - 6.0)  # 1..6, 6.5..7, 8..8.5 ms ran
    assert not timeline.launch_bound(busy)
    # The same work in short kernels launched far apart: the GPU waits for the CPU.
    nccl = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    sparse = [step(0, 0, 10_000), op("aten::conv2d", 0, 300),
              *(op("void small_kernel", t, t + 200, tid=7, cat="kernel", pid=0)
                for t in range(500, 9_000, 1_000)),
              op(nccl, 9_000, 9_500, tid=20, cat="kernel", pid=0)]
    [gappy] = timeline.analyse_trace(sparse)
    assert gappy["gpu_idle_ms"] == pytest.approx(10.0 - 9 * 0.2 - 0.5)
    assert timeline.launch_bound(gappy)
    # A CPU step has no GPU to sit idle: never launch-bound, whatever its gaps.
    cpu = [step(0, 0, 10_000), op("aten::conv2d", 0, 1_000)]
    [figures] = timeline.analyse_trace(cpu)
    assert "gpu_idle_ms" not in figures and not timeline.launch_bound(figures)


def with_gpu_mirrors(events):
    """``events`` plus what Kineto adds on GPUs: each host span (``user_annotation``)
    mirrored onto every GPU stream that ran work inside it, as a ``gpu_user_annotation``
    of the same name from that stream's first to its last piece of work there. (Kineto
    mirrors each kernel's innermost span only; mirroring every enclosing one too is the
    harder case.)"""
    device = [e for e in events if e.get("cat") in timeline.DEVICE_CATEGORIES]
    mirrors = []
    for host in (e for e in events if e.get("cat") == "user_annotation"):
        start, end = timeline.span(host)
        streams = {}
        for e in device:
            if start <= e["ts"] < end:
                streams.setdefault((e["pid"], e["tid"]), []).append(timeline.span(e))
        for (pid, tid), spans in sorted(streams.items()):
            mirrors.append({"ph": "X", "cat": "gpu_user_annotation", "name": host["name"],
                            "pid": pid, "tid": tid, "ts": min(s for s, _ in spans),
                            "dur": max(e for _, e in spans) - min(s for s, _ in spans)})
    return events + mirrors


def test_gpu_step_spans_mirrored_on_the_streams_count_once():
    """On GPUs each ``course step`` span is mirrored onto the compute stream and NCCL's
    stream: still one step, with the same figures."""
    events = with_gpu_mirrors(gpu_step_events())
    mirrors = [e for e in events if e["cat"] == "gpu_user_annotation"
               and e["name"].startswith(timeline.STEP_PREFIX)]
    assert {e["tid"] for e in mirrors} == {7, 20}  # the compute stream and NCCL's
    assert timeline.analyse_trace(events) == timeline.analyse_trace(gpu_step_events())


def test_steps_are_separate_and_in_order():
    second = [dict(e, ts=e["ts"] + 20_000) for e in cpu_step()]
    second[0]["name"] = f"{timeline.STEP_PREFIX}1"
    steps = timeline.analyse_trace(second + cpu_step())
    assert [s["step"] for s in steps] == [0, 1]
    assert steps[0]["exposed_ms"] == pytest.approx(steps[1]["exposed_ms"])
    assert steps[1]["start_us"] - steps[0]["start_us"] == 20_000


# -- Real traces of multi-GPU jobs (tests/fixtures/kineto/README.md) ---------------------

KINETO = REPO / "tests/fixtures/kineto"
# trace: (its ProfilerStep numbers, NCCL kernels inside them), counted once by hand
REAL_TRACES = {"ddp_2gpu_rank0_nccl_data": ([4, 5, 6], 21),
               "sampled_128gpu_rank0": ([551, 552], 10),
               "sampled_128gpu_rank1": ([551, 552], 10)}


def real_trace(name):
    with gzip.open(KINETO / f"{name}.json.gz") as f:
        return json.load(f)["traceEvents"]


def swept_figures(events, start, end):
    """The step's figures another way: cut the step at every device event's start and
    end, and look at what runs in each piece (numpy, no interval arithmetic)."""
    device = [e for e in events if e.get("ph") == "X" and "dur" in e
              and e.get("cat") in timeline.DEVICE_CATEGORIES
              and e["ts"] < end and e["ts"] + e["dur"] > start]
    nccl = np.array([timeline.is_nccl_kernel(e) for e in device])
    starts = np.clip([e["ts"] for e in device], start, end)
    ends = np.clip([e["ts"] + e["dur"] for e in device], start, end)
    cuts = np.unique(np.concatenate([starts, ends, [start, end]]))
    middles, widths = (cuts[:-1] + cuts[1:]) / 2, np.diff(cuts)
    running = (starts[:, None] <= middles) & (middles < ends[:, None])  # event x piece
    communicating, computing = running[nccl].any(axis=0), running[~nccl].any(axis=0)
    return {"compute_ms": widths[computing].sum() / 1e3,
            "communication_ms": widths[communicating].sum() / 1e3,
            "overlapped_ms": widths[communicating & computing].sum() / 1e3,
            "exposed_ms": widths[communicating & ~computing].sum() / 1e3,
            "collectives": int(nccl.sum())}


def test_the_real_traces_are_the_upstream_files():
    readme = (KINETO / "README.md").read_text()
    for name in REAL_TRACES:
        digest = hashlib.sha256((KINETO / f"{name}.json.gz").read_bytes()).hexdigest()
        assert f"{digest}  {name}.json.gz" in readme


@pytest.mark.parametrize("name", REAL_TRACES)
def test_real_multi_gpu_traces_read_step_by_step(name):
    """Steps from the profiler's ProfilerStep spans (no course spans there), each counted
    once; compute, NCCL and their overlap as a sweep over the device events finds them."""
    events = real_trace(name)
    numbers, nccl_kernels = REAL_TRACES[name]
    assert sum(timeline.is_nccl_kernel(e) for e in events) == nccl_kernels
    steps = timeline.analyse_trace(events)
    assert [s["step"] for s in steps] == numbers
    assert sum(s["collectives"] for s in steps) == nccl_kernels
    for figures, span in zip(steps, timeline.step_spans(events), strict=True):
        start, end = timeline.span(span)
        expected = swept_figures(events, start, end)
        assert figures["collectives"] == expected.pop("collectives")
        for key, value in expected.items():
            assert figures[key] == pytest.approx(value, abs=1e-6), key
        assert figures["compute_ms"] + figures["exposed_ms"] + figures["other_ms"] == \
            pytest.approx(figures["step_ms"])
        assert 0 < figures["overlapped_ms"] < figures["communication_ms"] < figures["step_ms"]


def test_a_real_ddp_trace_written_as_the_course_writes_it():
    """The DDP trace with its steps named as the course names them, and mirrored onto the
    GPU streams as Kineto mirrors them: the same three steps, the same figures."""
    events = real_trace("ddp_2gpu_rank0_nccl_data")
    renamed = [dict(e, name=e["name"].replace(timeline.PROFILER_STEP_PREFIX,
                                               timeline.STEP_PREFIX))
               if e.get("cat") == "user_annotation" else e for e in events]
    course = with_gpu_mirrors(renamed)
    assert sum(e.get("cat") == "gpu_user_annotation" and e["name"].startswith(
        timeline.STEP_PREFIX) for e in course) > 3  # mirrored on several streams
    assert timeline.analyse_trace(course) == timeline.analyse_trace(events)


def test_two_real_ranks_summarise_on_their_common_clock():
    """Two ranks of one real job through the command's summary: one origin for both."""
    args = command.parse_args(["--model", "cnn", "--batch-size", "32", "--steps", "2"])
    records = []
    for rank in (0, 1):
        steps = [dict(s, measured_ms=s["step_ms"])
                 for s in timeline.analyse_trace(real_trace(f"sampled_128gpu_rank{rank}"))]
        records.append({"rank": rank, "trace": f"rank{rank}", "unprofiled_step_ms": 600.0,
                        "facts": {"parameters": 0, "gradient_bytes": 0, "dataset": "real"},
                        "steps": steps})
    summary = command.summarise(records, args, command.hardware.pick_device("cpu"), 2, 1)
    firsts = [r["steps"][0]["start_ms"] for r in summary["ranks"]]
    assert firsts[0] == 0 and firsts[1] == pytest.approx(0.192)  # 192 us apart
    assert summary["accounted"]["n"] == 4


def steps_with(measured_ms):
    return [{"step": i, "start_us": 1e6 + i * 20_000, "step_ms": m, "measured_ms": m,
             "compute_ms": m * 0.7, "communication_ms": m * 0.3, "overlapped_ms": 0.0,
             "exposed_ms": m * 0.25, "other_ms": m * 0.05, "collectives": 1,
             "intervals": {"compute": [[0.0, m * 0.7]], "communication": [[m * 0.7, m]],
                           "exposed": [[m * 0.75, m]]}}
            for i, m in enumerate(measured_ms)]


def hand_summary():
    args = command.parse_args(["--model", "cnn", "--batch-size", "32", "--steps", "3"])
    args.dataset = "digits"
    records = [{"rank": r, "trace": f"trace_rank{r}.json", "unprofiled_step_ms": 9.0,
                "facts": {"parameters": 94_000, "gradient_bytes": 376_000,
                          "dataset": "digits"},
                "steps": steps_with([10.0, 12.0, 11.0])} for r in (0, 1)]
    records[1]["steps"] = [dict(s, start_us=s["start_us"] + 500) for s in records[1]["steps"]]
    return command.summarise(records, args, command.hardware.pick_device("cpu"), 2, 1)


def test_summary_medians_and_common_origin():
    summary = hand_summary()
    assert [r["rank"] for r in summary["ranks"]] == [0, 1]
    first = summary["ranks"][1]["steps"][0]
    assert first["start_ms"] == pytest.approx(0.5)  # rank 1 started 500 us after rank 0
    assert "start_us" not in first
    median = summary["ranks"][0]["median"]
    assert median["measured_ms"] == 11.0 and median["compute_ms"] == pytest.approx(7.7)
    assert median["accounted"]["median"] == pytest.approx(0.95)
    assert summary["accounted"] == {"median": pytest.approx(0.95), "min": pytest.approx(0.95),
                                    "max": pytest.approx(0.95), "n": 6}
    assert summary["setup"]["gradient_bytes"] == 376_000


def test_table_shows_every_step_and_the_consistency(tmp_path):
    summary = hand_summary()
    table = command.format_summary(summary, tmp_path)
    assert table.startswith("workshop_lib.trace: cpu, gloo, 2 rank(s), cnn on digits")
    for rank in summary["ranks"]:
        for s in rank["steps"]:
            assert any(f"{s['measured_ms']:.2f}" in line and f"{s['exposed_ms']:.2f}" in line
                       for line in table.splitlines())
    assert "0.95 [0.95..0.95] over n=6 steps" in table
    assert str(tmp_path / "trace_rank1.json") in table


def test_the_timeline_plot_draws_compute_and_exposed_all_reduces():
    summary = hand_summary()
    ax = plots.plot_step_timeline(summary, steps=2)
    # Per rank and step: one compute, one communication and one exposed bar collection.
    assert len(ax.collections) == 2 * 2 * 3
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 1", "rank 0"]
    assert "exposed" in " ".join(t.get_text() for t in ax.get_legend().get_texts())
    matplotlib.pyplot.close(ax.figure)


@pytest.mark.parametrize("flags, message", [
    (["--steps", "0"], "--steps must be positive"),
    (["--warmup", "-1"], "--warmup must be 0 or more"),
    (["--model", "resnet"], "unknown model 'resnet'"),
    (["--amp", "fp8"], "invalid choice"),
    (["--no-such-flag"], "unrecognized arguments"),
])
def test_bad_flags_give_one_error_line(flags, message, capsys):
    with pytest.raises(SystemExit) as stop:
        command.main(flags)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and len(err.strip().splitlines()) == 1


def test_outside_torchrun_says_how_to_launch(monkeypatch, capsys):
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(SystemExit) as stop:
        command.main(["--out", "unused"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "torchrun" in err and len(err.splitlines()) == 1


@pytest.mark.slow
def test_two_cpu_ranks_write_traces_and_a_consistent_summary(tmp_path):
    out = tmp_path / "trace"
    result = run_course_command(
        ["torchrun", "--standalone", "--nproc-per-node=2", "-m", "workshop_lib.trace",
         "--out", str(out), "--steps", "4", "--warmup", "3", "--device", "cpu"],
        timeout=300, env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / command.SUMMARY_NAME).read_text())
    assert [r["rank"] for r in summary["ranks"]] == [0, 1]
    for rank in summary["ranks"]:
        trace = json.loads((out / rank["trace"]).read_text())["traceEvents"]
        names = {e.get("name") for e in trace}
        assert {"gloo:all_reduce", "c10d::allreduce_"} <= names  # what the summary reads
        assert [s["step"] for s in rank["steps"]] == [0, 1, 2, 3]
        for s in rank["steps"]:
            assert s["collectives"] >= 1 and s["compute_ms"] > 0 and s["exposed_ms"] >= 0
            assert s["overlapped_ms"] + s["exposed_ms"] == pytest.approx(
                s["communication_ms"], abs=1e-3)
            # The span in the trace holds the clock around the step (the trace's times are
            # to the microsecond) and little more: entering and leaving the span, and on a
            # loaded machine whatever ran meanwhile (a CI run saw 46.4 ms against 43.1).
            assert s["measured_ms"] <= s["step_ms"] + 0.01, s
            assert s["step_ms"] <= 1.5 * s["measured_ms"] + 1.0, s
        # Compute plus exposed communication account for the measured step (the rest is
        # Python between operators, and the machine's other work).
        assert 0.8 <= rank["median"]["accounted"]["median"] <= 1.2, rank["median"]
    assert "compute + exposed communication over the measured step" in result.stdout
    # The floor: all-reduces timed on the same ranks up to the gradients' size, fitted.
    floor = summary["floor"]
    gradient_bytes = summary["setup"]["gradient_bytes"]
    assert floor["sweep"][-1]["bytes"] == floor["gradient_bytes"] >= gradient_bytes
    # A timed sweep on shared cores can fall with size (noise): its fit is checked for
    # form here; the arithmetic, with known timings, in tests/test_bench_analysis.py.
    bandwidth = floor["fit"]["bus_bandwidth_gb_s"]  # timed: resolved and positive, or None
    assert len(floor["sweep"]) >= 3 and (bandwidth is None or bandwidth > 0)
    assert floor["floor_ms"] > 0 and "the all-reduce floor for" in result.stdout



@pytest.mark.parametrize("gpus, processes", [(1, 1), (4, 4), (8, 2)])
def test_trace_on_gpus_takes_the_gpu_profiles_sizes_for_its_processes(monkeypatch, gpus,
                                                                      processes):
    """`trace --device cuda` on a one-GPU machine used to take the sizes of the profile's
    two-process default, which runs its launches on the CPU (the CPU profile's CNN on
    digits at batch 32): the sizes now come from the GPU profile for the trace's own
    processes, whose launches run on the GPUs."""
    import argparse

    import torch

    from workshop_lib import hardware, profile
    from workshop_lib.trace.__main__ import course_defaults

    monkeypatch.setattr(hardware, "detect", lambda: hardware.Machine(gpus=gpus, cpu_cores=8))
    consulted = []
    real = profile.get_profile
    monkeypatch.setattr(profile, "get_profile",
                        lambda *a, **k: consulted.append(real(*a, **k)) or consulted[-1])
    args = argparse.Namespace(dataset="digits", data_dir=None, model=None, batch_size=None)
    course_defaults(args, torch.device("cuda", 0), processes)
    (used,) = consulted
    assert (used.name, used.device, used.nproc) == ("gpu", "cuda", processes)
    assert (args.model, args.batch_size) == (used.model, used.batch_size)
