"""The bench's arithmetic and its table, on hand-built timings: no process, no model run.

The fake machine below has known costs (a step's time is proportional to its batch, DDP
makes it 1.25x slower, no_sync 1.05x, no_sync plus a one-float all-reduce 1.15x, DDP's
defaults 1.5x, each trial its own factor; an all-reduce is a latency plus bytes over a
bandwidth) and a load that changes from round to round, hitting every window of a round
alike. Each figure the analysis reports is checked against what those costs imply.
"""
import pytest

from workshop_lib import allreduce_model
from workshop_lib.bench import analyse, plan, report
from workshop_lib.bench.plan import (
    BUFFER_SYNC,
    COURSE,
    FLAT,
    KB,
    MB,
    NO_SYNC,
    SYNC,
    StepConfig,
)

LOAD = (1.0, 1.5, 0.8)  # the machine's slowdown in each round
SECONDS_PER_SAMPLE = 1e-4
# A step at N > 1 against one process, by variant; and with each trial, as DDP, under
# no_sync and with the one-float all-reduce.
COST = {COURSE: 1.25, NO_SYNC: 1.05, SYNC: 1.15, FLAT: 1.2, BUFFER_SYNC: 1.5}
TRIAL_COST = {"grad_view": (1.2, 1.05, 1.15), "static_graph": (1.3, 1.05, 1.15),
              "small_buckets": (1.25, 1.05, 1.16), "accumulate_4": (1.1, 1.0, 1.04),
              "pinned": (1.12, 1.0, 1.08), "gloo_lo_1_thread": (1.26, 1.05, 1.2)}
STEPS = 10  # per window
LATENCY_S, LINK_BYTES_PER_S = 1e-4, 1e9
PRECISION = {"fp32": (0.1, 4 * MB, None), "bf16": (0.08, 2 * MB, None),
             "fp16": (2.0, 2 * MB, None), "fp32 checkpointed": (0.13, 1 * MB, None)}


def make_plan(world_size=2):
    return plan.Plan(
        device_type="cpu", world_size=world_size,
        world_sizes=tuple(w for w in (1, 2) if w <= world_size), dataset="digits",
        data_dir="unused", epoch_samples=0,
        configs=(StepConfig("course", "cnn", 32), StepConfig("scaling", "cnn", 128)),
        rounds=len(LOAD), window_s=0.1, warmup_steps=1,
        allreduce_sizes=tuple(KB * 4**k for k in range(6)), allreduce_budget_s=0.1,
        allreduce_min_reps=3, loader_workers=2, timeout_s=60,
        trials=(plan.TRIALS + plan.CPU_TRIALS) if world_size > 1 else (),
        precision_configs=("course",))


def step_s(window):
    if window.world_size == 1:
        cost = 1.0
    elif window.trial_name:
        cost = TRIAL_COST[window.trial_name][(COURSE, NO_SYNC, SYNC).index(window.variant)]
    else:
        cost = COST[window.variant]
    return window.batch_size * SECONDS_PER_SAMPLE * cost


def epoch_timings(seconds_per_epoch, samples=1000, on_cpu=1.0):
    return {"seconds": [seconds_per_epoch * load for load in LOAD],
            "cpu_seconds": [seconds_per_epoch * load * on_cpu for load in LOAD],
            "samples": samples}


def fake_raw(bench_plan, on_cpu=1.0):
    windows = plan.scaling_windows(bench_plan)
    allreduce = {str(w): [{"bytes": b, "seconds": [(LATENCY_S + b / LINK_BYTES_PER_S) * load
                                                     for load in LOAD]}
                          for b in bench_plan.allreduce_sizes]
                 for w in bench_plan.world_sizes[1:]}
    return {
        "allreduce": allreduce,
        "windows": {w.key: [STEPS * step_s(w) * load for load in LOAD] for w in windows},
        "steps": {w.key: STEPS for w in windows},
        "loop_overhead": {c.name: {"library": epoch_timings(0.105, on_cpu=on_cpu),
                                   "bare": epoch_timings(0.1, on_cpu=on_cpu)}
                          for c in bench_plan.configs},
        "data_path": {"workers": 2, "worker_startup_s": 0.1, "timings": {
            "train/tensor_loader": epoch_timings(0.1), "train/data_loader": epoch_timings(0.12),
            "load/tensor_loader": epoch_timings(0.001), "load/data_loader": epoch_timings(0.05),
            "train/shard_loader": epoch_timings(0.2), "load/shard_loader": epoch_timings(0.1)}},
        "precision": {"course": {
            "timings": {name: epoch_timings(s) for name, (s, _, _) in PRECISION.items()},
            "saved_bytes": {name: b for name, (_, b, _) in PRECISION.items()},
            "peak_bytes": {name: p for name, (_, _, p) in PRECISION.items()}}},
        **({"inside_ddp": fake_inside_ddp(bench_plan.world_size)}
           if bench_plan.world_size > 1 else {}),
    }


