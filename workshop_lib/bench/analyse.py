"""From raw timings to figures: medians with their spread, ratios within rounds, the floor.

``analyse(raw, plan)`` turns what the workers recorded (seconds per window, per
all-reduce, per epoch) into the report's sections; it runs no process and no model.
"""
import math
import statistics

from workshop_lib import data
from workshop_lib.bench.plan import BUFFER_SYNC, COURSE, NO_SYNC, model_facts, run_key

LOOP_OVERHEAD_TARGET = 0.95


def summary(values):
    """Median, min, max and n of a list of numbers."""
    ordered = sorted(values)
    return {"median": statistics.median(ordered), "min": ordered[0], "max": ordered[-1],
            "n": len(ordered)}


def per_round(numerators, denominators, scale=1.0):
    """Summary of ratios taken within each round (both runs saw the same machine load)."""
    return summary([a / b * scale for a, b in zip(numerators, denominators, strict=True)])


def allreduce_floor_s(world_size, nbytes, bus_bandwidth_gb_s):
    """The ring all-reduce's minimum: each rank sends and receives 2(N-1)/N of the data."""
    return 2 * (world_size - 1) / world_size * nbytes / (bus_bandwidth_gb_s * 1e9)


def bus_bandwidth_at(rows, nbytes):
    """Measured bus bandwidth at ``nbytes``, interpolated in log-log between sizes."""
    points = [(row["bytes"], row["bus_bandwidth_gb_s"]["median"]) for row in rows]
    if nbytes <= points[0][0]:
        return points[0][1]
    for (b0, v0), (b1, v1) in zip(points, points[1:], strict=False):
        if nbytes <= b1:
            f = math.log(nbytes / b0) / math.log(b1 / b0)
            return math.exp(math.log(v0) + f * (math.log(v1) - math.log(v0)))
    return points[-1][1]


def analyse(raw, plan):
    """The report's figures: scaling, loop overhead, communication, data path."""
    allreduce = allreduce_rows(raw["allreduce"])
    facts = {c.name: model_facts(c, data.DATASETS[plan.dataset]) for c in plan.configs}
    return {
        "scaling": [row for config in plan.configs
                    for row in scaling_rows(raw, plan, config, allreduce, facts[config.name])],
        "loop_overhead": [loop_overhead_row(raw["loop_overhead"][c.name], c)
                          for c in plan.configs],
        "communication": {
            "allreduce": {str(w): rows for w, rows in allreduce.items()},
            # The highest median bandwidth measured: what a notebook can quote as this
            # machine's peak, instead of a constant from a datasheet.
            "peak_bus_bandwidth_gb_s": {
                str(w): max(r["bus_bandwidth_gb_s"]["median"] for r in rows)
                for w, rows in allreduce.items()},
            "exposed": [exposed_row(raw, plan, c, allreduce, facts[c.name])
                        for c in plan.configs] if plan.world_size > 1 else [],
        },
        "data_path": data_path_section(raw["data_path"], plan.configs[0]),
    }


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


def step_s(raw, config, world_size, batch_size, variant=COURSE):
    """Seconds per step of a window, one figure per round."""
    key = run_key(config.name, world_size, batch_size, variant)
    return [s / raw["steps"][key] for s in raw["windows"][key]]


def samples_per_s(raw, config, world_size, batch_size, variant=COURSE):
    """Samples per second of a window over all its ranks, one figure per round."""
    return [batch_size * world_size / s
            for s in step_s(raw, config, world_size, batch_size, variant)]


def scaling_rows(raw, plan, config, allreduce, facts):
    """Weak and strong scaling of one config at every world size, against one process."""
    rows, n = [], plan.world_size
    for mode in ("weak", "strong"):
        def batch_for(w, mode=mode):
            return config.batch_size if mode == "weak" else config.batch_size * n // w
        base = samples_per_s(raw, config, 1, batch_for(1))
        one_step_s = statistics.median(step_s(raw, config, 1, batch_for(1)))
        for w in plan.world_sizes:
            sps = samples_per_s(raw, config, w, batch_for(w))
            predicted = None
            if mode == "weak" and w > 1:
                # One process's step plus the all-reduce floor, nothing overlapped.
                bandwidth = bus_bandwidth_at(allreduce[w], facts["gradient_bytes"])
                floor = allreduce_floor_s(w, facts["gradient_bytes"], bandwidth)
                predicted = one_step_s / (one_step_s + floor)
            rows.append({
                "config": config.name, "model": config.label, "mode": mode,
                "world_size": w, "batch_size": batch_for(w),
                "global_batch_size": batch_for(w) * w,
                "samples_per_s": summary(sps), "speedup": per_round(sps, base),
                "efficiency": per_round(sps, base, 1 / w),
                "predicted_efficiency": predicted,
            })
    return rows


def exposed_row(raw, plan, config, allreduce, facts):
    """At N processes: the course's DDP step against the same step under no_sync (the
    communication it exposes) and against DDP's defaults (the buffer broadcast)."""
    n, b = plan.world_size, config.batch_size
    ddp, no_sync = step_s(raw, config, n, b), step_s(raw, config, n, b, NO_SYNC)
    buffer_sync = step_s(raw, config, n, b, BUFFER_SYNC)
    exposed = [d - s for d, s in zip(ddp, no_sync, strict=True)]
    bandwidth = bus_bandwidth_at(allreduce[n], facts["gradient_bytes"])
    return {
        "config": config.name, "model": config.label, "world_size": n, "batch_size": b,
        **facts,
        "ddp_step_s": summary(ddp), "no_sync_step_s": summary(no_sync),
        "exposed_s": summary(exposed), "exposed_fraction": per_round(exposed, ddp),
        "bus_bandwidth_gb_s": bandwidth,
        "floor_s": allreduce_floor_s(n, facts["gradient_bytes"], bandwidth),
        "no_sync_efficiency": per_round(samples_per_s(raw, config, n, b, NO_SYNC),
                                        samples_per_s(raw, config, 1, b), 1 / n),
        # DDP(forward_sync_buffers=True), DDP's default: BatchNorm's running statistics
        # re-sent from rank 0 before every forward. The course's wrap does not (train_ddp).
        "buffer_sync_step_s": summary(buffer_sync),
        "buffer_sync_slowdown": per_round(buffer_sync, ddp),
    }


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
        rows.append({"what": what,
                     "tensor_loader_samples_per_s": summary(tensor_loader),
                     "data_loader_samples_per_s": summary(data_loader),
                     "ratio": per_round(tensor_loader, data_loader)})
    return {"config": config.name, "model": config.label, "batch_size": config.batch_size,
            "workers": path["workers"], "worker_startup_s": path["worker_startup_s"],
            "rows": rows}
