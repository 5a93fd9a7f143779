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
from workshop_lib.inside_ddp import allreduce, fsdp


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


# ----------------------------------------------------------------------------------------
# Notebook 01


GAP_PP = 1.0           # an accuracy difference smaller than this is no gap (digits: 3 samples)
UNDERTRAINED = 2.0     # a training loss this many times the reference's: under-trained
RECOVERED = 0.5        # a rule "restores" accuracy when it wins back this share of the gap


def toy(runs, problem):
    """The SGD toy: per-epoch progress and noise of full batch, mini-batch, one sample."""
    best = problem.loss(*problem.best_params())
    full, *_, single = runs
    return Findings([Finding(
        "toy", f"Toy, {full.epochs[-1]:.0f} epochs at lr {full.lr:g}: "
               + ", ".join(f"{run.label} ended at loss {run.final_loss:.3f}" for run in runs)
               + f" (best possible {best:.3f}); the loss rose after "
               + ", ".join(f"{run.noisiness():.0%} of {run.label} steps" for run in runs) + ".",
        holds=single.final_loss < full.final_loss)])


def peak_samples_per_s(run):
    return max(run.column("samples_per_s"))


def fixed_epoch_gap(reference, large):
    """Same learning rate, same epochs: what k times the batch did to steps, loss, accuracy."""
    k = large.start["global_batch_size"] // reference.start["global_batch_size"]
    steps = [run.start["steps_per_epoch"] * len(run.epochs) for run in (reference, large)]
    gap_pp = 100 * (reference.final["val_acc"] - large.final["val_acc"])
    loss_ratio = large.final["train_loss"] / reference.final["train_loss"]
    said = (f"At the same learning rate and {len(large.epochs)} epochs, batch "
            f"{large.start['global_batch_size']} took {steps[1]} optimizer steps against "
            f"{steps[0]} for batch {reference.start['global_batch_size']} ({k}x fewer): its "
            f"training loss ended {loss_ratio:.1f}x higher and its validation accuracy "
            f"{gap_pp:.1f} pp lower ({large.final['val_acc']:.3f} against "
            f"{reference.final['val_acc']:.3f}). ")
    if gap_pp >= GAP_PP and loss_ratio >= UNDERTRAINED:
        said += (f"A gap (>= {GAP_PP} pp) of an under-trained model (training loss >= "
                 f"{UNDERTRAINED:g}x): at a fixed budget of epochs the large batch lacks steps.")
    elif gap_pp >= GAP_PP:
        said += f"A gap (>= {GAP_PP} pp) with a training loss as low: not under-training."
    else:
        said += f"No accuracy gap at this budget (under {GAP_PP} pp)."
    return Finding("gap", said, holds=gap_pp >= GAP_PP)


def rule_restores(reference, large, scaled, rule="linear"):
    """Whether the learning-rate ``rule`` at the large batch wins back the gap."""
    gap = reference.final["val_acc"] - large.final["val_acc"]
    won = scaled.final["val_acc"] - large.final["val_acc"]
    share = won / gap if gap > 0 else float("nan")
    holds = gap > 0 and share >= RECOVERED
    return Finding(f"{rule}_restores", (
        f"With the {rule} rule (lr {scaled.start['lr']:g}) batch "
        f"{scaled.start['global_batch_size']} ended at {scaled.final['val_acc']:.3f}: "
        + (f"{share:.0%} of the gap won back (the bar: {RECOVERED:.0%})." if gap > 0 else
           "there was no gap to win back.")), holds=holds)


def time_to_accuracy(runs, target_fraction=0.97):
    """Which batch reached a target accuracy in the least training time."""
    target = round(target_fraction * max(run.best_val_acc for run in runs), 2)
    times = {run.start["global_batch_size"]: runlog.time_to_accuracy(run, target)
             for run in runs}
    reached = {batch: t for batch, t in times.items() if t is not None}
    fastest = min(reached, key=reached.get) if reached else None
    busiest = max(runs, key=peak_samples_per_s).start["global_batch_size"]
    never = [str(b) for b, t in times.items() if t is None]
    return Findings([Finding(
        "time_to_accuracy",
        (f"Time to {target:.2f} validation accuracy: batch {fastest} was fastest "
         f"({reached[fastest]:.2f} s of training); the highest throughput was batch "
         f"{busiest}'s" + (f"; batch {', '.join(never)} never got there" if never else "")
         + ".") if fastest else f"No batch reached {target:.2f}.",
        holds=fastest is not None and fastest != busiest)]), times, target


def batch_size_sweep(same_lr, linear, reference_batch):
    """Notebook 01's real-model sweep: ``same_lr`` runs sorted by batch, ``linear`` the
    largest batch with the linear rule."""
    reference = next(r for r in same_lr if r.start["global_batch_size"] == reference_batch)
    smallest, largest = same_lr[0], same_lr[-1]
    ratio = peak_samples_per_s(largest) / peak_samples_per_s(smallest)
    found = Findings([Finding(
        "throughput", f"Throughput: batch {largest.start['global_batch_size']} trained at "
                      f"{peak_samples_per_s(largest):,.0f} samples/s, {ratio:.1f}x batch "
                      f"{smallest.start['global_batch_size']}'s "
                      f"{peak_samples_per_s(smallest):,.0f}.", holds=ratio > 1),
        fixed_epoch_gap(reference, largest)])
    if linear is not None:
        found.append(rule_restores(reference, largest, linear))
    return found + time_to_accuracy(same_lr)[0]