INSIDE_MS = {"local": 10.0, "naive": 14.0, "overlap": 12.5, "buckets": 11.0, "ddp": 11.2,
             "buckets_4096": 13.0, "buckets_1048576": 11.0}
INSIDE_MESSAGES = {"buckets_4096": [4096] * 20 + [40], "buckets_1048576": [380000, 40]}


def fake_inside_ddp(world_size):
    """What ``inside_ddp.timing.measure`` returns."""
    return {"world_size": world_size, "batch_size": 32, "dataset": "digits",
            "gradient_bytes": 380000, "rounds": len(LOAD), "steps_per_window": 5,
            "messages": INSIDE_MESSAGES,
            "step_ms": {name: {"median": ms, "min": ms * 0.9, "max": ms * 1.2, "n": len(LOAD)}
                        for name, ms in INSIDE_MS.items()}}


def constant(stats, value, windows_per_round=1):
    """Every round gave ``value``: the load hit both sides of the ratio alike."""
    assert stats["n"] == windows_per_round * len(LOAD)
    for key in ("median", "min", "max"):
        assert stats[key] == pytest.approx(value), (key, stats)


def test_scaling_efficiency_is_the_step_cost_of_ddp():
    figures = analyse.analyse(fake_raw(make_plan()), make_plan())
    rows = {(r["config"], r["mode"], r["world_size"]): r for r in figures["scaling"]}
    assert len(rows) == 2 * 2 * 2
    for (_, mode, w), row in rows.items():
        constant(row["speedup"], 1.0 if w == 1 else w / COST[COURSE])
        constant(row["efficiency"], 1.0 if w == 1 else 1 / COST[COURSE])
        batch = row["batch_size"]
        assert row["samples_per_s"]["median"] == pytest.approx(
            batch * w / (batch * SECONDS_PER_SAMPLE * (COST[COURSE] if w > 1 else 1)))
        assert (row["predicted_efficiency"] is None) == (w == 1 or mode == "strong")
    assert rows["scaling", "strong", 1]["batch_size"] == 2 * rows["scaling", "strong", 2][
        "batch_size"]


def test_exposed_communication_and_the_buffer_sync_row():
    bench_plan = make_plan()
    figures = analyse.analyse(fake_raw(bench_plan), bench_plan)
    scaling = {(r["config"], r["mode"], r["world_size"]): r for r in figures["scaling"]}
    for row in figures["communication"]["exposed"]:
        one_step = row["batch_size"] * SECONDS_PER_SAMPLE
        assert row["ddp_step_s"]["median"] == pytest.approx(one_step * COST[COURSE])
        assert row["no_sync_step_s"]["max"] == pytest.approx(one_step * COST[NO_SYNC] * max(LOAD))
        assert row["exposed_s"]["median"] == pytest.approx(one_step * (COST[COURSE] -
                                                                       COST[NO_SYNC]))
        constant(row["exposed_fraction"], 1 - COST[NO_SYNC] / COST[COURSE])
        constant(row["no_sync_efficiency"], 1 / COST[NO_SYNC])
        constant(row["buffer_sync_slowdown"], COST[BUFFER_SYNC] / COST[COURSE])
        assert row["buffer_sync_step_s"]["median"] == pytest.approx(one_step * COST[BUFFER_SYNC])
        # The floor: the fitted all-reduce (exactly the fake link) at the gradients' size.
        floor = row["floor"]
        assert floor["latency_s"] == pytest.approx(LATENCY_S)
        assert floor["bandwidth_s"] == pytest.approx(row["gradient_bytes"] / LINK_BYTES_PER_S)
        assert row["floor_s"] == pytest.approx(floor["latency_s"] + floor["bandwidth_s"])
        assert row["bus_bandwidth_gb_s"] == pytest.approx(LINK_BYTES_PER_S / 1e9)
        weak = scaling[row["config"], "weak", 2]
        # DDP's host work: the no_sync step among 2 over a step alone, in the prediction.
        host = one_step * (COST[NO_SYNC] - 1)
        assert weak["host_overhead_s"] == pytest.approx(host)
        assert weak["predicted_efficiency"] == pytest.approx(
            one_step / (one_step + row["floor_s"] + host))


