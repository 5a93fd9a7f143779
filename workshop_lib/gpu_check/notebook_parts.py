"""The smoke's steps that run a notebook's GPU code as plain Python, on one GPU, each a
subprocess under its own limit (issue 40's rehearsal of every GPU path):

- ``speed``: notebook 05's samples/s against the batch per device (its knee), and at the
  profile's batch fp32 and bf16, each NCHW and channels_last, and the input feed;
- ``inside_ddp``: notebook 07's parts (``inside_ddp.experiments``, ``--one-rank``) on one
  rank, ``torch.compile`` of DDP included on a GPU, and its two "same" verdicts (compiled
  against eager, FSDP against DDP), which must hold for correct code;
- ``bench``: notebook 02's bench with one process (``bench --quick --nproc 1``): the loop
  overhead, the data path (record shards skipped, saying why, without webdataset) and
  the precision and checkpointing ratios;
- ``launcher``: notebook 04's launcher on one NCCL rank, a DDP job and a collective timeout
  the watchdog must end.
"""
from workshop_lib.gpu_check import library
from workshop_lib.gpu_check.steps import from_process

KNEE_SHARE = 0.9  # notebook 05's knee: the smallest batch within 10% of the best samples/s


def speed(context, limit):
    out = context.folder("speed") / "speed.json"

    def read(finished):
        result = library.read_json(out)
        rates = {int(b): r for b, r in result["knee_curve"]["samples_per_s"].items()}
        best = max(rates.values())
        knee = min(b for b, r in rates.items() if r >= KNEE_SHARE * best)
        batch = result["batch_size"]
        where = ("below the knee" if batch < knee else "at or past the knee")
        figures = [f"{result['model']}, {result['dataset']}'s image shape (random images), "
                   f"samples/s by batch per device: "
                   + ", ".join(f"{b} {r:,.0f}" for b, r in sorted(rates.items())),
                   f"the knee (the smallest batch within {1 - KNEE_SHARE:.0%} of the best): "
                   f"batch {knee}; the profile's batch {batch} is {where}"]
        if result["knee_curve"].get("out_of_memory_at"):
            figures.append(f"batch {result['knee_curve']['out_of_memory_at']} did not fit")
        at = result["at_profile_batch"]
        if at.get("fp32"):
            figures.append(f"at batch {batch}: fp32 {at['fp32']:,.0f} samples/s; "
                           + ", ".join(f"{name} {rate / at['fp32']:.2f}x" for name, rate
                                       in at.items() if name != "fp32" and rate))
        fed = result.get("input_feed")
        if fed:
            figures.append(f"input feed at batch {batch}: data on the device "
                           f"{fed['resident']:,.0f} samples/s, a DataLoader "
                           f"{fed['data_loader']:,.0f} "
                           f"({1 - fed['data_loader'] / fed['resident']:.0%} waiting), its 2 "
                           f"workers {fed['workers']:,.0f}")
        return figures, {**result, "knee": knee}, None

    finished = context.command("speed", ["-m", "workshop_lib.gpu_check.probes", "speed",
                                         "--device", context.device, "--out", out], limit)
    return from_process("the profile's speed: the knee, precision and layout", finished,
                        context, read)


def launcher_problem(result):
    """Why the launcher probe's two jobs (``probes.launcher``) fail the check, or None."""
    launch, stuck = result["ddp_launch"], result["stuck_collective"]
    if not launch["ok"]:
        return f"the one-rank DDP launch failed: {launch['summary']}"
    if stuck["ok"]:
        return "the stuck all-reduce finished: nothing stopped it at its timeout"
    if stuck["watchdog"] is None:
        return f"no NCCL watchdog report in the stuck job's logs: {stuck['summary']}"
    if stuck["seconds"] > stuck["bar_s"]:
        return (f"the stuck job ended after {stuck['seconds']:.0f} s, past its "
                f"{stuck['timeout_s']} s timeout + 30 s")
    return None


