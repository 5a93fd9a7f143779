"""Notebook 02, From one GPU to many with DDP: its closing findings, computed from its runs."""
import math

from workshop_lib import data, runlog
from workshop_lib.findings import base
from workshop_lib.findings.base import Finding, Findings, mean, skipped


def one_vs_many(single, ddp):
    """1 process against N processes at the same per-process batch (weak scaling)."""
    n = ddp.start["world_size"]
    if n < 2:
        return Findings([skipped("speedup", "the DDP run had one process, so there is no "
                                            "speed-up to measure (nproc is 1).")])
    speedup = ddp.samples_per_s / single.samples_per_s
    return Findings([Finding(
        "speedup",
        f"{n} processes trained at {ddp.samples_per_s:,.0f} samples/s against "
        f"{single.samples_per_s:,.0f} for one process: a {speedup:.2f}x speed-up, scaling "
        f"efficiency {speedup / n:.2f} (global batch {ddp.start['global_batch_size']} "
        f"against {single.start['global_batch_size']}).", holds=speedup > 1)])


# A GPU run's predictions recomputed on the CPU: cuDNN's TF32 convolutions (on by default
# on Ampere and later) and another summation order move the logits by about 1e-3, which
# flips the argmax of a sample whose two best classes are that close. So the counts of a
# GPU run may differ by a few samples: at most this share of them (and at least
# FLIPS_ALLOWED_MIN); a CPU run's must be the same.
FLIPS_ALLOWED_SHARE, FLIPS_ALLOWED_MIN = 0.001, 2


def flips_allowed(samples, run_device):
    """Predictions a re-evaluation on the CPU may change in a run made on ``run_device``."""
    if not str(run_device).startswith("cuda"):
        return 0
    return max(FLIPS_ALLOWED_MIN, math.ceil(FLIPS_ALLOWED_SHARE * samples))


def shard_metrics(per_rank, global_accuracy, logged_accuracy, run_device="cpu"):
    """Each rank's shard accuracy, re-evaluated here on the CPU, against the all-reduced
    one the DDP run logged on ``run_device``."""
    low, high = min(r["accuracy"] for r in per_rank), max(r["accuracy"] for r in per_rank)
    samples = sum(r["samples"] for r in per_rank)
    apart = round(abs(global_accuracy - logged_accuracy) * samples)  # predictions
    allowed = flips_allowed(samples, run_device)
    bar = (f"up to {allowed} allowed: on the GPU, TF32 convolutions can flip near-tied "
           f"predictions" if allowed else "a CPU run's must match exactly")
    return Findings([Finding(
        "shards", f"Rank shards' accuracies ranged from {low:.4f} to {high:.4f}; the "
                  f"all-reduced {global_accuracy:.4f} (logged by the run on {run_device}: "
                  f"{logged_accuracy:.4f}, {apart} of {samples} predictions apart; {bar}) "
                  + ("is the model's validation accuracy." if apart <= allowed else
                     "differs from it: the logged accuracy is not the all-reduced one."),
        holds=apart <= allowed)])


def bench_scaling(bench, nproc=None):
    """The benchmark's weak-scaling efficiency against its prediction (one process's step,
    the all-reduce floor, DDP's host work among N where the bench timed it);
    ``bench`` None: it did not run (one process, or the optional part was skipped)."""
    if bench is None:
        if nproc is not None and nproc >= 2:
            return Findings([skipped("bench", "the optional benchmark (section 4) was not "
                                              "run.")])
        return Findings([skipped("bench", "the benchmark needs two processes or more.")])
    weak = [r for r in bench["scaling"] if r["mode"] == "weak" and r["world_size"] > 1]
    return Findings([Finding(
        f"bench_{r['config']}",
        f"The benchmark's {r['config']} step (batch {r['batch_size']} per process, "
        f"{r['world_size']} processes): weak-scaling efficiency "
        f"{r['efficiency']['median']:.2f} measured against {r['predicted_efficiency']:.2f} "
        f"predicted from one process's step, the all-reduce floor"
        + (f" and DDP's host work ({1e3 * r['host_overhead_s']:.2f} ms a step: its no_sync "
           f"step among {r['world_size']} over a step alone)"
           if r.get("host_overhead_s") is not None else "") + ". "
        + step_overhead(r["world_size"], r["efficiency"]["median"])) for r in weak])