def test_exposed_communication_split_into_sync_latency_bandwidth_and_the_rest():
    bench_plan = make_plan()
    figures = analyse.analyse(fake_raw(bench_plan), bench_plan)
    for row in figures["communication"]["exposed"]:
        one_step = row["batch_size"] * SECONDS_PER_SAMPLE
        one_float = one_step * (COST[SYNC] - COST[NO_SYNC])
        exposed = one_step * (COST[COURSE] - COST[NO_SYNC])
        bandwidth = row["gradient_bytes"] / LINK_BYTES_PER_S
        assert row["one_float_allreduce_s"]["median"] == pytest.approx(one_float)
        assert row["flat_allreduce_s"]["median"] == pytest.approx(
            one_step * (COST[FLAT] - COST[NO_SYNC]))
        split = row["breakdown"]
        assert split["sync_s"]["median"] == pytest.approx(one_float - LATENCY_S)
        assert split["latency_s"] == pytest.approx(LATENCY_S)
        assert split["bandwidth_s"] == pytest.approx(bandwidth)
        assert split["unaccounted_s"]["median"] == pytest.approx(exposed - one_float - bandwidth)
        # The four terms add up to the exposed communication (at the median round).
        assert (split["sync_s"]["median"] + split["latency_s"] + split["bandwidth_s"]
                + split["unaccounted_s"]["median"]) == pytest.approx(exposed)
        # The flat all-reduce splits the rest into a large message's cost and DDP's own.
        flat = one_step * (COST[FLAT] - COST[NO_SYNC])
        assert split["large_message_s"]["median"] == pytest.approx(flat - one_float - bandwidth)
        assert split["ddp_own_s"]["median"] == pytest.approx(exposed - flat)
        assert split["large_message_s"]["median"] + split["ddp_own_s"]["median"] == \
            pytest.approx(split["unaccounted_s"]["median"])
        target = one_float + 2 * bandwidth
        assert row["target"]["exposed_at_most_s"] == pytest.approx(target)
        assert row["target"]["met"] == (exposed <= target)
    # The fake's numbers put the two configs on either side of the target.
    assert [r["target"]["met"] for r in figures["communication"]["exposed"]] == [True, False]


def test_the_allreduce_fit_recovers_latency_and_bandwidth():
    rows = [{"bytes": b, "seconds": {"median": 2e-4 + 1.5 * b / 3e9}}
            for b in (KB * 4**k for k in range(8))]
    fit = allreduce_model.fit(rows, world_size=4)  # 2(N-1)/N = 1.5
    assert fit["latency_s"] == pytest.approx(2e-4)
    assert fit["bus_bandwidth_gb_s"] == pytest.approx(3.0)
    assert fit["relative_rms_error"] == pytest.approx(0, abs=1e-9)
    assert fit["sizes"] == 8
    model = allreduce_model.model_s(fit, 4, 3e9)
    assert model == {"latency_s": pytest.approx(2e-4), "bandwidth_s": pytest.approx(1.5),
                     "total_s": pytest.approx(1.5 + 2e-4)}
    # Times that a negative latency would fit best: the fit goes through zero instead.
    for row in rows:
        row["seconds"]["median"] = 1.5 * row["bytes"] / 3e9 - 1e-7
    fit = allreduce_model.fit(rows, world_size=4)
    assert fit["latency_s"] == 0 and fit["bus_bandwidth_gb_s"] > 0
    assert allreduce_model.bandwidth_text(fit).endswith(" GB/s")


