"""The benchmark command runs in quick mode and reports every figure, complete and sane.

Speed itself is measured by ``python -m workshop_lib.bench``, not asserted here: these
tests check that the figures exist, are finite and positive where they must be, follow
from the raw timings, and that the printed table shows what the JSON holds. They also pin
the bench to what learners run: ``train.train_step`` and ``train_ddp.wrap``.
(``test_bench_analysis.py`` checks the arithmetic on hand-built timings, in milliseconds.)
"""
import json
import math
import os

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import workshop_lib.bench.__main__ as command
from workshop_lib import allreduce_model, data, distributed, profile, stopwatch, train, train_ddp
from workshop_lib.bench import analyse, measure, plan, solo

CPU = torch.device("cpu")


def stats_are_sane(stats, positive=True):
    numbers = (stats["median"], stats["min"], stats["max"])
    assert all(math.isfinite(x) for x in numbers), stats
    assert stats["min"] <= stats["median"] <= stats["max"], stats
    assert stats["n"] >= 3, stats
    if positive:
        assert stats["min"] > 0, stats


def shown(stats, spec, scale=1.0):
    """How the table shows a summary: median [min..max]."""
    return "{} [{}..{}]".format(*(format(stats[k] * scale, spec) for k in ("median", "min", "max")))


@pytest.fixture(scope="module")
def quick_bench(notebook_02):
    """The benchmark notebook 02 ran: ``python -m workshop_lib.bench --quick`` on the CPU
    with 2 gloo ranks (the CPU profile's), its JSON and the table it printed."""
    runs, _, _ = notebook_02
    return json.loads((runs / "bench.json").read_text()), (runs / "bench.txt").read_text()


@pytest.mark.slow
def test_scaling_covers_every_world_size_in_both_modes(quick_bench):
    report, _ = quick_bench
    world_sizes = report["setup"]["world_sizes"]
    assert world_sizes == [1, 2]
    configs = [c["name"] for c in report["setup"]["configs"]]
    assert configs == ["course", "scaling"]
    seen = {(r["config"], r["mode"], r["world_size"]) for r in report["scaling"]}
    assert seen == {(c, m, w) for c in configs for m in ("weak", "strong") for w in world_sizes}
    for row in report["scaling"]:
        for key in ("samples_per_s", "speedup", "efficiency"):
            stats_are_sane(row[key])
        assert row["global_batch_size"] == row["batch_size"] * row["world_size"]
        if row["world_size"] == 1:
            assert row["speedup"]["median"] == pytest.approx(1.0)
            assert row["predicted_efficiency"] is None
        elif row["mode"] == "weak":
            assert 0 < row["predicted_efficiency"] <= 1
        # Efficiency is the speed-up shared out over the processes.
        assert row["efficiency"]["median"] == pytest.approx(
            row["speedup"]["median"] / row["world_size"])
    # Strong scaling keeps the global batch; weak scaling keeps the per-process one.
    for config in configs:
        rows = [r for r in report["scaling"] if r["config"] == config]
        assert len({r["global_batch_size"] for r in rows if r["mode"] == "strong"}) == 1
        assert len({r["batch_size"] for r in rows if r["mode"] == "weak"}) == 1


@pytest.mark.slow
def test_loop_overhead_and_data_path_are_positive_ratios(quick_bench):
    report, _ = quick_bench
    assert [r["config"] for r in report["loop_overhead"]] == ["course", "scaling"]
    for row in report["loop_overhead"]:
        for key in ("library_samples_per_s", "bare_samples_per_s", "ratio",
                    "ratio_by_cpu_time", "on_cpu_share"):
            stats_are_sane(row[key])
        assert row["on_cpu_share"]["max"] <= 1.1  # one thread: CPU time cannot exceed wall
    path = report["data_path"]
    assert path["workers"] >= 1 and path["worker_startup_s"] > 0
    assert [r["what"] for r in path["rows"]] == ["train", "load"]
    for row in path["rows"]:
        for key in ("tensor_loader_samples_per_s", "data_loader_samples_per_s", "ratio",
                    "shard_loader_samples_per_s", "shard_ratio"):
            stats_are_sane(row[key])