def step_overhead(n, efficiency):
    """Weak scaling read as each step's overhead: with E = a step alone / a step among N,
    each step among N cost 1/E - 1 more than alone, time every process pays on every step
    (the scaling comment below), not serial work."""
    if efficiency > 1:
        return (f"Above 1: a step among {n} was cheaper than alone, which overhead cannot "
                f"give; something else changed.")
    return (f"Each step among {n} cost {1 / efficiency - 1:.0%} more than a step alone: "
            f"parallel overhead every process pays on every step (the all-reduce not "
            f"hidden, DDP's host work, waiting for the slowest rank), which lowers the "
            f"efficiency at any N and sets no ceiling.")


def from_scratch(check):
    """The from-scratch wrapper against DistributedDataParallel (``naive_ddp`` output)."""
    difference = check["max_abs_difference"]
    same = difference < 1e-5
    return Findings([Finding(
        "from_scratch", f"Two collectives (broadcast, all-reduce) reproduce DDP: largest "
                        f"parameter difference after {check['steps']} steps {difference:.1e} "
                        f"(the bar: 1e-5, float32 rounding)." if same else
        f"The from-scratch wrapper differs from DDP by {difference:.1e} after "
        f"{check['steps']} steps (more than the 1e-5 of float32 rounding).", holds=same)])


# The worked example this course follows: one A100 at batch 64 (FP16), then 4 A100s at
# batch 256 with the learning rate scaled linearly: 12 h -> 3.5 h per epoch, the same
# accuracy within 0.2 percentage points of the single-GPU baseline.
SOURCE = {"devices": 4, "epoch_hours": (12.0, 3.5), "speedup": 12.0 / 3.5,
          "tolerance_pp": 0.2}
TARGET_FRACTION = 0.98  # time to target: the target is this fraction of the baseline's mean


def epoch_seconds(runs):
    """The seconds of a training epoch, mean over ``runs`` (seeds) of each run's mean
    epoch after its first (the first also pays for warming up; a one-epoch run keeps it)."""
    return mean([mean(run.column("epoch_s")[1:] or run.column("epoch_s")) for run in runs])


