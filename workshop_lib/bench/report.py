"""The printed table: the report's JSON, formatted, one section per measurement."""
from workshop_lib import allreduce_model, runlog
from workshop_lib.allreduce_model import floor_s
from workshop_lib.bench.plan import KB, MB


def format_stats(stats, spec, scale=1.0):
    """``median [min..max]`` of a summary, each number formatted with ``spec``."""
    return (f"{format(stats['median'] * scale, spec)} "
            f"[{format(stats['min'] * scale, spec)}..{format(stats['max'] * scale, spec)}]")


def format_bytes(nbytes):
    return f"{nbytes // MB} MB" if nbytes >= MB else f"{nbytes // KB} KB"


def format_report(report):
    sections = (header, scaling_section, loop_overhead_section, communication_section,
                data_path_section, precision_section, inside_ddp_section)
    return "\n\n".join("\n".join(section(report)) for section in sections
                       if section(report))


def header(report):
    setup = report["setup"]
    threads = setup["threads_per_process"]
    link = f" over {setup['interconnect']}" if setup["interconnect"] else ""
    lines = [
        f"workshop_lib.bench: {setup['device']}, {setup['backend']}{link}, "
        f"{setup['world_size']} process(es) x {threads or 'one GPU'} "
        f"{'thread' if threads else ''}, dataset {setup['dataset']}, "
        f"torch {report['hardware']['torch']}, {report['hardware']['cpu_cores']} CPU cores",
        f"load average (1 min): {report['load_average']['start'][0]:.2f} at start, "
        f"{report['load_average']['end'][0]:.2f} at end; wall {report['wall_s']:.0f} s",
        f"figures: median [min..max] over n={setup['rounds']} rounds; the runs compared are "
        f"interleaved within each round",
    ]
    on_cpu = min(r["on_cpu_share"]["median"] for r in report["loop_overhead"])
    if setup["device"] == "cpu" and on_cpu < 0.9:
        lines.append(f"warning: other processes held the CPU for {1 - on_cpu:.0%} of a "
                     f"single-process window; the figures are noisy (see the load average)")
    return lines


def scaling_section(report):
    rows = [{
        "config": r["config"], "model": r["model"], "mode": r["mode"],
        "procs": r["world_size"], "batch": r["batch_size"], "global": r["global_batch_size"],
        "sps": format_stats(r["samples_per_s"], ",.0f"),
        "speedup": format_stats(r["speedup"], ".2f"),
        "efficiency": format_stats(r["efficiency"], ".2f"),
        "predicted": "" if r["predicted_efficiency"] is None
        else f"{r['predicted_efficiency']:.2f}",
        "host": "" if r.get("host_overhead_s") is None else f"{1e3 * r['host_overhead_s']:.2f}",
    } for r in report["scaling"]]
    return [
        "1. Scaling (efficiency = speed-up / processes; predicted: one process's step plus "
        "the fitted all-reduce at the gradients' size, no overlap, plus DDP's host work per "
        "step: its no_sync step among the processes over a step alone)",
        runlog.format_table(rows, {
            "config": ("config", ""), "model": ("model", ""), "mode": ("mode", ""),
            "procs": ("procs", "d"), "batch": ("batch/proc", "d"), "global": ("global", "d"),
            "sps": ("samples/s", ""), "speedup": ("speed-up", ""),
            "efficiency": ("efficiency", ""), "predicted": ("predicted", ""),
            "host": ("DDP host ms", "")}),
    ]


def loop_overhead_section(report):
    loop = report["loop_overhead"]
    rows = [{"config": r["config"], "model": r["model"], "batch": r["batch_size"],
             "library": format_stats(r["library_samples_per_s"], ",.0f"),
             "bare": format_stats(r["bare_samples_per_s"], ",.0f"),
             "ratio": format_stats(r["ratio"], ".3f"),
             "ratio_cpu": format_stats(r["ratio_by_cpu_time"], ".3f"),
             "on_cpu": format_stats(r["on_cpu_share"], ".2f")} for r in loop]
    return [
        f"2. Loop overhead: train.train_epoch + TensorLoader vs a bare loop (target ratio "
        f">= {loop[0]['target']})",
        runlog.format_table(rows, {
            "config": ("config", ""), "model": ("model", ""), "batch": ("batch", "d"),
            "library": ("library samples/s", ""), "bare": ("bare samples/s", ""),
            "ratio": ("ratio", ""), "ratio_cpu": ("ratio by CPU time", ""),
            "on_cpu": ("on-CPU share", "")}),
    ]


