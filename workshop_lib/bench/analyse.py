"""From raw timings to figures: medians with their spread, ratios within rounds, the floor.

The floor is a model of the all-reduce fitted to the bench's own sweep: a latency plus the
bytes each rank moves over the bus bandwidth. The exposed communication of a DDP step is
split into what synchronising the ranks costs (an all-reduce of one float), the model's
latency and bandwidth terms at the gradients' size, and what is left unaccounted.

``analyse(raw, plan)`` turns what the workers recorded (seconds per window, per
all-reduce, per epoch) into the report's sections; it runs no process and no model.
"""
import statistics

from workshop_lib import allreduce_model, data
from workshop_lib.bench.plan import (
    BUFFER_SYNC,
    COURSE,
    FLAT,
    NO_SYNC,
    SYNC,
    model_facts,
    run_key,
)
from workshop_lib.stopwatch import summary

LOOP_OVERHEAD_TARGET = 0.95


def per_round(numerators, denominators, scale=1.0):
    """Summary of ratios taken within each round (both runs saw the same machine load)."""
    return summary([a / b * scale for a, b in zip(numerators, denominators, strict=True)])


def analyse(raw, plan):
    """The report's figures: scaling, loop overhead, communication, data path, precision."""
    allreduce = allreduce_rows(raw["allreduce"])
    fits = {w: allreduce_model.fit(rows, w) for w, rows in allreduce.items()}
    facts = {c.name: model_facts(c, data.DATASETS[plan.dataset]) for c in plan.configs}
    n = plan.world_size
    return {
        "scaling": [row for config in plan.configs
                    for row in scaling_rows(raw, plan, config, fits, facts[config.name])],
        "loop_overhead": [loop_overhead_row(raw["loop_overhead"][c.name], c)
                          for c in plan.configs],
        "communication": {
            "allreduce": {str(w): rows for w, rows in allreduce.items()},
            # The highest median bandwidth measured: what a notebook can quote as this
            # machine's peak, instead of a constant from a datasheet.
            "peak_bus_bandwidth_gb_s": {
                str(w): max(r["bus_bandwidth_gb_s"]["median"] for r in rows)
                for w, rows in allreduce.items()},
            "allreduce_model": {str(w): fit for w, fit in fits.items()},
            "exposed": [exposed_row(raw, plan, c, fits[n], facts[c.name])
                        for c in plan.configs] if n > 1 else [],
            "trials": trial_rows(raw, plan, plan.configs[0], fits[n],
                                 facts[plan.configs[0].name]) if n > 1 else [],
        },
        "data_path": data_path_section(raw["data_path"], plan.configs[0]),
        "precision": [row for c in plan.configs if c.name in raw.get("precision", {})
                      for row in precision_rows(raw["precision"][c.name], c)],
        "inside_ddp": inside_ddp_section(raw["inside_ddp"], fits[n])
        if "inside_ddp" in raw else None,
    }


WRAPPERS = ("local", "naive", "overlap", "buckets", "ddp")  # notebook 07's order


def inside_ddp_section(timing, fit):
    """Notebook 07's wrappers: each one's step time and what it adds to the local step; the
    bucket sweep's step times beside the fitted all-reduce model's price for its messages
    (one latency per all-reduce, plus the bandwidth term of all the bytes)."""
    step_ms, world_size = timing["step_ms"], timing["world_size"]
    local = step_ms["local"]["median"]
    wrappers = [{"variant": name, "step_ms": step_ms[name],
                 "over_local_ms": step_ms[name]["median"] - local} for name in WRAPPERS]
    sweep = []
    for name in sorted((k for k in step_ms if k.startswith("buckets_")),
                       key=lambda k: int(k.split("_")[1])):
        messages = timing["messages"][name]
        sweep.append({"bucket_bytes": int(name.split("_")[1]), "all_reduces": len(messages),
                      "step_ms": step_ms[name],
                      "over_local_ms": step_ms[name]["median"] - local,
                      "predicted_ms": 1e3 * allreduce_model.predicted_s(fit, world_size,
                                                                        messages)})
    return {"world_size": world_size, "batch_size": timing["batch_size"],
            "dataset": timing["dataset"], "gradient_bytes": timing["gradient_bytes"],
            "wrappers": wrappers, "bucket_sweep": sweep}


def allreduce_rows(sweeps):
    """Per world size: each message size's time and bus bandwidth over its repetitions."""
    allreduce = {}
    for size, rows in sweeps.items():
        w = int(size)
        allreduce[w] = [{
            "bytes": row["bytes"],
            "seconds": summary(row["seconds"]),
            "bus_bandwidth_gb_s": summary(
                [row["bytes"] / s * 2 * (w - 1) / w / 1e9 for s in row["seconds"]]),
        } for row in rows]
    return allreduce


def step_s(raw, config, world_size, batch_size, variant=COURSE, trial_name=""):
    """Seconds per step of a window, one figure per round."""
    key = run_key(config.name, world_size, batch_size, variant, trial_name)
    return [s / raw["steps"][key] for s in raw["windows"][key]]