# ----------------------------------------------------------------------------------------
# Notebook 03


def _rescue(name, what, broken, rescued, reference):
    """Whether ``rescued`` wins back at least RECOVERED of what ``broken`` lost against
    ``reference``."""
    lost = reference.final["val_acc"] - broken.final["val_acc"]
    won = rescued.final["val_acc"] - broken.final["val_acc"]
    holds = lost > 0 and won >= RECOVERED * lost
    if lost <= 0:
        verdict = "nothing was lost to win back."
    elif won < 0:
        verdict = (f"{-100 * won:.1f} pp below the broken run itself: no rescue here "
                   f"(the bar: {RECOVERED:.0%} of the loss won back).")
    else:
        verdict = f"{won / lost:.0%} of the loss won back (the bar: {RECOVERED:.0%})."
    return Finding(name, f"{what}: {rescued.final['val_acc']:.3f} (lr "
                         f"{rescued.start['lr']:.3g}); {verdict}", holds=holds)


def accuracy_at_scale(base, hot, hot_factor):
    """Notebook 03's sweeps: ``base`` and ``hot`` map run names to Runs (the same epochs,
    seed and large batch; ``hot`` from a base rate ``hot_factor`` times larger)."""
    small, large = base["small"], base["large_same_lr"]
    found = Findings([
        Finding("budget", f"Every run below: {len(small.epochs)} epochs, seed "
                          f"{small.start['args']['seed']}, batch "
                          f"{small.start['global_batch_size']} (small) or "
                          f"{large.start['global_batch_size']} (large, "
                          f"{large.start['steps_per_epoch'] * len(large.epochs)} steps)."),
        fixed_epoch_gap(small, large),
        rule_restores(small, large, base["large_linear"], "linear"),
        rule_restores(small, large, base["large_sqrt"], "sqrt"),
    ])
    hot_small, broken = hot["small"], hot["large_linear"]
    fine = hot_small.final["val_acc"] >= small.final["val_acc"] - GAP_PP / 100
    found.append(Finding("hot_small", f"A base rate {hot_factor:g}x larger "
                                      f"({hot_small.start['lr']:.3g}) at the small batch: "
                                      f"{hot_small.final['val_acc']:.3f}, "
                         + ("as good as the base rate (within the gap bar)." if fine else
                            "already worse than the base rate: it is too hot even there."),
                         holds=fine))
    drop_pp = 100 * (hot_small.final["val_acc"] - broken.final["val_acc"])
    breaks = drop_pp >= GAP_PP
    found.append(Finding("linear_breaks", f"Scaled linearly from it (lr "
                                          f"{broken.start['lr']:.3g}): "
                                          f"{broken.final['val_acc']:.3f}, {drop_pp:.1f} pp "
                                          f"below the small batch at that rate: "
                         + ("the linear rule breaks here." if breaks else
                            f"within {GAP_PP} pp, so it does not break at this budget."),
                         holds=breaks))
    for key, what in (("large_linear_warmup", "Gradual warmup from the base rate"),
                      ("large_sqrt", "The square-root rule"),
                      ("large_lars", "LARS at the linear rate")):
        found.append(_rescue(f"hot_{key.removeprefix('large_')}", what, broken, hot[key],
                             hot_small))
    return found


def batchnorm(equivalence):
    """N ranks x batch b against one process with batch N x b, with and without BatchNorm
    (``python -m workshop_lib.equivalence``'s result)."""
    if equivalence is None:
        return Findings([skipped("batchnorm", "comparing ranks with one process needs two "
                                              "ranks or more; this execution ran one.")])
    diff = equivalence["max_abs_difference"]
    tolerance = 1e-5
    found = Findings([Finding(
        "bn_free", f"Without BatchNorm, {equivalence['world_size']} ranks x batch "
                   f"{equivalence['batch_size']} and one process x batch "
                   f"{equivalence['world_size'] * equivalence['batch_size']} end "
                   f"{diff['bn_free']:.1e} apart after {equivalence['steps']} steps: the same "
                   f"(float rounding, under {tolerance:.0e}).", holds=diff["bn_free"] < tolerance),
        Finding("batchnorm", f"With BatchNorm they end {diff['batchnorm']:.1e} apart: each rank "
                             f"normalises with its own {equivalence['batch_size']} samples' "
                             f"statistics, so a DDP job is not one process with the global "
                             f"batch.", holds=diff["batchnorm"] >= tolerance)])
    if "sync_batchnorm" in diff:
        found.append(Finding("sync_batchnorm", f"With SyncBatchNorm: {diff['sync_batchnorm']:.1e}"
                                               f" apart: the global batch's statistics again.",
                             holds=diff["sync_batchnorm"] < tolerance))
    else:
        found.append(skipped("sync_batchnorm", "SyncBatchNorm needs CUDA tensors; on GPUs this "
                                               "cell shows it matching one process."))
    return found