def communication_section(report):
    communication = report["communication"]
    lines = ["3. Communication"]
    for w, sweep in communication["allreduce"].items():
        fit = communication["allreduce_model"][w]
        lines.append(f"all-reduce over {w} ranks (bus bandwidth = bytes / time * 2(N-1)/N; "
                     f"model: the fit below)")
        rows = [{"size": format_bytes(r["bytes"]),
                 "time": format_stats(r["seconds"], ".3f", 1e3),
                 "model": fit["latency_s"] * 1e3 + floor_s(
                     int(w), r["bytes"], fit["bus_bandwidth_gb_s"]) * 1e3,
                 "bandwidth": format_stats(r["bus_bandwidth_gb_s"], ".3f"),
                 "n": r["seconds"]["n"]} for r in sweep]
        lines.append(runlog.format_table(rows, {
            "size": ("size", ""), "time": ("time ms", ""), "model": ("model ms", ".3f"),
            "bandwidth": ("bus GB/s", ""), "n": ("n", "d")}))
        lines.append(f"fitted (least squares on the medians, relative errors): time = "
                     f"{fit['latency_s'] * 1e3:.3f} ms + 2(N-1)/N * bytes / "
                     f"{allreduce_model.bandwidth_text(fit, '.3f')} (rms error "
                     f"{fit['relative_rms_error']:.0%} over {fit['sizes']} sizes)")
    if communication["exposed"]:
        lines += exposed_tables(communication["exposed"])
    if communication.get("trials"):
        lines += trial_table(communication["trials"], communication["exposed"][0])
    return lines


def exposed_tables(exposed):
    rows = [{"config": r["config"], "model": r["model"], "procs": r["world_size"],
             "batch": r["batch_size"], "grad": f"{r['gradient_bytes'] / MB:.2f}",
             "ddp": format_stats(r["ddp_step_s"], ".2f", 1e3),
             "no_sync": format_stats(r["no_sync_step_s"], ".2f", 1e3),
             "exposed": format_stats(r["exposed_s"], ".2f", 1e3),
             "floor": f"{r['floor_s'] * 1e3:.3f}",
             "no_sync_eff": format_stats(r["no_sync_efficiency"], ".2f"),
             "one_float": format_stats(r["one_float_allreduce_s"], ".2f", 1e3),
             "sync": format_stats(r["breakdown"]["sync_s"], ".2f", 1e3),
             "latency": f"{r['breakdown']['latency_s'] * 1e3:.3f}",
             "bandwidth": f"{r['breakdown']['bandwidth_s'] * 1e3:.3f}",
             "rest": format_stats(r["breakdown"]["unaccounted_s"], ".2f", 1e3),
             "flat": format_stats(r["flat_allreduce_s"], ".2f", 1e3),
             "large": format_stats(r["breakdown"]["large_message_s"], ".2f", 1e3),
             "ddp_own": format_stats(r["breakdown"]["ddp_own_s"], ".2f", 1e3),
             "target": f"<= {r['target']['exposed_at_most_s'] * 1e3:.2f} "
                       f"{'met' if r['target']['met'] else 'not met'}",
             "buffer_sync": format_stats(r["buffer_sync_step_s"], ".2f", 1e3),
             "slowdown": format_stats(r["buffer_sync_slowdown"], ".2f")} for r in exposed]
    return [
        "exposed communication: DDP step (train_ddp.wrap) vs the same step under no_sync; "
        "floor = the fitted all-reduce of the gradients (latency + 2(N-1)/N * bytes / bus "
        "bandwidth)",
        runlog.format_table(rows, {
            "config": ("config", ""), "model": ("model", ""), "procs": ("procs", "d"),
            "batch": ("batch/proc", "d"), "grad": ("grad MB", ""),
            "ddp": ("DDP step ms", ""), "no_sync": ("no_sync step ms", ""),
            "exposed": ("exposed ms", ""), "floor": ("floor ms", ""),
            "no_sync_eff": ("efficiency without all-reduce", "")}),
        "exposed communication per step, split: sync = the no_sync step plus an all-reduce "
        "of one float, over the no_sync step, less the fit's latency (the ranks waiting for "
        "each other); latency and bandwidth = the fit at the gradients' size; rest = "
        "exposed - one float - bandwidth. Target: exposed <= one float + 2 x bandwidth",
        runlog.format_table(rows, {
            "config": ("config", ""), "exposed": ("exposed ms", ""),
            "one_float": ("one float ms", ""), "sync": ("sync ms", ""),
            "latency": ("latency ms", ""), "bandwidth": ("bandwidth ms", ""),
            "rest": ("rest ms", ""), "target": ("target ms", "")}),
        "the rest, split by one flat all-reduce of the gradients' bytes after the no_sync "
        "step (no DDP): what it costs beyond one float and the bandwidth term (a large "
        "message), and what DDP's step exposes beyond it (DDP's own: hooks, copies, less "
        "its overlap with backward)",
        runlog.format_table(rows, {
            "config": ("config", ""), "rest": ("rest ms", ""),
            "flat": ("flat all-reduce ms", ""), "large": ("large message ms", ""),
            "ddp_own": ("DDP's own ms", "")}),
        "the same step with DDP defaults (forward_sync_buffers=True: BatchNorm buffers "
        "re-sent from rank 0 before every forward), which train_ddp.wrap turns off",
        runlog.format_table(rows, {
            "config": ("config", ""), "model": ("model", ""), "procs": ("procs", "d"),
            "batch": ("batch/proc", "d"), "ddp": ("DDP step ms", ""),
            "buffer_sync": ("DDP defaults ms", ""), "slowdown": ("slowdown", "")}),
    ]