def same_accuracy_in_less_time(baseline, scaled, tolerance_pp=SOURCE["tolerance_pp"]):
    """1 device against N at the global batch with the learning rate scaled, several seeds
    each (``baseline`` and ``scaled``: lists of Runs). Returns (Findings, table rows)."""
    n = scaled[0].start["world_size"]
    base_acc = [run.final["val_acc"] for run in baseline]
    scaled_acc = [run.final["val_acc"] for run in scaled]
    target = round(TARGET_FRACTION * mean(base_acc), 3)
    epoch_s = {"base": epoch_seconds(baseline), "scaled": epoch_seconds(scaled)}
    reach = {name: [runlog.time_to_accuracy(run, target) for run in runs]
             for name, runs in (("base", baseline), ("scaled", scaled))}
    delta_pp = 100 * (mean(scaled_acc) - mean(base_acc))
    spread_pp = max(base.spread_pp(base_acc), base.spread_pp(scaled_acc))
    found = Findings()
    if n < 2:
        found.append(skipped("speedup", "the scaled runs had one process: no speed-up to "
                                        "measure (nproc is 1)."))
    else:
        epoch_speedup = epoch_s["base"] / epoch_s["scaled"]
        found.append(Finding(
            "epoch_speedup", f"An epoch took {epoch_s['base']:.2f} s on 1 device and "
                             f"{epoch_s['scaled']:.2f} s on {n}: {epoch_speedup:.2f}x "
                             f"(the worked example: {SOURCE['speedup']:.1f}x on "
                             f"{SOURCE['devices']} GPUs).", holds=epoch_speedup > 1))
        if all(t is not None for t in reach["base"] + reach["scaled"]):
            target_speedup = mean(reach["base"]) / mean(reach["scaled"])
            found.append(Finding(
                "target_speedup", f"Time to {target:.3f} validation accuracy "
                                  f"({TARGET_FRACTION:.0%} of the baseline's mean): "
                                  f"{mean(reach['base']):.2f} s on 1 device, "
                                  f"{mean(reach['scaled']):.2f} s on {n}: "
                                  f"{target_speedup:.2f}x.", holds=target_speedup > 1))
        else:
            missed = sum(t is None for t in reach["scaled"])
            found.append(Finding(
                "target_speedup", f"{missed} of {len(scaled)} scaled runs never reached "
                                  f"{target:.3f}: no time-to-accuracy speed-up to report.",
                holds=False))
    if spread_pp > tolerance_pp:
        found.append(Finding(
            "same_accuracy", f"Accuracy: {100 * mean(base_acc):.2f}% on 1 device, "
                             f"{100 * mean(scaled_acc):.2f}% on {n} ({delta_pp:+.2f} pp); "
                             f"whether that is within {tolerance_pp} pp is not shown here: "
                             f"the seeds alone spread the accuracy over {spread_pp:.2f} pp.",
            holds=None))
    else:
        within = abs(delta_pp) <= tolerance_pp
        found.append(Finding(
            "same_accuracy", f"Accuracy: {100 * mean(base_acc):.2f}% on 1 device, "
                             f"{100 * mean(scaled_acc):.2f}% on {n} ({delta_pp:+.2f} pp, seeds "
                             f"spread {spread_pp:.2f} pp): "
                             + (f"within the {tolerance_pp} pp tolerance." if within else
                                f"NOT within the {tolerance_pp} pp tolerance."), holds=within))
    rows = [{"setup": "1 device", "devices": 1,
             "epoch_s": epoch_s["base"], "speedup": 1.0, "accuracy": mean(base_acc),
             "delta_pp": 0.0, "source_epoch": f"{SOURCE['epoch_hours'][0]:g} h",
             "source_speedup": "1.0x", "source_delta": "baseline"},
            {"setup": f"{n} devices, lr x{n}", "devices": n, "epoch_s": epoch_s["scaled"],
             "speedup": epoch_s["base"] / epoch_s["scaled"], "accuracy": mean(scaled_acc),
             "delta_pp": delta_pp, "source_epoch": f"{SOURCE['epoch_hours'][1]:g} h",
             "source_speedup": f"{SOURCE['speedup']:.1f}x",
             "source_delta": f"within {SOURCE['tolerance_pp']} pp"}]
    return found, rows


def tolerance_resolution(run, tolerance_pp=SOURCE["tolerance_pp"]):
    """Can the validation set ``run`` was judged on (its ``val_samples``, counted over the
    ranks) resolve an accuracy difference of ``tolerance_pp``? Only where one image weighs
    less than the tolerance: otherwise one image's flip between two runs exceeds it."""
    n_val, dataset = run.final.get("val_samples"), run.start["dataset"]
    if not n_val:
        return Findings([skipped("resolution", "the run recorded no validation count.")])
    image_pp = 100 / n_val
    resolvable = image_pp < tolerance_pp
    if resolvable:
        return Findings([Finding(
            "resolution", f"The validation set ({dataset}) has {n_val:,} images: one image "
                          f"is {image_pp:.2f} pp of accuracy, under the {tolerance_pp} pp "
                          f"tolerance, so it can resolve the tolerance (whether the verdict is "
                          f"shown is then the seeds' spread).", holds=True)])
    needed = math.floor(100 / tolerance_pp) + 1
    larger = [info for info in data.DATASETS.values()
              if info.val_size and 100 / info.val_size < tolerance_pp]
    remedy = ", ".join(f"{info.name}'s {info.val_size:,} (one image {100 / info.val_size:.2f} "
                       f"pp)" for info in larger)
    return Findings([Finding(
        "resolution", f"The validation set ({dataset}) has {n_val:,} images: one image is "
                      f"{image_pp:.2f} pp of accuracy, more than the {tolerance_pp} pp "
                      f"tolerance, so one image's flip between two runs already exceeds it "
                      f"and this set cannot resolve it. It takes {needed:,} validation "
                      f"images or more (one image under {tolerance_pp} pp)"
                      + (f": {remedy}, the GPU profile's dataset, resolves it." if remedy
                         else "."), holds=False)])