# ----------------------------------------------------------------------------------------
# Notebook 05


SAVES_LESS = 0.6   # a remedy "saves memory" when a step saves at most this share of the base
SAME_ACC_PP = 1.0  # accuracies this close (percentage points) are "the same" at this scale


def _saved_mib(run):
    return run.epochs[0]["saved_activation_bytes"] / 2**20


def precision(runs):
    """fp32 against bf16 and fp16 (``runs``: name -> Run; "fp32" is the reference)."""
    base = runs["fp32"]
    found = Findings()
    for name in ("bf16", "fp16"):
        if name not in runs:
            continue
        run = runs[name]
        speed = run.samples_per_s / base.samples_per_s
        saved = _saved_mib(run) / _saved_mib(base)
        delta = 100 * (run.final["val_acc"] - base.final["val_acc"])
        found.append(Finding(
            name, f"{name}: {speed:.2f}x fp32's samples/s, {saved:.2f}x its activations saved "
                  f"for backward, validation accuracy {delta:+.1f} pp ("
                  + ("the same within" if abs(delta) < SAME_ACC_PP else "more than")
                  + f" {SAME_ACC_PP} pp).", holds=abs(delta) < SAME_ACC_PP))
    return found


def remedies(runs, base_name):
    """The out-of-memory remedies at one global batch: what each saves for backward and
    what it costs in speed, against ``base_name``."""
    base = runs[base_name]
    found = Findings()
    for name, run in runs.items():
        if name == base_name:
            continue
        saved = _saved_mib(run) / _saved_mib(base)
        speed = run.samples_per_s / base.samples_per_s
        found.append(Finding(
            name, f"{name}: a step saves {_saved_mib(run):.2f} MiB for backward, {saved:.2f}x "
                  f"the {_saved_mib(base):.2f} MiB of {base_name} ("
                  + ("less memory" if saved <= SAVES_LESS else "no real saving")
                  + f", the bar {SAVES_LESS:.0%}), at {speed:.2f}x its samples/s; global batch "
                    f"{run.start['global_batch_size']}, validation accuracy "
                    f"{run.final['val_acc']:.3f}.", holds=saved <= SAVES_LESS))
    return found


def largest_batch(plain, checkpointed, device):
    """``memory.largest_batch`` without and with gradient checkpointing (``LargestBatch``
    results, None where ``device`` has no allocator to run out of). Where a search reached
    its cap, the cap and not the memory ended it: the step's memory per sample compares
    them instead."""
    if plain is None or checkpointed is None:
        return Findings([skipped("largest_batch", f"no GPU allocator to run out of on "
                                                  f"{device}: the largest batch is a GPU "
                                                  f"figure.")])
    if plain.batch is None or checkpointed.batch is None:
        return Findings([Finding("largest_batch", f"Not even the first batch tried fitted "
                                 f"(without checkpointing: {plain}; with: {checkpointed}).",
                                 holds=False)])
    ratio = checkpointed.mib_per_sample / plain.mib_per_sample
    per_sample = (f"per sample a step took {plain.mib_per_sample:.3f} MiB without "
                  f"checkpointing and {checkpointed.mib_per_sample:.3f} MiB with it "
                  f"({ratio:.2f}x; the bar {SAVES_LESS:.0%})")
    if plain.capped or checkpointed.capped:
        said = (f"The largest batch that fits: {plain} without checkpointing, {checkpointed} "
                f"with it. The search stopped at its cap of {plain.cap:,}, not at the GPU's "
                f"memory, so these batches do not compare; {per_sample}.")
    else:
        said = (f"The largest batch that fits: {plain.batch:,} without checkpointing, "
                f"{checkpointed.batch:,} with it ({checkpointed.batch / plain.batch:g}x, in "
                f"powers of two); {per_sample}.")
    return Findings([Finding("largest_batch", said, holds=ratio <= SAVES_LESS)])


def accumulation(measured):
    """``equivalence``'s accumulation figures: the same step, and the all-reduces saved."""
    calls = measured["all_reduces"]
    same = measured["max_abs_difference"] < 1e-5
    return Findings([Finding(
        "accumulation", f"{measured['micro_batches']} accumulated micro-batches and one batch "
                        f"of them all end {measured['max_abs_difference']:.1e} apart (the bar: "
                        f"1e-05, float rounding); the script's no_sync() loop all-reduced "
                        f"{calls['accumulated']} time(s) per step, the loop without it "
                        f"{calls['accumulated_without_no_sync']}.",
        holds=same and calls["accumulated"] < calls["accumulated_without_no_sync"])])