def trial_table(trials, course):
    rows = [{"trial": r["trial"], "step": format_stats(r["step_s"], ".2f", 1e3),
             "speedup": format_stats(r["speedup"], ".2f"),
             "no_sync": format_stats(r["no_sync_speedup"], ".2f"),
             "exposed": format_stats(r["exposed_s"], ".2f", 1e3),
             "one_float": format_stats(r["one_float_allreduce_s"], ".2f", 1e3),
             "bandwidth": f"{r['bandwidth_s'] * 1e3:.3f}",
             "rest": format_stats(r["unaccounted_s"], ".2f", 1e3),
             "target": f"<= {r['target']['exposed_at_most_s'] * 1e3:.2f} "
                       f"{'met' if r['target']['met'] else 'not met'}",
             "verdict": "faster every round" if r["faster_every_round"] else ""}
            for r in trials]
    return [
        f"trials at the {course['config']} step (batch {course['batch_size']} per process), "
        f"each against the course's DDP step of the same rounds ("
        f"{format_stats(course['ddp_step_s'], '.2f', 1e3)} ms; its no_sync step for the "
        f"no_sync speed-up); each split as above, against its own no_sync step and "
        f"one-float all-reduce",
        runlog.format_table(rows, {
            "trial": ("trial", ""), "step": ("step ms", ""), "speedup": ("speed-up", ""),
            "no_sync": ("no_sync speed-up", ""), "exposed": ("exposed ms", ""),
            "one_float": ("one float ms", ""), "bandwidth": ("bandwidth ms", ""),
            "rest": ("rest ms", ""), "target": ("target ms", ""),
            "verdict": ("verdict", "")}),
        *(f"  {r['trial']}: {r['what']}" for r in trials),
    ]


