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
    """The benchmark's weak-scaling efficiency against its all-reduce-floor prediction;
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
        f"predicted from the all-reduce floor. "
        + gustafson(r["world_size"], r["efficiency"]["median"])) for r in weak])


def gustafson_serial(scaled_speedup, n):
    """Gustafson's serial share s (of the N-process time) from a scaled speed-up
    N - s(N - 1) (Gustafson, 1988): s = (N - scaled speed-up) / (N - 1)."""
    return (n - scaled_speedup) / (n - 1)


def gustafson(n, efficiency):
    """Weak scaling read with Gustafson's law: the scaled speed-up is N x the efficiency
    (N processes did N times the one process's work per step)."""
    scaled = n * efficiency
    serial = gustafson_serial(scaled, n)
    said = f"Gustafson's scaled speed-up, N x efficiency = {scaled:.2f}"
    if serial < 0:
        return f"{said}, is above N, which N - s(N - 1) cannot give: no serial share."
    if serial > 1:
        return (f"{said}, is under 1, which N - s(N - 1) cannot give for a serial share s "
                f"of at most 1: the time the processes added outgrew the step's work.")
    return (f"{said}, is N - s(N - 1) with s = {serial:.2f}, the share of the "
            f"{n}-process step that did not grow with the problem.")


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


# Amdahl's law (Amdahl, 1967): if a fraction s of the one-process time does not divide over
# N processes, they take s + (1 - s) / N of it: speed-up S = 1 / (s + (1 - s) / N), never
# above 1 / s. Solved for s from one measured S (Karp and Flatt, 1990, proposed it as a
# measurement): s = (N / S - 1) / (N - 1).
ALMOST_PARALLEL = 0.05  # a serial fraction up to this: "almost all the work divided"
PREDICT_AT = (4, 8)     # process counts the fitted law is extrapolated to


def serial_fraction(speedup, n):
    """Amdahl's serial fraction that explains a speed-up ``speedup`` on ``n`` processes."""
    return (n / speedup - 1) / (n - 1)


def amdahl_speedup(serial, n):
    """Amdahl's speed-up on ``n`` processes for a serial fraction ``serial`` (0 <= s <= 1)."""
    return 1 / (serial + (1 - serial) / n)


def speedup_reading(baseline, scaled):
    """1 process against N, read from their runs: ``(n, t1, tn, speedup, serial, on_cpu)``,
    the epoch seconds of each, S = t1/tn and the serial fraction; None when the scaled runs
    had one process (nothing to read)."""
    n = scaled[0].start["world_size"]
    if n < 2:
        return None
    t1, tn = epoch_seconds(baseline), epoch_seconds(scaled)
    speedup = t1 / tn
    on_cpu = not str(scaled[0].start["device"]).startswith("cuda")
    return n, t1, tn, speedup, serial_fraction(speedup, n), on_cpu


def amdahl(baseline, scaled):
    """Amdahl's law on the promise's own epochs: 1 process against N at the same batch per
    process (weak scaling in the scaling tables' words), the same training set per epoch
    divided over the N. s is measured from S as Karp and Flatt proposed; it absorbs the time
    the N processes added (the all-reduce, waiting), so it predicts to more processes only
    where they bring more compute (GPUs), never on a CPU whose cores they share.
    ``baseline``, ``scaled``: lists of Runs."""
    reading = speedup_reading(baseline, scaled)
    if reading is None:
        return Findings([skipped("amdahl", "the scaled runs had one process: no speed-up to "
                                           "fit Amdahl's law to (nproc is 1).")])
    n, t1, tn, speedup, serial, on_cpu = reading
    measured = (f"An epoch took {t1:.2f} s on 1 process and {tn:.2f} s on {n}: speed-up "
                f"S = {speedup:.2f}, so the serial fraction (Karp-Flatt: Amdahl's law "
                f"solved for s) s = (N/S - 1)/(N - 1) = "
                f"({n}/{speedup:.3f} - 1)/({n} - 1) = {serial:.2f}.")
    if serial < 0:
        return Findings([Finding("amdahl", f"{measured} Below 0: faster than {n} times, "
                                 f"which Amdahl's law cannot give (no work divides better "
                                 f"than evenly); something else changed, such as each "
                                 f"process's smaller share of the data fitting its caches. "
                                 f"No serial fraction, no prediction.", holds=None)])
    if serial >= 1:
        return Findings([Finding("amdahl", f"{measured} At 1 or more: the {n} processes "
                                 f"were no faster than one, so the time that did not shrink "
                                 f"with N is the whole one-process epoch or more. Serial "
                                 f"work alone cannot do that (at most all of the work is "
                                 f"serial, and then S = 1): the overhead outgrew the work, "
                                 f"time the processes added (the all-reduce, waiting for "
                                 f"each other"
                                 + (", sharing the cores the one process had to itself"
                                    if on_cpu else "") +
                                 "). No prediction to more processes.", holds=False)])
    small = serial <= ALMOST_PARALLEL
    predicted = ", ".join(f"{amdahl_speedup(serial, p):.1f}x on {p}" for p in PREDICT_AT)
    ceiling = f"the ceiling 1/s = {1 / serial:.1f}x" if serial > 0 else "no ceiling (s = 0)"
    verdict = (f"at most {ALMOST_PARALLEL}: almost all of the epoch's work divided over the "
               f"processes." if small else
               f"above {ALMOST_PARALLEL}: {serial:.0%} of the one-process epoch behaves as "
               f"serial work, time that did not shrink with N.")
    if on_cpu:
        outlook = ("On this CPU the processes share its cores, so more processes bring no "
                   "more compute: no prediction to more processes here.")
    else:
        outlook = (f"If s stayed the same, Amdahl's law predicts {predicted}, and {ceiling} "
                   f"however many processes. A prediction from two points: s holds time the "
                   f"one process never had (the all-reduce, waiting for the slowest rank), "
                   f"so it holds only while that time stays the same size as N grows (the "
                   f"all-reduce's changes with N).")
    return Findings([Finding("amdahl", f"{measured} s is {verdict} {outlook}", holds=small)])