def dataparallel(result, why_skipped=None):
    """``python -m workshop_lib.dataparallel``'s comparison, or why it did not run
    (``why_skipped``: the notebook's plan says, ``plans.worked_example``)."""
    if result is None:
        return Findings([skipped("dataparallel", why_skipped or "DataParallel against DDP "
                                                 "needs two GPUs or more; this machine has "
                                                 "fewer.")])
    imbalance = result["gpu0_memory_over_mean_of_others"]
    return Findings([Finding(
        "dataparallel", f"On {result['gpus']} GPUs, DDP trained "
                        f"{result['speedup_ddp_over_dp']:.2f}x DataParallel's samples/s; GPU 0 "
                        f"held {imbalance['data_parallel']:.2f}x "
                        f"the others' memory under DataParallel, {imbalance['ddp']:.2f}x under "
                        f"DDP.", holds=result["speedup_ddp_over_dp"] > 1)])


ACCOUNTED = 0.2  # compute + exposed communication within this share of the measured step


def step_time(summary, floor_ms=None):
    """``python -m workshop_lib.trace``'s summary: where rank 0's median step went; against
    the all-reduce floor for the model's gradients: ``floor_ms``, or the one the trace
    fitted on its own ranks (none with one rank)."""
    if floor_ms is None and summary.get("floor"):
        floor_ms = summary["floor"]["floor_ms"]
    rank0 = summary["ranks"][0]["median"]
    accounted = rank0["accounted"]["median"]
    holds = abs(accounted - 1) <= ACCOUNTED
    said = (f"Rank 0's median step: {rank0['measured_ms']:.2f} ms measured; compute "
            f"{rank0['compute_ms']:.2f} ms, gradient all-reduce {rank0['communication_ms']:.2f} "
            f"ms, of it {rank0['overlapped_ms']:.2f} ms beside compute and "
            f"{rank0['exposed_ms']:.2f} ms exposed (the step waited). Compute + exposed = "
            f"{accounted:.2f}x the measured step (the bar: within {ACCOUNTED:.0%}).")
    if floor_ms is not None:
        said += (f" The all-reduce floor for {summary['setup']['gradient_bytes'] / 2**20:.2f} "
                 f"MB of gradients here: {floor_ms:.2f} ms; exposed is "
                 f"{rank0['exposed_ms'] / floor_ms:.1f}x it"
                 + ("; the excess over the floor is the all-reduce waiting (for the other rank, or "
                    "for a core), not bytes moving."
                    if rank0["exposed_ms"] > 1.5 * floor_ms else "."))
    return Findings([Finding("step_time", said, holds=holds)])


# ----------------------------------------------------------------------------------------
# Notebook 06


SHARDS_ACCURACY_PP = 2.0  # shards and memory see the same samples in another order
SAME_RUN = 1e-6           # two launches of one job: per-epoch losses this close are equal


def shards_vs_memory(memory, shards, bar_pp=SHARDS_ACCURACY_PP):
    """The same DDP job with its data in memory and read from record shards."""
    gap_pp = 100 * (shards.final["val_acc"] - memory.final["val_acc"])
    within = abs(gap_pp) <= bar_pp
    speed = (_mean(shards.column("samples_per_s")[1:] or shards.column("samples_per_s"))
             / _mean(memory.column("samples_per_s")[1:] or memory.column("samples_per_s")))
    return Findings([
        Finding("shards_accuracy",
                f"From shards, validation accuracy {shards.final['val_acc']:.4f}; from memory "
                f"{memory.final['val_acc']:.4f} ({gap_pp:+.2f} pp): "
                + (f"the same learning within {bar_pp:g} pp (the shards give each epoch the "
                   f"same samples in another order)." if within else
                   f"NOT within {bar_pp:g} pp: more than the order of the samples differs."),
                holds=within),
        Finding("shards_speed",
                f"Reading shards ran at {speed:.2f}x the in-memory loader's samples/s "
                + ("(decoding each record costs more than indexing a tensor that is already "
                   "in memory; on a large dataset the choice is shards or not fitting at all)."
                   if speed < 1 else "(the records' decoding is hidden behind the step)."),
                holds=None),
    ])


def steps_by_rank(output, mode):
    """{rank: steps} from the shard demo's lines ``MODE: N steps on rank R, done``."""
    import re

    return {int(m[2]): int(m[1]) for line in output
            for m in re.finditer(rf"{mode}: (\d+) steps on rank (\d+), done", line)}


def uneven_shards(equal, uneven, join, timeout_s):
    """The shard demo: ``equal`` and ``join``: {rank: steps}; ``uneven``: the LaunchResult
    of the job whose ranks take their own step counts (its collectives time out after
    ``timeout_s``)."""
    if len(equal) < 2:
        return Findings([_needs_ranks("uneven_shards", "A job whose ranks hold unequal shards")])
    same = len(set(equal.values())) == 1
    found = Findings([Finding(
        "equal_steps", f"Equal steps: every rank took {min(equal.values())} steps, and the "
                       f"job finished." if same else
        f"Equal steps: the ranks took {sorted(equal.values())} steps: NOT equal.",
        holds=same)])
    hung = not uneven.ok and "Timed out" in (uneven.error or "") + "".join(uneven.output)
    found.append(Finding(
        "uneven_hangs",
        f"Uneven steps: the job hung, the rank with more batches in a step's all-reduce and "
        f"the one that had run out in its next collective, until the {timeout_s:g} s timeout "
        f"failed it after {uneven.seconds:.0f} s in all (the default timeout: "
        f"{DEFAULT_TIMEOUT_MIN} minutes of hanging)."
        if hung else "Uneven steps: the job did NOT hang"
        + (" (it finished)" if uneven.ok else f" but failed otherwise: {uneven.error}") + ".",
        holds=hung))
    joined = len(join) == len(equal) and len(set(join.values())) > 1
    found.append(Finding(
        "join_finishes",
        f"Join: the ranks took {sorted(join.values(), reverse=True)} steps and the job "
        f"finished: the ranks that ran out shadowed the others' all-reduces."
        if joined else f"Join: steps by rank {join}: not the uneven finish it should show.",
        holds=joined))
    return found