@pytest.mark.slow
def test_the_gpu_checks_bench_step_reads_the_benchs_own_report(quick_bench):
    """The smoke's one-process bench step (gpu_check.notebook_parts) reads this report's
    keys: its figures carry the loop overhead, the data path and the precision ratios, and
    a data path without record shards says why."""
    from workshop_lib.gpu_check import notebook_parts

    report, _ = quick_bench
    figures = notebook_parts.bench_figures(report)
    overhead = report["loop_overhead"][0]
    assert figures[0].startswith(f"loop overhead, course batch {overhead['batch_size']}: ")
    assert f"{overhead['ratio']['median']:.3f} of a bare loop" in figures[0]
    assert any("record shards" in line and "DataLoader with 2 workers" in line
               for line in figures)
    assert any(line.startswith("against fp32 at batch") and "bf16" in line for line in figures)
    skipped = {**report, "data_path": {**report["data_path"], "rows": [],
                                       "skipped": solo.shards_skipped() or "webdataset absent"}}
    assert notebook_parts.bench_figures(skipped)[-2] == skipped["data_path"]["skipped"]


@pytest.mark.slow
def test_allreduce_bandwidth_rises_with_message_size(quick_bench):
    report, _ = quick_bench
    communication = report["communication"]
    sweep = communication["allreduce"]["2"]
    sizes = [r["bytes"] for r in sweep]
    assert sizes[0] == 1024 and sizes == sorted(sizes) and len(sizes) >= 6
    # The sweep reaches the gradients the floor is predicted from.
    assert sizes[-1] >= max(r["gradient_bytes"] for r in communication["exposed"])
    for row in sweep:
        stats_are_sane(row["seconds"])
        stats_are_sane(row["bus_bandwidth_gb_s"])
    bandwidth = [r["bus_bandwidth_gb_s"]["median"] for r in sweep]
    assert communication["peak_bus_bandwidth_gb_s"] == {"2": max(bandwidth)}
    # Small messages pay a fixed latency, large ones approach the link's bandwidth. Noise
    # from other work on the machine may swap neighbours, never the two ends.
    assert bandwidth[-1] > 10 * bandwidth[0]
    half = len(bandwidth) // 2
    assert sorted(bandwidth[half:])[len(bandwidth[half:]) // 2] > max(bandwidth[:half])


@pytest.mark.slow
def test_exposed_communication_against_the_floor(quick_bench):
    report, _ = quick_bench
    rows = report["communication"]["exposed"]
    assert [r["config"] for r in rows] == ["course", "scaling"]
    fit = report["communication"]["allreduce_model"]["2"]
    bandwidth = fit["bus_bandwidth_gb_s"]  # timed: resolved and positive, or None
    assert fit["latency_s"] >= 0 and (bandwidth is None or bandwidth > 0)
    assert fit["sizes"] == len(report["communication"]["allreduce"]["2"])
    for row in rows:
        for key in ("ddp_step_s", "no_sync_step_s", "no_sync_efficiency", "sync_step_s",
                    "flat_step_s", "buffer_sync_step_s", "buffer_sync_slowdown"):
            stats_are_sane(row[key])
        # Differences of noisy step times: noise can make them negative.
        for stats in (row["exposed_s"], row["one_float_allreduce_s"], row["flat_allreduce_s"],
                      row["breakdown"]["sync_s"], row["breakdown"]["unaccounted_s"],
                      row["breakdown"]["large_message_s"], row["breakdown"]["ddp_own_s"]):
            stats_are_sane(stats, positive=False)
        assert row["gradient_bytes"] == 4 * row["parameters"]
        # The floor is the fitted model at the gradients' size, both terms kept.
        floor = row["floor"]
        assert floor["latency_s"] == pytest.approx(fit["latency_s"])
        assert floor["bandwidth_s"] == pytest.approx(
            row["gradient_bytes"] / (fit["bus_bandwidth_gb_s"] * 1e9))
        assert row["floor_s"] == pytest.approx(floor["latency_s"] + floor["bandwidth_s"])
        assert row["breakdown"]["bandwidth_s"] == floor["bandwidth_s"]
        assert row["target"]["exposed_at_most_s"] == pytest.approx(
            row["one_float_allreduce_s"]["median"] + 2 * floor["bandwidth_s"])


@pytest.mark.slow
def test_every_trial_and_precision_row_is_measured(quick_bench):
    report, _ = quick_bench
    trials = report["communication"]["trials"]
    # This machine's trials: all of them on a Linux CPU with a core per rank.
    expected = plan.trials_for("cpu", report["setup"]["world_size"],
                               report["hardware"]["cpu_cores"])
    assert [t["trial"] for t in trials] == [t.name for t in expected]
    for row in trials:
        for key in ("step_s", "speedup", "no_sync_step_s", "no_sync_speedup"):
            stats_are_sane(row[key])
        for key in ("exposed_s", "one_float_allreduce_s", "unaccounted_s"):
            stats_are_sane(row[key], positive=False)
        assert row["faster_every_round"] == (row["speedup"]["min"] > 1)
        assert row["target"]["exposed_at_most_s"] == pytest.approx(
            row["one_float_allreduce_s"]["median"] + 2 * row["bandwidth_s"])
    rows = report["precision"]
    assert [(r["config"], r["variant"]) for r in rows] == [
        ("course", name) for name, _, _ in solo.PRECISION_VARIANTS]
    for row in rows:
        stats_are_sane(row["samples_per_s"])
        stats_are_sane(row["speedup"])
        assert row["saved_bytes"] > 0 and row["peak_bytes"] is None  # no GPU in a CPU bench
    saved = {r["variant"]: r["saved_ratio"] for r in rows}
    # Half-precision activations and recomputed blocks keep less for backward.
    assert saved["fp32"] == 1 and saved["bf16"] < 1 and saved["fp32 checkpointed"] < 1


@pytest.mark.slow
def test_notebook_07s_wrappers_are_timed_in_the_benchs_ranks(quick_bench):
    report, stdout = quick_bench
    inside = report["inside_ddp"]
    assert inside["world_size"] == report["setup"]["world_size"]
    assert [r["variant"] for r in inside["wrappers"]] == list(analyse.WRAPPERS)
    for row in inside["wrappers"]:
        stats_are_sane(row["step_ms"])
        assert row["step_ms"]["n"] == report["setup"]["rounds"]
    sweep = inside["bucket_sweep"]
    assert [r["bucket_bytes"] for r in sweep] == sorted(r["bucket_bytes"] for r in sweep)
    # Smaller buckets mean more all-reduces, each with its latency in the price.
    assert [r["all_reduces"] for r in sweep] == sorted((r["all_reduces"] for r in sweep),
                                                       reverse=True)
    assert all(r["predicted_ms"] > 0 for r in sweep)
    assert "6. Inside DDP" in stdout


@pytest.mark.slow
def test_table_shows_the_json_figures(quick_bench):
    report, stdout = quick_bench
    lines = stdout.splitlines()
    setup = report["setup"]
    assert lines[0].startswith(f"workshop_lib.bench: {setup['device']}, {setup['backend']}")
    assert f"{setup['world_size']} process(es)" in lines[0]

    def in_one_line(*cells):
        assert any(all(c in line for c in cells) for line in lines), cells

    for row in report["scaling"]:
        in_one_line(row["config"], row["mode"], shown(row["samples_per_s"], ",.0f"),
                    shown(row["speedup"], ".2f"), shown(row["efficiency"], ".2f"))
    for row in report["loop_overhead"]:
        in_one_line(row["config"], shown(row["ratio"], ".3f"),
                    shown(row["ratio_by_cpu_time"], ".3f"))
    for row in report["communication"]["allreduce"]["2"]:
        in_one_line(shown(row["seconds"], ".3f", 1e3), shown(row["bus_bandwidth_gb_s"], ".3f"))
    for row in report["communication"]["exposed"]:
        in_one_line(row["config"], shown(row["ddp_step_s"], ".2f", 1e3),
                    shown(row["no_sync_step_s"], ".2f", 1e3), f"{row['floor_s'] * 1e3:.3f}")
        in_one_line(row["config"], shown(row["buffer_sync_step_s"], ".2f", 1e3),
                    shown(row["buffer_sync_slowdown"], ".2f"))
        in_one_line(row["config"], shown(row["one_float_allreduce_s"], ".2f", 1e3),
                    shown(row["breakdown"]["sync_s"], ".2f", 1e3),
                    shown(row["breakdown"]["unaccounted_s"], ".2f", 1e3))
    for row in report["communication"]["trials"]:
        in_one_line(row["trial"], shown(row["step_s"], ".2f", 1e3), shown(row["speedup"], ".2f"))
    for row in report["precision"]:
        in_one_line(row["variant"], shown(row["speedup"], ".2f"), f"{row['saved_ratio']:.2f}")
    for row in report["data_path"]["rows"]:
        in_one_line(shown(row["ratio"], ".2f"), shown(row["shard_ratio"], ".2f"))
    assert "wrote" in stdout


def test_the_bench_times_the_course_step_and_the_course_wrap():
    """The bench's DDP models are train_ddp's, option for option, and its step is train's:
    a copy that drifts from what learners run would time something else. Each trial
    changes exactly the options it names."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{distributed.free_port()}",
                            rank=0, world_size=1)
    try:
        bench_plan = plan.make_plan(command.parse_args(["--quick", "--nproc", "2"]), CPU)
        info = data.DATASETS[bench_plan.dataset]
        world = measure.World(0, bench_plan, CPU, train_set=None, info=info)
        config = bench_plan.configs[0]
        # The models the bench times at N processes (in this one-rank group).
        n = bench_plan.world_size
        bench_ddp = measure.model_for(world, config, n)
        bench_defaults = measure.model_for(world, config, n, plan.BUFFER_SYNC)
        # The trials with a DDP of their own (the others step the course's model).
        own = [t for t in bench_plan.trials if t.ddp or t.gloo_threads]
        trials = {t: measure.model_for(world, config, n, t.name) for t in own}
        course_ddp = train_ddp.wrap(config.build(info), CPU)
        ddp_defaults = DDP(config.build(info))
        changed = {t: DDP(config.build(info), **dict(t.ddp)) for t in own if t.ddp}
    finally:
        dist.destroy_process_group()
    options = ("forward_sync_buffers", "find_unused_parameters", "gradient_as_bucket_view",
               "bucket_bytes_cap", "static_graph", "device_ids")

    def of(model):
        return {o: getattr(model, o) for o in options}

    assert of(bench_ddp) == of(course_ddp)
    # The comparison row is DDP with its defaults, which re-send buffers every forward.
    assert of(bench_defaults) == of(ddp_defaults)
    assert bench_defaults.forward_sync_buffers and not bench_ddp.forward_sync_buffers
    for trial, model in trials.items():
        # The course's options, but for those the trial changes (as DDP would set them).
        expected = {o: getattr(changed[trial] if o in trial_options(trial) else course_ddp, o)
                    for o in options}  # a gloo trial changes no option: all the course's
        assert of(model) == expected, trial.name
    assert measure.train_step is train.train_step
    assert solo.train_step is train.train_step
    assert measure.backward is train_ddp.backward


def trial_options(trial):
    """The DDP attributes a trial's options set (bucket_cap_mb sets bucket_bytes_cap)."""
    names = {name for name, _ in trial.ddp}
    return names | ({"bucket_bytes_cap"} if "bucket_cap_mb" in names else set())


def test_every_plan_window_has_a_model_and_the_trials_share_the_course_model():
    bench_plan = plan.make_plan(command.parse_args(["--quick", "--nproc", "2"]), CPU)
    windows = plan.scaling_windows(bench_plan)
    assert len({w.key for w in windows}) == len(windows)
    course, n = bench_plan.configs[0], bench_plan.world_size
    at_n = [w for w in windows if w.config == course and w.world_size == n
            and w.batch_size == course.batch_size]
    course_run = plan.Window(course, n, course.batch_size).run
    for window in at_n:
        trial = window.trial
        # DDP's defaults and trials of DDP options have a model of their own; no_sync,
        # the all-reduces after it, pinning and accumulation step the course's model.
        own = window.variant == plan.BUFFER_SYNC or bool(trial and (trial.ddp or
                                                                   trial.gloo_threads))
        assert (window.run != course_run) == own, window
    # Each trial: as DDP, under no_sync, and with the one-float all-reduce; at the
    # course's step only.
    for trial in bench_plan.trials:
        assert sorted(w.variant for w in windows if w.trial_name == trial.name) == sorted(
            [plan.COURSE, plan.NO_SYNC, plan.SYNC])
    assert not [w for w in windows if w.trial and w.config != course]


def test_trials_a_machine_cannot_run_are_left_out():
    names = [t.name for t in plan.trials_for("cpu", 2, cores=1)]
    assert "pinned" not in names and "gloo_lo_1_thread" in names
    assert plan.trials_for("cuda", 8, cores=64) == plan.TRIALS  # no gloo, no pinning


def test_an_accumulating_window_takes_whole_groups_of_micro_batches():
    run = measure.TimedModel(model=None, optimizer=None, batches=None, world_size=2, steps=10)
    accumulate = plan.Window(plan.StepConfig("course", "cnn", 32), 2, 32, plan.COURSE,
                             "accumulate_4")
    assert measure.window_steps(accumulate, run) == 8
    assert measure.window_steps(plan.Window(accumulate.config, 2, 32), run) == 10
    run.steps = 3
    assert measure.window_steps(accumulate, run) == 4  # at least one group


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")
def test_pinning_puts_every_thread_on_one_core_and_gives_them_back():
    world = measure.World(1, None, CPU, train_set=None, info=None)
    before = os.sched_getaffinity(0)
    with measure.pinned(world):
        expected = {sorted(world.cores)[1 % len(world.cores)]}
        for tid in os.listdir("/proc/self/task"):
            assert os.sched_getaffinity(int(tid)) == expected
    assert os.sched_getaffinity(0) == before


def test_the_sweep_reaches_the_largest_gradients():
    """The floor is read off a measured size, also with --quick; on a CPU --quick stays
    at 4 MB, since its steps' gradients are smaller."""
    def largest_gradients(configs):
        return max(plan.model_facts(c, data.DATASETS["digits"])["gradient_bytes"]
                   for c in configs)

    cpu_plan = plan.make_plan(command.parse_args(["--quick", "--device", "cpu"]), CPU)
    assert largest_gradients(cpu_plan.configs) < 4 * plan.MB
    assert cpu_plan.allreduce_sizes == tuple(plan.KB * 4**k for k in range(7))  # 1 KB..4 MB
    largest = largest_gradients([plan.StepConfig("scaling", "wrn-16-10", 128)])  # on GPUs
    for quick, top in ((True, 4 * plan.MB), (False, 256 * plan.MB)):
        sizes = plan.allreduce_sizes(largest, quick)
        assert sizes[-2] < max(largest, top) <= sizes[-1]
        assert all(b == 4 * a for a, b in zip(sizes, sizes[1:], strict=False))


def test_the_bandwidth_term_of_the_floor():
    # Ring all-reduce: each of N ranks moves 2(N-1)/N of the bytes.
    assert allreduce_model.floor_s(4, 1e9, 1.0) == pytest.approx(1.5)
    assert allreduce_model.floor_s(2, 1e9, 1.0) == pytest.approx(1.0)


def test_per_round_ratios_pair_runs_of_the_same_round():
    assert analyse.per_round([2, 4, 9], [1, 4, 3]) == {"median": 2, "min": 1, "max": 3, "n": 3}
    assert stopwatch.summary([3, 1, 2]) == {"median": 2, "min": 1, "max": 3, "n": 3}


def test_several_batch_sizes_give_one_scaling_step_each():
    course = profile.get_profile("cpu")
    configs = plan.default_configs("cpu", batch_sizes=[64, 256])
    assert [(c.name, c.model, c.batch_size) for c in configs] == [
        ("course", course.model, course.batch_size), ("scaling-64", "cnn", 64),
        ("scaling-256", "cnn", 256)]
    assert [c.name for c in plan.default_configs("cpu")] == ["course", "scaling"]


@pytest.mark.parametrize("flags", [["--nproc", "0"], ["--rounds", "0"], ["--batch-size", "0"],
                                   ["--model", "resnet"], ["--loader-workers", "-1"],
                                   ["--nproc", "two"], ["--no-such-flag"]])
def test_bad_flags_stop_before_any_process_starts(flags, capsys):
    with pytest.raises(SystemExit) as stop:
        command.main([*flags, "--device", "cpu"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