def samples_per_s(raw, config, world_size, batch_size, variant=COURSE):
    """Samples per second of a window over all its ranks, one figure per round."""
    return [batch_size * world_size / s
            for s in step_s(raw, config, world_size, batch_size, variant)]


def scaling_rows(raw, plan, config, fits, facts):
    """Weak and strong scaling of one config at every world size, against one process."""
    rows, n = [], plan.world_size
    for mode in ("weak", "strong"):
        def batch_for(w, mode=mode):
            return config.batch_size if mode == "weak" else config.batch_size * n // w
        base = samples_per_s(raw, config, 1, batch_for(1))
        one_step_s = statistics.median(step_s(raw, config, 1, batch_for(1)))
        for w in plan.world_sizes:
            sps = samples_per_s(raw, config, w, batch_for(w))
            predicted = host_s = None
            if mode == "weak" and w > 1:
                # One process's step, plus the fitted all-reduce (nothing overlapped), plus
                # DDP's host work among w: its no_sync step (hooks, buckets, no all-reduce)
                # over a step alone, timed where the plan has that window (at N).
                floor = allreduce_model.model_s(fits[w], w, facts["gradient_bytes"])["total_s"]
                if run_key(config.name, w, batch_for(w), NO_SYNC) in raw["windows"]:
                    host_s = max(0.0, statistics.median(
                        step_s(raw, config, w, batch_for(w), NO_SYNC)) - one_step_s)
                predicted = one_step_s / (one_step_s + floor + (host_s or 0.0))
            rows.append({
                "config": config.name, "model": config.label, "mode": mode,
                "world_size": w, "batch_size": batch_for(w),
                "global_batch_size": batch_for(w) * w,
                "samples_per_s": summary(sps), "speedup": per_round(sps, base),
                "efficiency": per_round(sps, base, 1 / w),
                "predicted_efficiency": predicted, "host_overhead_s": host_s,
            })
    return rows


def differences(a, b):
    return [x - y for x, y in zip(a, b, strict=True)]


def exposed_row(raw, plan, config, fit, facts):
    """At N processes: the course's DDP step against the same step under no_sync (the
    communication it exposes), split into the sync, latency and bandwidth terms and the
    rest; and against DDP's defaults (the buffer broadcast)."""
    n, b = plan.world_size, config.batch_size
    ddp, no_sync = step_s(raw, config, n, b), step_s(raw, config, n, b, NO_SYNC)
    sync, flat = step_s(raw, config, n, b, SYNC), step_s(raw, config, n, b, FLAT)
    buffer_sync = step_s(raw, config, n, b, BUFFER_SYNC)
    exposed = differences(ddp, no_sync)
    one_float = differences(sync, no_sync)  # synchronising once, whatever the bytes
    flat_cost = differences(flat, no_sync)  # one all-reduce of the gradients, no DDP
    floor = allreduce_model.model_s(fit, n, facts["gradient_bytes"])
    target = statistics.median(one_float) + 2 * floor["bandwidth_s"]
    return {
        "config": config.name, "model": config.label, "world_size": n, "batch_size": b,
        **facts,
        "ddp_step_s": summary(ddp), "no_sync_step_s": summary(no_sync),
        "exposed_s": summary(exposed), "exposed_fraction": per_round(exposed, ddp),
        "bus_bandwidth_gb_s": fit["bus_bandwidth_gb_s"],
        "floor": floor, "floor_s": floor["total_s"],
        "sync_step_s": summary(sync), "one_float_allreduce_s": summary(one_float),
        "flat_step_s": summary(flat), "flat_allreduce_s": summary(flat_cost),
        # exposed = sync + latency + bandwidth + unaccounted, round by round: the one-float
        # all-reduce is an all-reduce's latency plus the ranks waiting for each other. The
        # flat all-reduce splits the rest: what one all-reduce of the gradients' bytes
        # costs beyond the one float and the bandwidth term, and what DDP adds to that
        # (its hooks and copies, less what its overlap with backward saves).
        "breakdown": {
            "sync_s": summary([c - floor["latency_s"] for c in one_float]),
            "latency_s": floor["latency_s"], "bandwidth_s": floor["bandwidth_s"],
            "unaccounted_s": summary([e - c - floor["bandwidth_s"]
                                      for e, c in zip(exposed, one_float, strict=True)]),
            "large_message_s": summary([f - c - floor["bandwidth_s"]
                                        for f, c in zip(flat_cost, one_float, strict=True)]),
            "ddp_own_s": summary(differences(exposed, flat_cost)),
        },
        "target": {"exposed_at_most_s": target,
                   "met": statistics.median(exposed) <= target},
        "no_sync_efficiency": per_round(samples_per_s(raw, config, n, b, NO_SYNC),
                                        samples_per_s(raw, config, 1, b), 1 / n),
        # DDP(forward_sync_buffers=True), DDP's default: BatchNorm's running statistics
        # re-sent from rank 0 before every forward. The course's wrap does not (train_ddp).
        "buffer_sync_step_s": summary(buffer_sync),
        "buffer_sync_slowdown": per_round(buffer_sync, ddp),
    }