def test_a_sweep_that_does_not_grow_with_size_resolves_no_bandwidth():
    """Shared cores can time 1 KiB slower than 64 KiB (a fresh-clone run did: 2.3 ms against
    less at every larger size). Its least-squares slope is negative; the fit says it
    resolved no bandwidth, and every printed line says so, instead of a negative GB/s."""
    times = [2.3e-3, 0.9e-3, 0.8e-3, 0.85e-3]
    rows = [{"bytes": KB * 4**k, "seconds": {"median": t}} for k, t in enumerate(times)]
    fit = allreduce_model.fit(rows, world_size=2)
    assert fit["bus_bandwidth_gb_s"] is None
    weights = [1 / t**2 for t in times]
    assert fit["latency_s"] == pytest.approx(sum(w * t for w, t in zip(weights, times,
                                                                         strict=True))
                                             / sum(weights))
    assert allreduce_model.model_s(fit, 2, MB)["bandwidth_s"] == 0
    assert "not resolved" in allreduce_model.bandwidth_text(fit)
    # The same sizes growing with size: resolved, and positive.
    grown = [{"bytes": r["bytes"], "seconds": {"median": 1e-3 + r["bytes"] / 1e9}}
             for r in rows]
    assert allreduce_model.fit(grown, world_size=2)["bus_bandwidth_gb_s"] > 0


def test_each_trial_against_the_course_step_with_its_own_split():
    bench_plan = make_plan()
    figures = analyse.analyse(fake_raw(bench_plan), bench_plan)
    trials = figures["communication"]["trials"]
    assert [t["trial"] for t in trials] == [t.name for t in bench_plan.trials]
    course = figures["communication"]["exposed"][0]
    one_step = 32 * SECONDS_PER_SAMPLE  # the course's step
    for row, trial in zip(trials, bench_plan.trials, strict=True):
        ddp, no_sync, sync = TRIAL_COST[row["trial"]]
        assert row["config"] == "course"
        constant(row["speedup"], COST[COURSE] / ddp)
        constant(row["no_sync_speedup"], COST[NO_SYNC] / no_sync)
        assert row["step_s"]["median"] == pytest.approx(one_step * ddp)
        exposed, one_float = one_step * (ddp - no_sync), one_step * (sync - no_sync)
        assert row["exposed_s"]["median"] == pytest.approx(exposed)
        assert row["one_float_allreduce_s"]["median"] == pytest.approx(one_float)
        # An accumulating trial all-reduces once per `accumulate` micro-batches.
        bandwidth = course["floor"]["bandwidth_s"] / trial.accumulate
        assert row["bandwidth_s"] == pytest.approx(bandwidth)
        assert row["unaccounted_s"]["median"] == pytest.approx(exposed - one_float - bandwidth)
        assert row["target"]["exposed_at_most_s"] == pytest.approx(one_float + 2 * bandwidth)
        assert row["target"]["met"] == (exposed <= one_float + 2 * bandwidth)
        assert row["faster_every_round"] == (ddp < COST[COURSE])


def test_precision_and_checkpointing_rows():
    bench_plan = make_plan()
    rows = analyse.analyse(fake_raw(bench_plan), bench_plan)["precision"]
    assert [r["variant"] for r in rows] == list(PRECISION)
    for row in rows:
        seconds, saved, _ = PRECISION[row["variant"]]
        constant(row["speedup"], PRECISION["fp32"][0] / seconds)
        assert row["saved_ratio"] == pytest.approx(saved / PRECISION["fp32"][1])
        assert row["peak_bytes"] is None and row["peak_ratio"] is None  # a CPU


def test_allreduce_bandwidth_and_its_peak():
    bench_plan = make_plan()
    communication = analyse.analyse(fake_raw(bench_plan), bench_plan)["communication"]
    sweep = communication["allreduce"]["2"]
    assert [r["bytes"] for r in sweep] == list(bench_plan.allreduce_sizes)
    for row in sweep:
        seconds = LATENCY_S + row["bytes"] / LINK_BYTES_PER_S
        assert row["seconds"]["median"] == pytest.approx(seconds)
        # Two ranks: 2(N-1)/N = 1, so the bus bandwidth is bytes over time.
        assert row["bus_bandwidth_gb_s"]["median"] == pytest.approx(row["bytes"] / seconds / 1e9)
    largest = bench_plan.allreduce_sizes[-1]
    assert communication["peak_bus_bandwidth_gb_s"] == {
        "2": pytest.approx(largest / (LATENCY_S + largest / LINK_BYTES_PER_S) / 1e9)}


