"""What each notebook's runs showed, as sentences computed from its run records.

Every notebook ends with "What you should have seen": one call here, which takes the run
records (``runlog.Run``) and results of that execution and returns ``Findings``. A
finding that judges (learned, faster, reproduced, ...) carries its verdict in ``holds``,
decided by a threshold stated in the sentence, so a test can feed synthetic records and
watch the sentence change; a part of a notebook that could not run on this machine
(one process, no GPU) is a finding too, saying what was skipped and why.
"""
from dataclasses import dataclass

from workshop_lib import runlog


@dataclass(frozen=True)
class Finding:
    key: str                 # a stable name, for tests and for the notebook's own use
    text: str                # the sentence the learner reads
    holds: bool | None = None  # the verdict, where the sentence judges; None otherwise
    skipped: bool = False    # this part did not run here; ``text`` says why


class Findings(list):
    """A list of ``Finding``; ``findings["key"]`` picks one by key."""

    def __getitem__(self, key):
        if isinstance(key, str):
            for finding in self:
                if finding.key == key:
                    return finding
            raise KeyError(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        return any(f.key == key for f in self) if isinstance(key, str) else \
            super().__contains__(key)

    def __add__(self, other):
        return Findings([*self, *other])

    def show(self):
        """Print one bullet per finding (what a notebook's closing cell does)."""
        print("\n".join(f"- {finding.text}" for finding in self))
        return self


def skipped(key, why):
    return Finding(key, f"Skipped: {why}", skipped=True)


# ----------------------------------------------------------------------------------------
# Notebook 00


LEARNED_FACTOR = 2  # a run "learned" when its accuracy is this many times chance or more


def welcome(first_run, profile, num_classes):
    """The machine, the profile and the first DDP run of notebook 00."""
    hardware = first_run.start["hardware"]
    names = sorted({gpu["name"] for gpu in hardware["gpus"]})
    found = Findings([
        Finding("machine", f"This machine: {len(hardware['gpus'])} GPU(s), {', '.join(names)}, "
                           f"{hardware['cpu_cores']} CPU cores." if names else
                f"This machine: no GPU that PyTorch can use, {hardware['cpu_cores']} CPU "
                f"cores."),
        Finding("profile", f"Profile {profile.name}: DDP launches run {profile.nproc} "
                           f"process(es) with the {profile.backend} backend; dataset "
                           f"{profile.dataset}, model {profile.model}, batch "
                           f"{profile.batch_size} per process."),
        Finding("first_run", f"Your first run: {first_run.start['world_size']} process(es) "
                             f"trained one model on a global batch of "
                             f"{first_run.start['global_batch_size']} for "
                             f"{len(first_run.epochs)} epochs at up to "
                             f"{max(first_run.column('samples_per_s')):,.0f} samples/s, in "
                             f"{first_run.end['elapsed_s']:.1f} s from the first step to the "
                             f"end (the cell took longer: every process first starts Python, "
                             f"imports PyTorch and joins the group)."),
    ])
    chance = 1 / num_classes
    final = first_run.final["val_acc"]
    learned = final >= LEARNED_FACTOR * chance
    found.append(Finding(
        "learned",
        f"Validation accuracy: {first_run.epochs[0]['val_acc']:.1%} after epoch 1, "
        f"{final:.1%} after epoch {first_run.final['epoch']}; guessing scores {chance:.0%}, "
        + (f"and {final:.1%} is at least {LEARNED_FACTOR}x that: the environment works."
           if learned else f"and {final:.1%} is below {LEARNED_FACTOR}x that: the model "
                           f"did not learn; look at the run's output above."),
        holds=learned))
    return found


# ----------------------------------------------------------------------------------------
# Notebook 04


FAIL_FAST_S = 60  # a failed job must end within this many seconds of the fault


def failures(results, nproc, hang_timeout_s, restarted_run=None):
    """Notebook 04: what each injected fault did. ``results`` maps "crash", "hang" and
    "restart" to a launch's ``outcome()`` (absent where skipped); ``restarted_run`` is the
    restarted job's run record (None if it wrote none)."""
    found = Findings()
    crash = results.get("crash")
    if crash is not None:
        seconds = crash["fault_to_exit_s"]
        fast = not crash["ok"] and seconds is not None and seconds < FAIL_FAST_S
        found.append(Finding("crash", (
            f"A crash on rank {crash['failed_rank']} ended the whole job {seconds:.0f} s after "
            f"the fault (the bar: {FAIL_FAST_S} s), and the summary named it: {crash['error']}"
        ) if fast else (
            f"The crash did not end the job within {FAIL_FAST_S} s of the fault (ok="
            f"{crash['ok']}, {seconds} s): read the launcher's output above."), holds=fast))
    hang = results.get("hang")
    if hang is None:
        found.append(skipped("hang", f"a collective that only some ranks call needs two "
                                     f"ranks or more; this execution ran {nproc}."))
    else:
        seconds, bound = hang["fault_to_exit_s"], hang_timeout_s + FAIL_FAST_S
        ended = not hang["ok"] and seconds is not None and seconds < bound
        found.append(Finding("hang", (
            f"A collective only some ranks called became an error {seconds:.0f} s after the "
            f"fault (timeout {hang_timeout_s} s), reported by rank {hang['failed_rank']}, the "
            f"one left waiting.") if ended else (
            f"The one-sided collective did not end in an error within {bound} s."),
            holds=ended))
    restart = results.get("restart")
    if restart is not None:
        resumed_at = [r["start_epoch"] for r in restarted_run.resumes] if restarted_run else []
        resumed = restart["ok"] and restart["attempts"] == 2 and resumed_at[:1] == [2]
        found.append(Finding("restart", (
            f"A killed rank cost one restart; the job resumed from its own checkpoint at "
            f"epoch {resumed_at[0]} and finished all {len(restarted_run.epochs)} epochs "
            f"(validation accuracy {restarted_run.final['val_acc']:.4f}).") if resumed else (
            f"The killed job did not resume from its checkpoint at epoch 2 (finished: "
            f"{restart['ok']}, attempts {restart['attempts']}, resumed at "
            f"{resumed_at or 'no epoch'})."), holds=resumed))
    return found


# ----------------------------------------------------------------------------------------
# Notebook 02


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


def shard_metrics(per_rank, global_accuracy, logged_accuracy):
    """Each rank's shard accuracy against the all-reduced one the DDP run logged."""
    low, high = min(r["accuracy"] for r in per_rank), max(r["accuracy"] for r in per_rank)
    return Findings([Finding(
        "shards", f"Rank shards' accuracies ranged from {low:.4f} to {high:.4f}; the "
                  f"all-reduced {global_accuracy:.4f} (logged by the run: "
                  f"{logged_accuracy:.4f}) is the model's validation accuracy.",
        holds=abs(global_accuracy - logged_accuracy) < 1e-9)])


def bench_scaling(bench):
    """The benchmark's weak-scaling efficiency against its all-reduce-floor prediction."""
    if bench is None:
        return Findings([skipped("bench", "the benchmark needs two processes or more.")])
    weak = [r for r in bench["scaling"] if r["mode"] == "weak" and r["world_size"] > 1]
    return Findings([Finding(
        f"bench_{r['config']}",
        f"The benchmark's {r['config']} step (batch {r['batch_size']} per process, "
        f"{r['world_size']} processes): weak-scaling efficiency "
        f"{r['efficiency']['median']:.2f} measured against {r['predicted_efficiency']:.2f} "
        f"predicted from the all-reduce floor.") for r in weak])


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


# ----------------------------------------------------------------------------------------
# Notebook 02: the worked example's promise, measured


# The worked example this course follows: one A100 at batch 64 (FP16), then 4 A100s at
# batch 256 with the learning rate scaled linearly: 12 h -> 3.5 h per epoch, the same
# accuracy within 0.2 percentage points of the single-GPU baseline.
SOURCE = {"devices": 4, "epoch_hours": (12.0, 3.5), "speedup": 12.0 / 3.5,
          "tolerance_pp": 0.2}
TARGET_FRACTION = 0.98  # time to target: the target is this fraction of the baseline's mean


def _mean(values):
    return sum(values) / len(values)


def _spread_pp(values):
    """Seed-to-seed spread of accuracies, in percentage points (max - min)."""
    return 100 * (max(values) - min(values))


def same_accuracy_in_less_time(baseline, scaled, tolerance_pp=SOURCE["tolerance_pp"]):
    """1 device against N at the global batch with the learning rate scaled, several seeds
    each (``baseline`` and ``scaled``: lists of Runs). Returns (Findings, table rows)."""
    n = scaled[0].start["world_size"]
    base_acc = [run.final["val_acc"] for run in baseline]
    scaled_acc = [run.final["val_acc"] for run in scaled]
    target = round(TARGET_FRACTION * _mean(base_acc), 3)
    epoch_s = {name: _mean([_mean(run.column("epoch_s")[1:] or run.column("epoch_s"))
                            for run in runs]) for name, runs in (("base", baseline),
                                                                 ("scaled", scaled))}
    reach = {name: [runlog.time_to_accuracy(run, target) for run in runs]
             for name, runs in (("base", baseline), ("scaled", scaled))}
    delta_pp = 100 * (_mean(scaled_acc) - _mean(base_acc))
    spread_pp = max(_spread_pp(base_acc), _spread_pp(scaled_acc))
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
            target_speedup = _mean(reach["base"]) / _mean(reach["scaled"])
            found.append(Finding(
                "target_speedup", f"Time to {target:.3f} validation accuracy "
                                  f"({TARGET_FRACTION:.0%} of the baseline's mean): "
                                  f"{_mean(reach['base']):.2f} s on 1 device, "
                                  f"{_mean(reach['scaled']):.2f} s on {n}: "
                                  f"{target_speedup:.2f}x.", holds=target_speedup > 1))
        else:
            missed = sum(t is None for t in reach["scaled"])
            found.append(Finding(
                "target_speedup", f"{missed} of {len(scaled)} scaled runs never reached "
                                  f"{target:.3f}: no time-to-accuracy speed-up to report.",
                holds=False))
    if spread_pp > tolerance_pp:
        found.append(Finding(
            "same_accuracy", f"Accuracy: {100 * _mean(base_acc):.2f}% on 1 device, "
                             f"{100 * _mean(scaled_acc):.2f}% on {n} ({delta_pp:+.2f} pp); "
                             f"whether that is within {tolerance_pp} pp is not shown here: "
                             f"the seeds alone spread the accuracy over {spread_pp:.2f} pp.",
            holds=None))
    else:
        within = abs(delta_pp) <= tolerance_pp
        found.append(Finding(
            "same_accuracy", f"Accuracy: {100 * _mean(base_acc):.2f}% on 1 device, "
                             f"{100 * _mean(scaled_acc):.2f}% on {n} ({delta_pp:+.2f} pp, seeds "
                             f"spread {spread_pp:.2f} pp): "
                             + (f"within the {tolerance_pp} pp tolerance." if within else
                                f"NOT within the {tolerance_pp} pp tolerance."), holds=within))
    rows = [{"setup": "1 device", "devices": 1,
             "epoch_s": epoch_s["base"], "speedup": 1.0, "accuracy": _mean(base_acc),
             "delta_pp": 0.0, "source_epoch": f"{SOURCE['epoch_hours'][0]:g} h",
             "source_speedup": "1.0x", "source_delta": "baseline"},
            {"setup": f"{n} devices, lr x{n}", "devices": n, "epoch_s": epoch_s["scaled"],
             "speedup": epoch_s["base"] / epoch_s["scaled"], "accuracy": _mean(scaled_acc),
             "delta_pp": delta_pp, "source_epoch": f"{SOURCE['epoch_hours'][1]:g} h",
             "source_speedup": f"{SOURCE['speedup']:.1f}x",
             "source_delta": f"within {SOURCE['tolerance_pp']} pp"}]
    return found, rows


def worked_example_table(rows):
    """The worked example's table: measured here, beside the source's figures."""
    return runlog.format_table(rows, {
        "setup": ("setup", ""), "epoch_s": ("s per epoch", ".2f"), "speedup": ("speed-up", ".2f"),
        "accuracy": ("val acc", ".4f"), "delta_pp": ("delta pp", "+.2f"),
        "source_epoch": ("source: per epoch", ""), "source_speedup": ("source: speed-up", ""),
        "source_delta": ("source: accuracy", "")})