def trial_rows(raw, plan, config, fit, facts):
    """Each trial of the plan at the course's step, against the course's DDP step of the
    same rounds (speed-up), with its own split: exposed communication (its DDP step less
    its no_sync step), its one-float all-reduce, and the rest beyond those and the
    bandwidth term. Per micro-batch where a trial accumulates, the all-reduce's terms
    shared out over the micro-batches of a step."""
    n, b = plan.world_size, config.batch_size
    ddp, no_sync = step_s(raw, config, n, b), step_s(raw, config, n, b, NO_SYNC)
    rows = []
    for trial in plan.trials:
        if run_key(config.name, n, b, COURSE, trial.name) not in raw["windows"]:
            continue  # not runnable here (measure says why)
        tried, tried_no_sync, tried_sync = (step_s(raw, config, n, b, v, trial.name)
                                            for v in (COURSE, NO_SYNC, SYNC))
        exposed = differences(tried, tried_no_sync)
        one_float = differences(tried_sync, tried_no_sync)
        bandwidth = allreduce_model.model_s(fit, n, facts["gradient_bytes"])["bandwidth_s"] \
            / trial.accumulate
        target = statistics.median(one_float) + 2 * bandwidth
        speedup = per_round(ddp, tried)
        rows.append({
            "trial": trial.name, "what": trial.what, "config": config.name,
            "step_s": summary(tried), "speedup": speedup,
            "no_sync_step_s": summary(tried_no_sync),
            "no_sync_speedup": per_round(no_sync, tried_no_sync),
            "exposed_s": summary(exposed), "one_float_allreduce_s": summary(one_float),
            "bandwidth_s": bandwidth,
            "unaccounted_s": summary([e - c - bandwidth
                                      for e, c in zip(exposed, one_float, strict=True)]),
            "target": {"exposed_at_most_s": target,
                       "met": statistics.median(exposed) <= target},
            # Kept only if faster in every round: one fast round is noise.
            "faster_every_round": speedup["min"] > 1,
        })
    return rows


def loop_overhead_row(timings, config):
    library, bare = timings["library"], timings["bare"]
    library_rate = [library["samples"] / s for s in library["seconds"]]
    bare_rate = [bare["samples"] / s for s in bare["seconds"]]
    return {
        "config": config.name, "model": config.label, "batch_size": config.batch_size,
        "library_samples_per_s": summary(library_rate),
        "bare_samples_per_s": summary(bare_rate),
        "ratio": per_round(library_rate, bare_rate), "target": LOOP_OVERHEAD_TARGET,
        # The same ratio from CPU time: on a CPU (one thread, no workers, no
        # communication) the work itself, with other processes' share taken out.
        "ratio_by_cpu_time": per_round(bare["cpu_seconds"], library["cpu_seconds"],
                                       library["samples"] / bare["samples"]),
        "on_cpu_share": summary([c / s for t in (library, bare)
                                 for c, s in zip(t["cpu_seconds"], t["seconds"], strict=True)]),
    }


def data_path_section(path, config):
    rates = {name: [t["samples"] / s for s in t["seconds"]]
             for name, t in path["timings"].items()}
    rows = []
    for what in ("train", "load"):
        tensor_loader, data_loader = rates[f"{what}/tensor_loader"], rates[f"{what}/data_loader"]
        row = {"what": what,
               "tensor_loader_samples_per_s": summary(tensor_loader),
               "data_loader_samples_per_s": summary(data_loader),
               "ratio": per_round(tensor_loader, data_loader)}
        if f"{what}/shard_loader" in rates:  # record shards (notebook 06)
            shard_loader = rates[f"{what}/shard_loader"]
            row.update(shard_loader_samples_per_s=summary(shard_loader),
                       shard_ratio=per_round(tensor_loader, shard_loader))
        rows.append(row)
    return {"config": config.name, "model": config.label, "batch_size": config.batch_size,
            "workers": path["workers"], "worker_startup_s": path["worker_startup_s"],
            "rows": rows, "skipped": path.get("skipped")}


def precision_rows(timings, config):
    """fp32 against bf16, fp16 and gradient checkpointing at one step: speed and the
    memory each keeps for backward (and, on GPUs, the step's peak allocation)."""
    rates = {name: [t["samples"] / s for s in t["seconds"]]
             for name, t in timings["timings"].items()}
    saved, peak = timings["saved_bytes"], timings["peak_bytes"]
    rows = []
    for name in timings["timings"]:
        rows.append({
            "config": config.name, "model": config.label, "batch_size": config.batch_size,
            "variant": name, "samples_per_s": summary(rates[name]),
            "speedup": per_round(rates[name], rates["fp32"]),
            "saved_bytes": saved[name], "saved_ratio": saved[name] / saved["fp32"],
            "peak_bytes": peak[name],
            "peak_ratio": None if peak[name] is None else peak[name] / peak["fp32"],
        })
    return rows
