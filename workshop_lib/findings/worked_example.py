"""Notebook 05, The worked example: its closing findings, computed from its runs."""
from workshop_lib.findings.base import Finding, Findings, skipped
from workshop_lib.trace import timeline

SAVES_LESS = 0.6   # a remedy "saves memory" when a step saves at most this share of the base
SAME_ACC_PP = 1.0  # accuracies this close (percentage points) are "the same" at this scale
# Mixed precision is "faster" on a GPU from this ratio of samples/s: on Ampere and later the
# fp32 baseline's convolutions already run as TF32 on Tensor Cores (cuDNN's default), so the
# gain of a small conv net is tens of percent, not the several times of raw peak figures.
FASTER = 1.1


def _saved_mib(run):
    return run.epochs[0]["saved_activation_bytes"] / 2**20


def precision(runs, trace=None):
    """fp32 against bf16 and fp16 (``runs``: name -> Run; "fp32" is the reference): the
    accuracy each keeps, the activations it saves for backward and its training step's own
    peak, and, on a GPU, whether it is faster (``FASTER``), unless the fp32 step is
    launch-bound (``trace``: section 5's summary, where given): lower precision shortens the
    GPU's kernels, not the host's launching of them. On a CPU the speed is printed, not
    judged: bf16 there depends on the processor and fp16 is emulated, so a CPU's number says
    nothing about a GPU's Tensor Cores."""
    base = runs["fp32"]
    on_gpu = str(base.start.get("device", "cpu")).startswith("cuda")
    step = trace["ranks"][0]["median"] if trace else None
    idle = step and step.get("gpu_idle_ms")
    found = Findings()
    for name in ("bf16", "fp16"):
        if name not in runs:
            continue
        run = runs[name]
        speed = run.samples_per_s / base.samples_per_s
        saved = _saved_mib(run) / _saved_mib(base)
        peaks = run.final.get("peak_memory_mib"), base.final.get("peak_memory_mib")
        peak = f", {peaks[0] / peaks[1]:.2f}x its training step's peak" if all(peaks) else ""
        delta = 100 * (run.final["val_acc"] - base.final["val_acc"])
        found.append(Finding(
            name, f"{name}: {speed:.2f}x fp32's samples/s, {saved:.2f}x its activations saved "
                  f"for backward{peak}, validation accuracy {delta:+.1f} pp ("
                  + ("the same within" if abs(delta) < SAME_ACC_PP else "more than")
                  + f" {SAME_ACC_PP} pp).", holds=abs(delta) < SAME_ACC_PP))
        if on_gpu and idle and timeline.launch_bound(step):
            found.append(Finding(
                f"{name}_speed", f"{name} on the GPU: {speed:.2f}x fp32's samples/s, not "
                                 f"judged: the fp32 step is launch-bound (its GPU idle "
                                 f"{idle / step['step_ms']:.0%} of it in section 5's trace), and "
                                 f"{name} shortens only the GPU's kernels, not the host's "
                                 f"launching of them. Where the GPU has work (a larger batch "
                                 f"per GPU) it can pay.", holds=None))
        elif on_gpu:
            found.append(Finding(
                f"{name}_speed", f"{name} on the GPU: {speed:.2f}x fp32's samples/s, "
                                 + ("faster" if speed >= FASTER else "not faster")
                                 + f" (bar: {FASTER}x).", holds=speed >= FASTER))
        else:
            found.append(skipped(f"{name}_speed", f"{name}'s speed is a GPU figure; on a CPU "
                                                  f"its {speed:.2f}x is printed, not judged."))
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


# Both course models have BatchNorm, which normalises each micro-batch with its own
# statistics: the equivalence holds for the BN-free CNN the comparison runs, not for them.
MODEL_WORDS = {"bn_free": "the course CNN without BatchNorm"}
BATCHNORM_CAVEAT = (" With BatchNorm (both course models have it) each micro-batch is "
                    "normalised with its own statistics, so accumulation is not the same step "
                    "as one larger batch.")