def test_loop_overhead_and_data_path_ratios():
    bench_plan = make_plan()
    figures = analyse.analyse(fake_raw(bench_plan, on_cpu=0.5), bench_plan)
    for row in figures["loop_overhead"]:
        constant(row["ratio"], 0.1 / 0.105)
        constant(row["ratio_by_cpu_time"], 0.1 / 0.105)
        constant(row["on_cpu_share"], 0.5, windows_per_round=2)  # library and bare
        assert row["target"] == analyse.LOOP_OVERHEAD_TARGET
    path = figures["data_path"]
    assert (path["config"], path["batch_size"]) == ("course", 32)
    ratios = {r["what"]: r["ratio"] for r in path["rows"]}
    constant(ratios["train"], 0.12 / 0.1)
    constant(ratios["load"], 0.05 / 0.001)
    shard_ratios = {r["what"]: r["shard_ratio"] for r in path["rows"]}
    constant(shard_ratios["train"], 0.2 / 0.1)
    constant(shard_ratios["load"], 0.1 / 0.001)


def full_report(bench_plan, interconnect=None, on_cpu=1.0):
    setup = {"device": bench_plan.device_type, "backend": "gloo", "interconnect": interconnect,
             "world_size": bench_plan.world_size, "threads_per_process": 1,
             "dataset": bench_plan.dataset, "rounds": bench_plan.rounds}
    return {"setup": setup, "hardware": {"torch": "2.x", "cpu_cores": 2},
            "load_average": {"start": [0.5], "end": [0.7]}, "wall_s": 12.0,
            **analyse.analyse(fake_raw(bench_plan, on_cpu), bench_plan)}


def test_the_table_shows_every_figure():
    figures = full_report(make_plan())
    table = report.format_report(figures)
    lines = table.splitlines()
    assert lines[0].startswith("workshop_lib.bench: cpu, gloo, 2 process(es) x 1 thread")
    assert "warning" not in table
    for row in figures["scaling"]:
        cells = (row["config"], row["mode"], report.format_stats(row["efficiency"], ".2f"))
        assert any(all(c in line for c in cells) for line in lines), cells
    for row in figures["communication"]["exposed"]:
        assert report.format_stats(row["buffer_sync_step_s"], ".2f", 1e3) in table
        assert report.format_stats(row["buffer_sync_slowdown"], ".2f") in table
        cells = (row["config"], report.format_stats(row["exposed_s"], ".2f", 1e3),
                 report.format_stats(row["one_float_allreduce_s"], ".2f", 1e3),
                 report.format_stats(row["breakdown"]["sync_s"], ".2f", 1e3),
                 f"{row['breakdown']['latency_s'] * 1e3:.3f}",
                 f"{row['breakdown']['bandwidth_s'] * 1e3:.3f}",
                 report.format_stats(row["breakdown"]["unaccounted_s"], ".2f", 1e3),
                 f"{row['target']['exposed_at_most_s'] * 1e3:.2f}")
        assert any(all(c in line for c in cells) for line in lines), cells
        cells = (row["config"], report.format_stats(row["flat_allreduce_s"], ".2f", 1e3),
                 report.format_stats(row["breakdown"]["large_message_s"], ".2f", 1e3),
                 report.format_stats(row["breakdown"]["ddp_own_s"], ".2f", 1e3))
        assert any(all(c in line for c in cells) for line in lines), cells
    assert "DDP defaults" in table and "forward_sync_buffers=True" in table
    fit = figures["communication"]["allreduce_model"]["2"]
    assert f"time = {fit['latency_s'] * 1e3:.3f} ms + 2(N-1)/N * bytes / " \
           f"{fit['bus_bandwidth_gb_s']:.3f} GB/s" in table
    for row in figures["communication"]["trials"]:
        cells = (row["trial"], report.format_stats(row["speedup"], ".2f"),
                 report.format_stats(row["no_sync_speedup"], ".2f"),
                 report.format_stats(row["exposed_s"], ".2f", 1e3),
                 report.format_stats(row["one_float_allreduce_s"], ".2f", 1e3),
                 report.format_stats(row["unaccounted_s"], ".2f", 1e3),
                 f"{row['target']['exposed_at_most_s'] * 1e3:.2f}")
        assert any(all(c in line for c in cells) for line in lines), cells
    for row in figures["precision"]:
        cells = (row["variant"], report.format_stats(row["speedup"], ".2f"),
                 f"{row['saved_ratio']:.2f}")
        assert any(all(c in line for c in cells) for line in lines), cells
    assert "fp16 on a CPU" in table  # said, not left out
    assert report.format_stats({"median": 1.5, "min": 1, "max": 2}, ".2f") == "1.50 [1.00..2.00]"
    assert [report.format_bytes(b) for b in (KB, 256 * KB, MB)] == ["1 KB", "256 KB", "1 MB"]