def same_numbers(difference, steps, tolerance):
    """The learner's from-scratch wrapper against DDP, from its check: ``difference`` is the
    largest parameter difference after ``steps`` steps (None: the check's job failed)."""
    if difference is None:
        return Findings([Finding(
            "same_numbers", "No numbers to compare yet: the check's job did not finish. Fix "
                            "what its reason says and run the check again.", holds=False)])
    same = difference <= tolerance
    return Findings([Finding(
        "same_numbers",
        f"Same numbers: after {steps} steps your wrapper's parameters are DDP's within "
        f"{difference:.1e} (the bar: {tolerance:.0e}, float32 rounding)." if same else
        f"Not the same numbers yet: after {steps} steps your wrapper's parameters differ "
        f"from DDP's by {difference:.1e}, more than float32 rounding ({tolerance:.0e}); "
        f"the check's reason says what to fix.", holds=same)])


# The words of a DDP job, each with the variable torchrun sets in every worker.
VOCABULARY = {
    "node": "a machine of the job; its agent's index is GROUP_RANK",
    "world size": "the processes of the whole job (WORLD_SIZE)",
    "global rank": "a process's index in the job, 0 .. world size - 1 (RANK)",
    "local rank": "its index on its node: which GPU it takes (LOCAL_RANK)",
}


def rank_vocabulary(run):
    """The vocabulary with a DDP run's own values (its run record: world size, nodes, the
    device of rank 0), one row per process, as torchrun numbers them: node-major, so
    global rank = node x processes per node + local rank. Returns (rows, text)."""
    world_size, nodes = run.start["world_size"], run.start.get("nodes", 1)
    per_node = world_size // nodes
    on_gpus = str(run.start["device"]).startswith("cuda")
    rows = [{"node": rank // per_node, "world_size": world_size, "rank": rank,
             "local_rank": rank % per_node,
             "device": f"cuda:{rank % per_node}" if on_gpus else "cpu"}
            for rank in range(world_size)]
    table = runlog.format_table(rows, {
        "node": ("node", "d"), "world_size": ("world size", "d"),
        "rank": ("global rank", "d"), "local_rank": ("local rank", "d"),
        "device": ("device", "")})
    words = "\n".join(f"{word:>11}: {meaning}" for word, meaning in VOCABULARY.items())
    return rows, f"{table}\n\n{words}"


def worked_example_table(rows):
    """The worked example's table: measured here, beside the source's figures."""
    return runlog.format_table(rows, {
        "setup": ("setup", ""), "epoch_s": ("s per epoch", ".2f"), "speedup": ("speed-up", ".2f"),
        "accuracy": ("val acc", ".4f"), "delta_pp": ("delta pp", "+.2f"),
        "source_epoch": ("source: per epoch", ""), "source_speedup": ("source: speed-up", ""),
        "source_delta": ("source: accuracy", "")})


# Weak scaling: the batch per process kept, the epoch's training set divided, so each of N
# processes runs 1/N of the steps, each with the one process's compute. Its efficiency is
# E = S/N = T1 / (N TN): per step, a step alone against a step among N. What a step among N
# costs beyond one alone (the gradient all-reduce not hidden behind the backward pass,
# DDP's host work, waiting for the slowest rank) every process pays on each of its steps:
# parallel overhead, which shrinks with N no more than the compute does, so it lowers E and
# puts no ceiling on the speed-up. Amdahl's serial fraction (Amdahl, 1967) is work done once
# whatever N (start-up, evaluation on one rank, data preparation): not in an epoch's time,
# and measured only from two or more process counts.
EFFICIENT = 0.9        # E at least this: "near-linear"
PREDICT_AT = (8, 64)   # process counts the per-step overhead is carried to