def launcher(context, limit):
    out = context.folder("launcher") / "launcher.json"

    def read(finished):
        result = library.read_json(out)
        launch, stuck = result["ddp_launch"], result["stuck_collective"]
        figures = [f"train_ddp, 1 NCCL rank, through workshop_lib.launch: {launch['summary']}",
                   f"an all-reduce behind a long kernel, timeout {stuck['timeout_s']} s: ended "
                   f"after {stuck['seconds']:.0f} s (the bar: {stuck['bar_s']} s); "
                   + (stuck["watchdog"] or "no watchdog report")
                   + f"; Flight Recorder dumps: {stuck['flight_recorder_dumps']}"]
        return figures, result, launcher_problem(result)

    finished = context.command("launcher", ["-m", "workshop_lib.gpu_check.probes", "launcher",
                                            "--out", out], limit)
    return from_process("the launcher on NCCL: a DDP job, a collective timeout", finished,
                        context, read)


def inside_ddp(context, limit):
    out = context.folder("inside-ddp") / "inside_ddp.json"

    def read(finished):  # in the check's own process: the standard library and torch only
        result = library.read_json(out)
        figures = ["notebook 07's parts on 1 rank: " + ", ".join(
            f"{name} {seconds:.1f} s" for name, seconds in result["seconds"].items())]
        timing = result["timing"]
        ms = {name: stats["median"] for name, stats in timing["step_ms"].items()}
        figures.append(f"step ms (medians), {timing['model']} at batch {timing['batch_size']}: "
                       + ", ".join(f"{k} {v:.2f}" for k, v in ms.items()))
        if result["comm_hooks"].get("skipped"):
            figures.append(result["comm_hooks"]["skipped"])
        bar = library.SAME_PARAMETERS
        fsdp = result["fsdp"]
        same = {"FSDP2 against DDP": fsdp["max_difference"]}
        figures.append(f"fully_shard against DDP after {fsdp['steps']} Adam steps: largest "
                       f"parameter difference {fsdp['max_difference']:.1e} (the bar: "
                       f"{bar:.0e}; training moved them {fsdp['moved']:.1e})")
        compiled = result.get("compiled")
        if compiled:
            same["torch.compile against eager"] = compiled["first_step_difference"]
            figures.append(f"torch.compile(DDP): the first step {compiled['compile_s']:.1f} s "
                           f"(compiling), then {compiled['step_ms']['compiled']:.2f} ms a step "
                           f"against {compiled['step_ms']['eager']:.2f} eager; parameters "
                           f"{compiled['first_step_difference']:.1e} from eager's after one "
                           f"step (the bar: {bar:.0e})")
        else:
            figures.append("torch.compile: not run on the CPU (minutes there; on a GPU it is)")
        over = [f"{what}: {difference:.1e}, past the bar {bar:.0e} of float rounding"
                for what, difference in same.items() if not difference < bar]
        return figures, result, "; ".join(over) or None

    finished = context.command("inside-ddp", library.inside_ddp(out, device=context.device),
                               limit)
    return from_process("notebook 07's parts, 1 rank", finished, context, read)

def bench_figures(report):
    """The one-process bench's key ratios, each with its own bar where it has one."""
    figures = [f"loop overhead, {row['config']} batch {row['batch_size']}: the library's loop "
               f"{row['ratio']['median']:.3f} of a bare loop's samples/s (target "
               f"{row['target']})" for row in report["loop_overhead"]]
    path = report.get("data_path") or {}
    for row in path.get("rows", []):
        if row["what"] == "train":
            figures.append(f"data path, training: device-resident batches ran "
                           f"{row['ratio']['median']:.2f}x as fast as a DataLoader with "
                           f"{path['workers']} workers"
                           + (f", {row['shard_ratio']['median']:.2f}x as fast as record shards"
                              if row.get("shard_ratio") else ""))
    if path.get("skipped"):
        figures.append(path["skipped"])
    precision = [r for r in report.get("precision", []) if r["variant"] != "fp32"]
    if precision:
        figures.append(f"against fp32 at batch {precision[0]['batch_size']}: " + ", ".join(
            f"{r['variant']} {r['speedup']['median']:.2f}x" for r in precision))
    return figures


def bench(context, limit):
    out = context.folder("bench") / "bench.json"

    def read(finished):
        return bench_figures(library.read_json(out)), {}, None

    finished = context.command("bench", library.bench_quick(out, True, device=context.device),
                               limit)
    return from_process("the bench, 1 process", finished, context, read)