DEFAULT_TIMEOUT_MIN = 10  # torch.distributed's default collective timeout (gloo, NCCL)


def layout_table(result):
    """Which node rank and global ranks each node's agent got, in every rendezvous."""
    return runlog.format_table(
        [{"node": r["node"], "attempt": r["restart_count"], "node_rank": r["group_rank"],
          "nodes": r["group_world_size"], "local": str(r["local_ranks"]),
          "global": str(r["global_ranks"])} for r in result.rounds],
        {"node": ("agent", ""), "attempt": ("attempt", ""), "node_rank": ("node rank", ""),
         "nodes": ("nodes", ""), "local": ("local ranks", ""),
         "global": ("global ranks", "")})


def two_nodes(result, nodes_run, one_node_run, tolerance=SAME_RUN):
    """The same job as 2 nodes (``result``: the NodesResult; ``nodes_run``: its Run) and as
    one torchrun on one node (``one_node_run``), with the same seed and world size."""
    if not result.ok:
        return Findings([Finding("two_nodes", f"The two-node job failed: {result.error}.",
                                 holds=False)])
    ranks = sorted(rank for r in result.rounds if r["restart_count"] == 0
                   for rank in r["global_ranks"])
    world = nodes_run.start["world_size"]
    node_ranks = sorted(r["group_rank"] for r in result.rounds if r["restart_count"] == 0)
    recorded = nodes_run.start.get("nodes")
    laid_out = (ranks == list(range(world)) and node_ranks == list(range(len(node_ranks)))
                and recorded == len(node_ranks))
    found = Findings([Finding(
        "layout", f"Rendezvous: {len(node_ranks)} agents got node ranks {node_ranks} and, "
                  f"between them, global ranks {ranks} of world size {world} (the run record: "
                  f"{recorded} nodes)"
                  + (": every rank once." if laid_out else ": NOT every rank exactly once."),
        holds=laid_out)])
    mine, theirs = nodes_run.column("val_loss"), one_node_run.column("val_loss")
    same_world = world == one_node_run.start["world_size"]
    if not same_world or len(mine) != len(theirs):
        found.append(Finding("same_as_one_node", "The one-node run is another job (world "
                             "size or epochs differ): nothing to compare.", holds=None))
        return found
    diff = max(abs(a - b) for a, b in zip(mine, theirs, strict=True))
    same = diff <= tolerance
    found.append(Finding(
        "same_as_one_node",
        f"Two nodes against one node, same seed and world size {world}: validation losses "
        f"differ by at most {diff:.1e} over {len(mine)} epochs, "
        + (f"within {tolerance:.0e}: the same job; where its processes run does not change "
           f"what they compute." if same else f"NOT within {tolerance:.0e}."),
        holds=same))
    return found


def elastic(result, run, epochs):
    """``--nnodes=1:2``: a node removed mid-run (``result``: the NodesResult; ``run``: the
    job's Run, ``epochs`` asked for)."""
    if not result.killed:
        return Findings([Finding("elastic", "No node was removed: nothing to show.",
                                 holds=None)])
    (node, killed_s), = result.killed.items()
    later = [r for r in result.rounds if r["restart_count"] > 0]
    found = Findings()
    if not result.ok or not later:
        found.append(Finding("elastic_reforms", f"After node {node} was removed the job did "
                             f"NOT re-form and finish: {result.error}.", holds=False))
        return found
    reform_s = later[0]["seen_s"] - killed_s
    resumed = run.resumes[-1] if run.resumes else None
    no_loss = run.column("epoch") == list(range(1, epochs + 1))
    found.append(Finding(
        "elastic_reforms",
        f"Node {node} was removed at {killed_s:.0f} s; {reform_s:.0f} s later the "
        f"{len(later)} node(s) left formed a group of world size {resumed['world_size']} and "
        f"resumed from the checkpoint at epoch {resumed['start_epoch']}; the job finished "
        f"all {epochs} epochs" + (" with none lost or repeated." if no_loss else
                                  ", but its epochs were not 1 to the end once each.")
        if resumed else "The group re-formed but did not resume from a checkpoint.",
        holds=bool(resumed) and no_loss))
    if resumed:
        before, after = run.start["global_batch_size"], resumed["global_batch_size"]
        found.append(Finding(
            "elastic_batch",
            f"The global batch went from {before} to {after} (the batch per process stayed "
            f"{resumed['batch_size']}): the rest of the run trained with another global batch "
            f"and learning-rate ratio than its start, which notebook 01's rules say to "
            f"rescale for (train_ddp's --lr-scaling does, from the new world size).",
            holds=None))
    return found