def weak_scaling_reading(baseline, scaled):
    """1 process against N, read from their runs (``baseline``, ``scaled``: lists of Runs):
    a dict of ``n``, the epoch seconds ``t1`` and ``tn``, ``speedup`` S, ``efficiency``
    E = S/N, the seconds of one step alone (``step1``) and among N (``stepn``), their
    difference ``overhead``, and ``on_cpu``; None when the scaled runs had one process."""
    n = scaled[0].start["world_size"]
    if n < 2:
        return None
    t1, tn = epoch_seconds(baseline), epoch_seconds(scaled)
    step1 = t1 / mean([run.start["steps_per_epoch"] for run in baseline])
    stepn = tn / mean([run.start["steps_per_epoch"] for run in scaled])
    return {"n": n, "t1": t1, "tn": tn, "speedup": t1 / tn, "efficiency": t1 / tn / n,
            "step1": step1, "stepn": stepn, "overhead": stepn - step1,
            "on_cpu": not str(scaled[0].start["device"]).startswith("cuda")}


def scaling_efficiency(baseline, scaled):
    """Weak scaling on the promise's own epochs: the efficiency E = S/N, each step among N
    against a step alone, and what the difference is (module comment above)."""
    r = weak_scaling_reading(baseline, scaled)
    if r is None:
        return Findings([skipped("scaling", "the scaled runs had one process: no speed-up "
                                            "to read (nproc is 1).")])
    n, e = r["n"], r["efficiency"]
    measured = (f"An epoch took {r['t1']:.2f} s on 1 process and {r['tn']:.2f} s on {n}, "
                f"each of the {n} running 1/{n} of the steps at the same batch: speed-up "
                f"S = {r['speedup']:.2f}, efficiency E = S/N = {e:.2f}. A step took "
                f"{r['step1'] * 1e3:.1f} ms alone and {r['stepn'] * 1e3:.1f} ms among {n}.")
    if e > 1.05:
        return Findings([Finding("scaling", f"{measured} Faster than {n} times: each step "
                                 f"among {n} was cheaper than alone, so something else "
                                 f"changed (each process's smaller share of the data fitting "
                                 f"its caches); no reading of overhead.", holds=None)])
    holds = e >= EFFICIENT
    extra = (f"Each step among {n} cost {r['overhead'] * 1e3:.1f} ms more "
             f"({r['overhead'] / r['stepn']:.0%} of it): time every process pays on every "
             f"one of its steps, for the all-reduce not hidden behind the backward pass, "
             f"DDP's work on the host and waiting for the slowest rank. That is parallel "
             f"overhead, not serial work: it shrinks with N as little as the compute does, "
             f"so it lowers E and sets no ceiling.")
    verdict = (f"E is at least {EFFICIENT}: near-linear." if holds else
               f"E is below {EFFICIENT}: {1 - e:.0%} of the {n} processes' time went to "
               f"something other than the one process's work.")
    if r["on_cpu"]:
        outlook = ("On this CPU the processes share its cores, so a step among N also has "
                   "less compute each: more processes bring no more, and there is no "
                   "prediction to more of them here.")
    else:
        predicted = ", ".join(f"{e * p:.1f}x on {p}" for p in PREDICT_AT)
        outlook = (f"If the overhead stays {r['overhead'] * 1e3:.1f} ms a step as N grows (a "
                   f"ring all-reduce moves 2(N-1)/N times the gradient per rank, under twice "
                   f"it whatever N, over links of the same speed), E stays {e:.2f}: "
                   f"{predicted}, a straight line. "
                   f"What bends it is overhead that grows with N (a slower link between "
                   f"nodes, more ranks to wait for) and the serial work outside the epoch "
                   f"(start-up, evaluation on one rank), which Amdahl's law describes and "
                   f"runs at two or more process counts measure.")
    return Findings([Finding("scaling", f"{measured} {verdict} {extra} {outlook}",
                             holds=holds)])