def accumulation(measured):
    """``equivalence``'s accumulation figures: the same step, and the all-reduces saved."""
    calls = measured["all_reduces"]
    same = measured["max_abs_difference"] < 1e-5
    model = MODEL_WORDS.get(measured["model"], f"the model {measured['model']!r}")
    return Findings([Finding(
        "accumulation", f"On {model}, {measured['micro_batches']} accumulated micro-batches "
                        f"and one batch of them all end {measured['max_abs_difference']:.1e} "
                        f"apart (the bar: 1e-05, float rounding); the script's no_sync() loop "
                        f"all-reduced {calls['accumulated']} time(s) per step, the loop "
                        f"without it {calls['accumulated_without_no_sync']}.{BATCHNORM_CAVEAT}",
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
HOST_BOUND = 0.2  # a GPU idle more than this share of its step: the host sets part of its pace


def step_time(summary, floor_ms=None):
    """``python -m workshop_lib.trace``'s summary: where rank 0's median step went; against
    the all-reduce floor for the model's gradients: ``floor_ms``, or the one the trace
    fitted on its own ranks (none with one rank). On a GPU the time it sat idle is the
    host's (launching kernels, Python, DDP's hooks), counted with compute and exposed
    communication, and its share always said."""
    if floor_ms is None and summary.get("floor"):
        floor_ms = summary["floor"]["floor_ms"]
    rank0 = summary["ranks"][0]["median"]
    accounted = rank0["accounted"]["median"]
    idle = rank0.get("gpu_idle_ms")
    said = (f"Rank 0's median step: {rank0['measured_ms']:.2f} ms measured; compute "
            f"{rank0['compute_ms']:.2f} ms, gradient all-reduce {rank0['communication_ms']:.2f} "
            f"ms, of it {rank0['overlapped_ms']:.2f} ms beside compute and "
            f"{rank0['exposed_ms']:.2f} ms exposed (the step waited)")
    if idle is None:  # a CPU: no device to sit idle; what is left over is Python or waiting
        said += (f". Compute + exposed = {accounted:.2f}x the measured step (the bar: within "
                 f"{ACCOUNTED:.0%}).")
    else:
        accounted += idle / rank0["measured_ms"]
        share = idle / rank0["step_ms"]
        said += (f"; the GPU sat idle {idle:.2f} ms of the {rank0['step_ms']:.2f} ms step "
                 f"({share:.0%}), between and before its kernels: host time. Compute + "
                 f"exposed + idle = {accounted:.2f}x the measured step (the bar: within "
                 f"{ACCOUNTED:.0%}).")
        if timeline.launch_bound(rank0):
            said += (" The step is LAUNCH-BOUND (the CPU issues kernels slower than the GPU "
                     "runs them), so its time is the host's; a larger batch per GPU would "
                     "cost little more.")
        elif share > HOST_BOUND:
            said += (f" Over {HOST_BOUND:.0%} idle: the host sets part of the step's pace; "
                     f"a larger batch per GPU, fewer and larger kernels (channels_last, "
                     f"torch.compile) or CUDA graphs would fill the gaps.")
        else:
            said += f" At most {HOST_BOUND:.0%} idle: the GPU's work sets the step's pace."
    holds = abs(accounted - 1) <= ACCOUNTED
    if floor_ms is not None:
        said += (f" The all-reduce floor for {summary['setup']['gradient_bytes'] / 2**20:.2f} "
                 f"MB of gradients here: {floor_ms:.2f} ms; exposed is "
                 f"{rank0['exposed_ms'] / floor_ms:.1f}x it"
                 + ("; the excess over the floor is the all-reduce waiting (for the other rank, or "
                    "for a core), not bytes moving."
                    if rank0["exposed_ms"] > 1.5 * floor_ms else "."))
    return Findings([Finding("step_time", said, holds=holds)])


INPUT_WAIT = 0.2  # input-bound: more than this share of the step spent waiting for input
REMEDY_FASTER = 0.1  # a remedy "pays" when the step runs more than 10% faster with it


def input_bound(measured):
    """``input_pipeline.measure``'s figures: the step fed by a ``num_workers=0`` DataLoader
    against the device-resident loader. ``holds``: the DataLoader-fed job is input-bound."""
    rates = measured["samples_per_s"]
    wait = 1 - rates["data_loader"] / rates["resident"]
    bound = wait > INPUT_WAIT
    pinned = "pinned" if measured["pin_memory"] else "not pinned"
    return Findings([Finding(
        "input_bound", f"The course's step fed by a DataLoader "
                       f"(num_workers={measured['num_workers']}, batches {pinned}) trained "
                       f"{rates['data_loader']:,.0f} samples/s, and "
                       f"{rates['resident']:,.0f} fed by the TensorLoader from data already on "
                       f"{measured['device']}: {wait:.0%} of its step time waited for "
                       f"input (1 - the ratio of the rates; the bar {INPUT_WAIT:.0%}), so "
                       + ("this job is input-bound with that DataLoader."
                          if bound else "the input is not what limits this job here."),
        holds=bound)]) + _input_remedy(measured)


def _input_remedy(measured):
    """The DataLoader's own remedy, measured beside it: ``remedy_workers`` persistent
    workers. ``holds``: faster than the plain DataLoader by more than REMEDY_FASTER."""
    rates = measured["samples_per_s"]
    if "workers" not in rates:
        return Findings()
    gain = rates["workers"] / rates["data_loader"] - 1
    lost = rates["resident"] - rates["data_loader"]
    won = ((rates["workers"] - rates["data_loader"]) / lost) if lost > 0 else None
    share = f", {won:.0%} of what the plain loader lost" if won is not None else ""
    workers = measured["remedy_workers"]
    return Findings([Finding(
        "input_remedy", f"With num_workers={workers} (persistent workers"
                        + (", pinned" if measured["pin_memory"] else "") + "): "
                        f"{rates['workers']:,.0f} samples/s, {gain:+.0%} against the plain "
                        f"DataLoader{share}; "
                        + (f"the remedy pays here (the bar: more than {REMEDY_FASTER:.0%})."
                           if gain > REMEDY_FASTER else
                           f"not more than {REMEDY_FASTER:.0%}: the workers share the host's "
                           f"cores with the step, or there was little input time to win."),
        holds=gain > REMEDY_FASTER)])


KNEE_SHARE = 0.9  # the knee: the smallest batch per device within 10% of the best samples/s


def knee(measured, my_knee_batch, profile_batch, trace=None):
    """``throughput.measure``'s curve, read at the learner's knee (``my_knee_batch``, from
    their ``my_knee``): how much faster per sample the batches up to it train, what a step's
    time is made of below it, where the profile's batch per device stands, and, where
    section 5's ``trace`` ran on a GPU, the idle share it saw. ``holds``: the learner's knee
    is the curve's (the smallest batch within ``KNEE_SHARE`` of the best)."""
    rates, step_ms = measured["samples_per_s"], measured["step_ms"]
    batches = sorted(rates)
    best = max(rates.values())
    the_knee = min(b for b in batches if rates[b] >= KNEE_SHARE * best)
    smallest = batches[0]
    said = (f"On {measured['device']}, {measured['model']} trained {rates[smallest]:,.0f} "
            f"samples/s at batch {smallest} per device and at best {best:,.0f} (batch "
            f"{max(rates, key=rates.get)}).")
    if my_knee_batch not in rates:
        return Findings([Finding("knee", said + f" my_knee gave {my_knee_batch!r}, not a "
                                         f"batch of the curve: the exercise above.",
                                 holds=False)])
    k = my_knee_batch
    said += (f" Your knee: batch {k}. A step there took {step_ms[k] / step_ms[smallest]:.1f}x "
             f"as long as one at batch {smallest}, for {k // smallest}x the samples: below "
             f"the knee most of a step is its fixed cost (Python, the optimizer's loop, on a "
             f"GPU the kernel launches), past it the arithmetic.")
    if k == batches[-1]:
        said += " The curve was still rising at its largest batch: the knee is there or past it."
    if measured.get("out_of_memory_at"):
        said += (f" Batch {measured['out_of_memory_at']} did not fit in the GPU's memory: the "
                 f"curve ends before it.")
    if profile_batch in rates:
        gain = rates[k] / rates[profile_batch]
        said += (f" The profile trains at batch {profile_batch} per device: "
                 + (f"below the knee; the knee's batch trains {gain:.1f}x as many samples a "
                    f"second, where the accuracy of notebook 03 allows the larger global batch."
                    if profile_batch < k else "at or past the knee: the device is filled."))
    step = trace["ranks"][0]["median"] if trace else None
    if step and step.get("gpu_idle_ms") is not None:
        said += (f" Section 5's trace, at batch {trace['setup']['batch_size']}: the GPU idle "
                 f"{step['gpu_idle_ms'] / step['step_ms']:.0%} of a step, the host's share.")
    if k != the_knee:
        said += (f" By the rule (the smallest batch within {1 - KNEE_SHARE:.0%} of the best) "
                 f"the knee is batch {the_knee}.")
    return Findings([Finding("knee", said, holds=k == the_knee)])