def test_the_header_names_the_interconnect_and_warns_of_a_busy_cpu():
    bench_plan = make_plan()
    assert "NVLink" in report.format_report(full_report(bench_plan, "NVLink")).splitlines()[0]
    busy = report.format_report(full_report(bench_plan, on_cpu=0.5))
    assert "warning: other processes held the CPU for 50%" in busy


def test_one_process_has_no_communication_section_rows():
    bench_plan = make_plan(world_size=1)
    figures = full_report(bench_plan)
    assert figures["communication"] == {"allreduce": {}, "peak_bus_bandwidth_gb_s": {},
                                        "allreduce_model": {}, "exposed": [], "trials": []}
    assert {r["world_size"] for r in figures["scaling"]} == {1}
    assert "exposed communication" not in report.format_report(figures)


def test_inside_ddp_wrappers_against_local_and_the_sweep_priced_by_the_fit():
    bench_plan = make_plan()
    figures = full_report(bench_plan)
    inside = figures["inside_ddp"]
    assert [r["variant"] for r in inside["wrappers"]] == list(analyse.WRAPPERS)
    naive = next(r for r in inside["wrappers"] if r["variant"] == "naive")
    assert naive["over_local_ms"] == pytest.approx(4.0)
    fit = figures["communication"]["allreduce_model"]["2"]
    assert fit["latency_s"] == pytest.approx(LATENCY_S, rel=1e-3)  # the fake link's
    small, large = inside["bucket_sweep"]
    assert (small["bucket_bytes"], small["all_reduces"], large["all_reduces"]) == (4096, 21, 2)
    for row in (small, large):
        messages = INSIDE_MESSAGES[f"buckets_{row['bucket_bytes']}"]
        expected = sum(LATENCY_S + 2 * (2 - 1) / 2 * b / LINK_BYTES_PER_S for b in messages)
        assert row["predicted_ms"] == pytest.approx(1e3 * expected, rel=1e-3)
    assert small["predicted_ms"] > large["predicted_ms"], "21 latencies against 2"
    table = report.format_report(figures)
    assert "6. Inside DDP (notebook 07's wrappers" in table
    assert any("naive" in line and "+4.00" in line for line in table.splitlines())
    assert f"{small['predicted_ms']:.2f}" in table


def test_one_process_has_no_inside_ddp_section():
    figures = full_report(make_plan(world_size=1))
    assert figures["inside_ddp"] is None
    assert "Inside DDP" not in report.format_report(figures)


def test_the_data_path_without_webdataset_says_what_it_skipped(monkeypatch):
    """A GPU image with torch alone has no webdataset: the data path measures its two
    loaders and the report says, in one line, why the record shards are missing."""
    import sys

    from workshop_lib.bench import solo

    monkeypatch.setitem(sys.modules, "webdataset", None)  # as if not installed
    reason = solo.shards_skipped()
    assert reason.startswith("data path: record shards skipped") and "webdataset" in reason
    monkeypatch.delitem(sys.modules, "webdataset")
    assert solo.shards_skipped() is None  # installed here (make setup)
    bench_plan = make_plan()
    raw = fake_raw(bench_plan)
    for name in ("train/shard_loader", "load/shard_loader"):
        del raw["data_path"]["timings"][name]
    raw["data_path"]["skipped"] = reason
    figures = analyse.analyse(raw, bench_plan)
    assert all("shard_ratio" not in row for row in figures["data_path"]["rows"])
    lines = report.data_path_section(figures)
    assert lines[-1] == f"  {reason}" and "record shards (workshop_lib" not in lines[0]


@pytest.mark.parametrize("gpus, device, expected", [(1, "cuda", 1), (4, "cuda", 4),
                                                    (8, "cuda", 8), (0, "cpu", None),
                                                    (1, "cpu", None)])
def test_the_bench_runs_one_process_per_gpu_by_default_even_on_one(monkeypatch, gpus,
                                                                   device, expected):
    """`bench --device cuda` on a one-GPU machine used to refuse (2 processes, 1 GPU)."""
    import torch

    from workshop_lib import hardware

    monkeypatch.setattr(hardware, "detect", lambda: hardware.Machine(gpus=gpus, cpu_cores=8))
    found = plan.default_nproc(torch.device(device))
    assert found == (expected if expected is not None else hardware.CPU_PROCESSES)