# ----------------------------------------------------------------------------------------
# Notebook 07


STEP_BAR = 0.05            # step times closer than this share of a step count as the same
LITTLE_TO_OVERLAP = 0.10   # communication under this share of a step leaves little to hide
HOOK_ACCURACY_PP = 2.0     # a comm hook keeps the accuracy within this of plain all-reduce's
BALANCED = 1.10            # a rank's share within this factor of an even split is balanced
SAME_PARAMETERS = 1e-5     # float32 rounding of the same sums in another order
FSDP_WORLD_SIZES = (2, 4, 8)  # the pointer's GPU counts


def _needs_ranks(key, what):
    return skipped(key, f"{what} needs two ranks or more; this execution ran one (nproc is 1).")


def _compare_ms(ms, reference_ms, bar=STEP_BAR):
    """(share saved against ``reference_ms``, the words for it against the bar)."""
    saved = (reference_ms - ms) / reference_ms
    if saved >= bar:
        return saved, f"{saved:.0%} faster (the bar: {bar:.0%})"
    if saved <= -bar:
        return saved, f"{-saved:.0%} slower (the bar: {bar:.0%})"
    return saved, f"the same within {bar:.0%}"


def inside_ddp_step_times(results):
    """Notebook 07, section 5: the step time of local, naive, overlapped, bucketed and
    PyTorch's DDP (``results``: ``inside_ddp.experiments``' JSON; None where skipped)."""
    if results is None:
        return Findings([_needs_ranks("step_times", "timing the ways of averaging gradients")])
    timing = results["timing"]
    ms = {name: stats["median"] for name, stats in timing["step_ms"].items()}
    local, naive = timing["step_ms"]["local"], ms["naive"]
    share = (naive - local["median"]) / naive
    room = share >= LITTLE_TO_OVERLAP
    found = Findings([Finding(
        "room_to_overlap",
        f"Medians of {timing['rounds']} rounds of {timing['steps_per_window']} steps on "
        f"{timing['world_size']} ranks (the rounds of the plain step spread from "
        f"{local['min']:.1f} to {local['max']:.1f} ms): averaging the gradients after "
        f"backward (naive, {naive:.1f} ms) cost {naive - local['median']:.1f} ms over no "
        f"averaging (local, {local['median']:.1f} ms), {share:.0%} of the step: "
        + (f"something to hide behind backward (the bar: {LITTLE_TO_OVERLAP:.0%})." if room else
           f"under {LITTLE_TO_OVERLAP:.0%}, so there is little to overlap here."), holds=room)])
    for key, what, name, reference, against in (
            ("overlap", "One all-reduce per gradient, started during backward", "overlap",
             "naive", "naive"),
            ("buckets", "Buckets of DDP's default bucket_cap_mb=25 (one bucket here)",
             "buckets", "overlap", "one all-reduce per gradient")):
        saved, words = _compare_ms(ms[name], ms[reference])
        found.append(Finding(key, f"{what}: {ms[name]:.1f} ms a step against {against}'s "
                                  f"{ms[reference]:.1f}: {words}.", holds=saved >= STEP_BAR))
    gap = (ms["buckets"] - ms["ddp"]) / ms["ddp"]
    over = ms["ddp"] - local["median"]
    found.append(Finding(
        "as_fast_as_ddp", f"PyTorch's DDP: {ms['ddp']:.1f} ms a step, "
                          + (f"{over / ms['ddp']:.0%} of it over local; " if over >= 0 else
                             f"{-over:.1f} ms under local, which averages nothing (the rounds' "
                             f"noise exceeds the communication); ")
                          + f"the buckets written here took {abs(gap):.0%} "
                          f"{'more' if gap > 0 else 'less'}: "
        + (f"as fast (within {STEP_BAR:.0%})." if gap <= STEP_BAR else
           f"slower by more than {STEP_BAR:.0%} (DDP's reducer is C++, and makes each .grad "
           f"a view into its bucket instead of copying)."), holds=gap <= STEP_BAR))
    return found


def bucket_sweep_rows(results):
    """The bucket-size sweep beside the all-reduce model: one row per bucket size, with the
    all-reduces a step and the communication the fitted latency and bandwidth predict."""
    timing, fit = results["timing"], results["allreduce_fit"]
    names = sorted((n for n in timing["step_ms"] if n.startswith("buckets_")),
                   key=lambda n: int(n.removeprefix("buckets_"))) + ["buckets"]
    return [{"name": name, "bucket_bytes": int(name.removeprefix("buckets_")) if "_" in name
             else 25 * 2**20, "all_reduces": len(timing["messages"][name]),
             "step_ms": timing["step_ms"][name]["median"],
             "predicted_ms": 1000 * allreduce.predicted_s(fit, timing["world_size"],
                                                          timing["messages"][name])}
            for name in names]


def _size(nbytes):
    """Bytes in KiB or MiB, three significant digits."""
    return f"{nbytes / 2**20:.3g} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.3g} KiB"