def data_path_section(report):
    path = report["data_path"]
    with_shards = all("shard_loader_samples_per_s" in r for r in path["rows"])
    rows = [{"what": "training" if r["what"] == "train" else "loading only",
             "tensor": format_stats(r["tensor_loader_samples_per_s"], ",.0f"),
             "loader": format_stats(r["data_loader_samples_per_s"], ",.0f"),
             "ratio": format_stats(r["ratio"], ".2f"),
             **({"shards": format_stats(r["shard_loader_samples_per_s"], ",.0f"),
                 "shard_ratio": format_stats(r["shard_ratio"], ".2f")} if with_shards else {})}
            for r in path["rows"]]
    columns = {"what": ("samples/s", ""), "tensor": ("TensorLoader", ""),
               "loader": ("DataLoader", ""), "ratio": ("ratio", "")}
    if with_shards:
        columns.update(shards=("record shards", ""), shard_ratio=("ratio", ""))
    return [
        f"4. Data path ({path['config']} step, {path['model']}, batch {path['batch_size']}): "
        f"device-resident TensorLoader vs DataLoader with {path['workers']} workers "
        f"(start-up {path['worker_startup_s']:.2f} s, not in the figures)"
        + (" and vs WebDataset record shards (workshop_lib.shards; ratio: TensorLoader's "
           "samples/s over theirs)" if with_shards else ""),
        runlog.format_table(rows, columns),
        *([f"  {path['skipped']}"] if path.get("skipped") else []),
    ]


def precision_section(report):
    rows = [{"config": r["config"], "model": r["model"], "batch": r["batch_size"],
             "variant": r["variant"], "sps": format_stats(r["samples_per_s"], ",.0f"),
             "speedup": format_stats(r["speedup"], ".2f"),
             "saved": f"{r['saved_bytes'] / MB:.2f}", "saved_ratio": f"{r['saved_ratio']:.2f}",
             "peak": "" if r["peak_bytes"] is None else f"{r['peak_bytes'] / MB:.1f}",
             "peak_ratio": "" if r["peak_ratio"] is None else f"{r['peak_ratio']:.2f}"}
            for r in report.get("precision", [])]
    if not rows:
        return []
    lines = [
        "5. Precision and gradient checkpointing (one process; autocast via --amp, "
        "checkpointing via --grad-checkpointing; memory: bytes saved for backward, and on "
        "GPUs the step's peak allocation; ratios against fp32 of the same round)",
        runlog.format_table(rows, {
            "config": ("config", ""), "model": ("model", ""), "batch": ("batch", "d"),
            "variant": ("variant", ""), "sps": ("samples/s", ""), "speedup": ("speed-up", ""),
            "saved": ("saved MB", ""), "saved_ratio": ("saved ratio", ""),
            "peak": ("GPU peak MB", ""), "peak_ratio": ("peak ratio", "")}),
    ]
    if report["setup"]["device"] == "cpu":
        lines.append("fp16 on a CPU: most CPUs have no float16 arithmetic, so autocast's "
                     "float16 is emulated and slow here; it is there to compare with a GPU, "
                     "where Tensor Cores run it")
    return lines


def inside_ddp_section(report):
    inside = report.get("inside_ddp")
    if not inside:
        return []
    wrappers = [{"variant": r["variant"], "step": format_stats(r["step_ms"], ".2f"),
                 "over": f"{r['over_local_ms']:+.2f}"} for r in inside["wrappers"]]
    sweep = [{"bucket": format_bytes(r["bucket_bytes"]), "all_reduces": r["all_reduces"],
              "step": format_stats(r["step_ms"], ".2f"), "over": f"{r['over_local_ms']:+.2f}",
              "predicted": f"{r['predicted_ms']:.2f}"} for r in inside["bucket_sweep"]]
    return [
        f"6. Inside DDP (notebook 07's wrappers; the course CNN on {inside['dataset']}, batch "
        f"{inside['batch_size']} per rank, {inside['world_size']} ranks, "
        f"{inside['gradient_bytes'] / MB:.2f} MB of gradients; ms per step; over local: what "
        f"averaging the gradients adds to a step without it)",
        runlog.format_table(wrappers, {"variant": ("wrapper", ""), "step": ("step ms", ""),
                                       "over": ("over local ms", "")}),
        "   bucket sweep (the bucketed wrapper at each bucket size; predicted: the fitted "
        "all-reduce model's price for its all-reduces, one after another, none overlapped)",
        runlog.format_table(sweep, {"bucket": ("bucket", ""),
                                    "all_reduces": ("all-reduces", "d"),
                                    "step": ("step ms", ""), "over": ("over local ms", ""),
                                    "predicted": ("predicted ms", "")}),
    ]