def inside_ddp_bucket_sweep(results):
    """Notebook 07, section 5: does the step time follow the all-reduces' latencies?"""
    if results is None:
        return Findings([_needs_ranks("bucket_sweep", "the bucket-size sweep")])
    fit = results["allreduce_fit"]
    rows = bucket_sweep_rows(results)
    smallest, fastest = rows[0], min(rows, key=lambda r: r["step_ms"])
    extra = (smallest["step_ms"] - fastest["step_ms"]) / fastest["step_ms"]
    costs = extra >= STEP_BAR
    return Findings([
        Finding("allreduce_fit", f"One all-reduce on {results['world_size']} ranks "
                                 f"({results['backend']}): {1000 * fit['latency_s']:.2f} ms "
                                 f"latency, {fit['bus_bandwidth_gb_s']:.2f} GB/s bus bandwidth "
                                 f"(fitted to {fit['sizes']} sizes, {fit['relative_rms_error']:.0%}"
                                 f" rms error)."),
        Finding("bucket_sweep",
                f"Buckets of {_size(smallest['bucket_bytes'])}: {smallest['all_reduces']} "
                f"all-reduces a step, {smallest['predicted_ms']:.1f} ms of communication by "
                f"that fit, against {rows[-1]['all_reduces']} and "
                f"{rows[-1]['predicted_ms']:.1f} ms for {_size(rows[-1]['bucket_bytes'])} "
                f"buckets; measured, the step took "
                f"{smallest['step_ms']:.1f} ms, {extra:+.0%} on the fastest size "
                f"({_size(fastest['bucket_bytes'])}, {fastest['step_ms']:.1f} ms): "
                + (f"small buckets cost more (the bar: {STEP_BAR:.0%})." if costs else
                   f"within {STEP_BAR:.0%}: here the extra latencies are lost in the "
                   f"step's noise."), holds=costs)])


def inside_ddp_zero1(results):
    """Notebook 07, section 3: Adam's state per rank, replicated against ZeRO-1."""
    if results is None:
        return Findings([_needs_ranks("zero1_memory", "measuring the optimizer state per rank")])
    memory = results["zero1"]["adam"]
    replicated, sharded = memory["replicated"], memory["sharded"]
    n, busiest = len(sharded), max(sharded)
    exact = sum(sharded) == replicated
    even = replicated / n
    balanced = busiest <= BALANCED * even
    largest = memory["largest_parameter_bytes"] / memory["parameter_bytes"]
    return Findings([
        Finding("zero1_memory",
                f"Adam's state for the course CNN: {_size(replicated)} on every rank replicated; "
                f"sharded, {' + '.join(_size(b) for b in sharded)} on the {n} ranks "
                + (f"(together exactly the replicated state: each parameter's on one rank): "
                   f"the busiest rank holds {busiest / replicated:.0%} of it."
                   if exact else f"(together {_size(sum(sharded))}, NOT the replicated "
                                 f"{_size(replicated)})."),
                holds=exact and busiest < replicated),
        Finding("zero1_balance",
                f"An even split is {_size(even)} a rank; the busiest holds {busiest / even:.2f}x "
                f"that: " + (f"balanced (the bar: {BALANCED:.2f}x)." if balanced else
                             f"not balanced (the bar: {BALANCED:.2f}x): the largest parameter "
                             f"alone is {largest:.0%} of the model, and whole parameters are "
                             f"shared out (FSDP and DeepSpeed split flat buffers, inside "
                             f"tensors)."), holds=balanced),
        Finding("zero1_pytorch",
                f"PyTorch's ZeroRedundancyOptimizer split it "
                f"{' + '.join(_size(b) for b in memory['pytorch'])}: "
                + ("the same split." if memory["pytorch"] == sharded else "another split."),
                holds=memory["pytorch"] == sharded)])


HOOK_NAMES = {"fp16": "fp16_compress_hook", "bf16": "bf16_compress_hook",
              "powersgd_rank1": "PowerSGD, rank 1", "powersgd_rank4": "PowerSGD, rank 4"}


def inside_ddp_comm_hooks(results):
    """Notebook 07, section 6: each communication hook's bytes and accuracy against plain
    all-reduce (the last step's bytes: PowerSGD compresses from its second step on)."""
    if results is None:
        return Findings([_needs_ranks("comm_hooks", "comparing communication hooks")])
    hooks = results["comm_hooks"]
    plain = hooks["allreduce"]
    plain_bytes, plain_acc = plain["bytes_per_step"][-1], plain["val_acc"]
    found = Findings()
    for name, label in HOOK_NAMES.items():
        hook = hooks[name]
        sent = hook["bytes_per_step"][-1]
        delta_pp = 100 * (hook["val_acc"] - plain_acc)
        kept = delta_pp >= -HOOK_ACCURACY_PP
        found.append(Finding(
            f"hook_{name}",
            f"{label}: {_size(sent)} all-reduced a step, {sent / plain_bytes:.1%} of plain "
            f"all-reduce's {_size(plain_bytes)}; after {hooks['steps']} steps validation accuracy "
            f"{hook['val_acc']:.3f} against {plain_acc:.3f} ({delta_pp:+.1f} pp): "
            + (f"kept (the bar: within {HOOK_ACCURACY_PP:g} pp)" if kept else
               f"lost more than {HOOK_ACCURACY_PP:g} pp")
            + f"; parameters {hook['max_difference']:.1e} from plain all-reduce's (training "
              f"moved them {hooks['moved']:.1e}).", holds=kept))
    return found


def inside_ddp_compiled(results):
    """Notebook 07, section 6: ``torch.compile`` of the DDP model, where it was timed."""
    if results is None:
        return Findings([_needs_ranks("compiled", "timing torch.compile with DDP")])
    if "compiled" not in results:
        return Findings([skipped("compiled", "torch.compile with DDP was not timed "
                                             "(compile_ddp is False: compiling takes minutes "
                                             "on a small CPU; set it to True to measure it).")])
    result = results["compiled"]
    eager, compiled = result["step_ms"]["eager"], result["step_ms"]["compiled"]
    saved, words = _compare_ms(compiled, eager)
    faster = saved >= STEP_BAR
    break_even = (f" It pays for its compilation after "
                  f"{1000 * result['compile_s'] / (eager - compiled):,.0f} steps."
                  if faster else "")
    same = result["first_step_difference"] < SAME_PARAMETERS
    return Findings([
        Finding("compiled", f"torch.compile(DDP): the first step took "
                            f"{result['compile_s']:.1f} s (compiling); then {compiled:.1f} ms a "
                            f"step against {eager:.1f} eager, {words}.{break_even}",
                holds=faster),
        Finding("compiled_same", f"After one step the compiled model's parameters were "
                                 f"{result['first_step_difference']:.1e} from eager's: "
                + ("the same arithmetic (float rounding" if same else
                   "more than float rounding (the bar")
                + f": {SAME_PARAMETERS:.0e}); after {result['steps']} steps "
                  f"{result['max_difference']:.1e}, as training amplifies rounding.",
                holds=same)])


def fsdp_memory_rows(parameters, world_sizes=FSDP_WORLD_SIZES):
    """Bytes a rank holds (parameters, gradients, Adam state, float32) under DDP, ZeRO-1,
    ZeRO-2 and FSDP, for a model of ``parameters`` on each of ``world_sizes`` GPUs."""
    return [{"gpus": n, **{scheme: held["total"] for scheme, held in
                           fsdp.memory_per_rank(parameters, n).items()}}
            for n in world_sizes]


def inside_ddp_fsdp(results, model_name, parameters):
    """Notebook 07, section 6: FSDP2 against DDP where it ran, and what FSDP would save for
    ``model_name`` (``parameters`` of them), from the count."""
    widest = fsdp_memory_rows(parameters)[-1]
    found = Findings([Finding(
        "fsdp_pointer",
        f"The course's {model_name} ({parameters / 1e6:.2f}M parameters, float32, Adam) on "
        f"{widest['gpus']} GPUs: DDP keeps {widest['ddp'] / 2**20:.1f} MiB of parameters, "
        f"gradients and optimizer state on each, ZeRO-1 {widest['zero1'] / 2**20:.1f}, ZeRO-2 "
        f"{widest['zero2'] / 2**20:.1f}, FSDP {widest['fsdp'] / 2**20:.1f} "
        f"({widest['fsdp'] / widest['ddp']:.0%} of DDP's), activations apart.")])
    if results is None:
        found.append(_needs_ranks("fsdp", "running FSDP against DDP"))
        return found
    result = results["fsdp"]
    n = results["world_size"]
    same = result["max_difference"] < SAME_PARAMETERS
    held = {name: sum(values[0] for values in result["held"][name].values())
            for name in ("ddp", "fsdp")}
    share = held["fsdp"] / held["ddp"]
    found.append(Finding(
        "fsdp_same", f"fully_shard on {n} ranks trained the course CNN as DDP does: largest "
                     f"parameter difference after {result['steps']} Adam steps "
                     f"{result['max_difference']:.1e} (the bar: {SAME_PARAMETERS:.0e}; training "
                     f"moved them {result['moved']:.1e})." if same else
        f"fully_shard on {n} ranks ended {result['max_difference']:.1e} from DDP after "
        f"{result['steps']} Adam steps: more than the {SAME_PARAMETERS:.0e} of float rounding.",
        holds=same))
    sharded = share <= BALANCED / n
    found.append(Finding(
        "fsdp_memory", f"Rank 0 held {_size(held['fsdp'])} of parameters, gradients and Adam "
                       f"state under FSDP against {_size(held['ddp'])} under DDP: {share:.0%}, "
                       + (f"1/{n} of it (the bar: {BALANCED:.2f}/{n})." if sharded else
                          f"more than {BALANCED:.2f}/{n} of it."), holds=sharded))
    return found


def inside_ddp(results, model_name, parameters):
    """Notebook 07's closing summary: every section's findings."""
    return (inside_ddp_zero1(results) + inside_ddp_step_times(results)
            + inside_ddp_bucket_sweep(results) + inside_ddp_comm_hooks(results)
            + inside_ddp_compiled(results) + inside_ddp_fsdp(results, model_name, parameters))
