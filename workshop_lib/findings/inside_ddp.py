"""Notebook 07, Inside DDP: its closing findings, computed from its runs."""
from workshop_lib import allreduce_model
from workshop_lib.findings.base import Finding, Findings, needs_ranks, skipped
from workshop_lib.inside_ddp import fsdp, timing

STEP_BAR = 0.05            # step times closer than this share of a step count as the same
LITTLE_TO_OVERLAP = 0.10   # communication under this share of a step leaves little to hide
HOOK_ACCURACY_PP = 2.0     # a comm hook keeps the accuracy within this of plain all-reduce's
BALANCED = 1.10            # a rank's share within this factor of an even split is balanced
SAME_PARAMETERS = 1e-5     # float32 rounding of the same sums in another order


def _compare_ms(ms, reference_ms, bar=STEP_BAR):
    """(share saved against ``reference_ms``, the words for it against the bar)."""
    saved = (reference_ms - ms) / reference_ms
    if saved >= bar:
        return saved, f"{saved:.0%} faster (the bar: {bar:.0%})"
    if saved <= -bar:
        return saved, f"{-saved:.0%} slower (the bar: {bar:.0%})"
    return saved, f"the same within {bar:.0%}"


def step_times(results):
    """Notebook 07, section 5: the step time of local, naive, overlapped, bucketed and
    PyTorch's DDP (``results``: ``inside_ddp.experiments``' JSON; None where skipped)."""
    if results is None:
        return Findings([needs_ranks("step_times", "timing the ways of averaging gradients")])
    timing = results["timing"]
    ms = {name: stats["median"] for name, stats in timing["step_ms"].items()}
    local, naive = timing["step_ms"]["local"], ms["naive"]
    share = (naive - local["median"]) / naive
    room = share >= LITTLE_TO_OVERLAP
    found = Findings([Finding(
        "room_to_overlap",
        f"Medians of {timing['rounds']} rounds of {timing['steps_per_window']} steps on "
        f"{timing['world_size']} ranks, {timing.get('model', 'cnn')} at batch "
        f"{timing['batch_size']} per rank (the rounds of the plain step spread from "
        f"{local['min']:.1f} to {local['max']:.1f} ms): averaging the gradients after "
        f"backward (naive, {naive:.1f} ms) cost {naive - local['median']:.1f} ms over no "
        f"averaging (local, {local['median']:.1f} ms), {share:.0%} of the step: "
        + (f"something to hide behind backward (the bar: {LITTLE_TO_OVERLAP:.0%})." if room else
           f"under {LITTLE_TO_OVERLAP:.0%}, so there is little to overlap here."), holds=room)])
    for key, what, name, reference, against in (
            ("overlap", "One all-reduce per gradient, started during backward", "overlap",
             "naive", "naive"),
            ("buckets", f"Buckets of DDP's default bucket_cap_mb=25 ({_buckets(timing)})",
             "buckets", "overlap", "one all-reduce per gradient")):
        saved, words = _compare_ms(ms[name], ms[reference])
        said = f"{what}: {ms[name]:.1f} ms a step against {against}'s {ms[reference]:.1f}: {words}"
        if not room:  # the lesson cannot show here: there is next to nothing to hide
            found.append(Finding(key, said + f"; not judged: averaging costs {share:.0%} of "
                                             f"the step here, so hiding it can save no more, "
                                             f"and what is left is each way's own cost (more, "
                                             f"smaller all-reduces launch more work).",
                                 holds=None))
            continue
        found.append(Finding(key, said + ".", holds=saved >= STEP_BAR))
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


def _buckets(timing):
    """How many buckets of 25 MB the timed model's gradients made (the last all-reduce of a
    step says which parameters each rank used, and is no bucket)."""
    count = len(timing["messages"]["buckets"]) - 1
    return "one bucket here" if count == 1 else f"{count} buckets here"


def _size(nbytes):
    """Bytes in KiB or MiB, three significant digits."""
    return f"{nbytes / 2**20:.3g} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.3g} KiB"


def bucket_sweep(results):
    """Notebook 07, section 5: does the step time follow the all-reduces' latencies?"""
    if results is None:
        return Findings([needs_ranks("bucket_sweep", "the bucket-size sweep")])
    fit = results["allreduce_fit"]
    rows = timing.bucket_sweep_rows(results)
    smallest, fastest = rows[0], min(rows, key=lambda r: r["step_ms"])
    extra = (smallest["step_ms"] - fastest["step_ms"]) / fastest["step_ms"]
    costs = extra >= STEP_BAR
    return Findings([
        Finding("allreduce_fit", f"One all-reduce on {results['world_size']} ranks "
                                 f"({results['backend']}): {1000 * fit['latency_s']:.2f} ms "
                                 f"latency, bus bandwidth {allreduce_model.bandwidth_text(fit)} "
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


def zero1(results):
    """Notebook 07, section 3: Adam's state per rank, replicated against ZeRO-1."""
    if results is None:
        return Findings([needs_ranks("zero1_memory", "measuring the optimizer state per rank")])
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


def comm_hooks(results):
    """Notebook 07, section 6: each communication hook's bytes and accuracy against plain
    all-reduce (the last step's bytes: PowerSGD compresses from its second step on)."""
    if results is None:
        return Findings([needs_ranks("comm_hooks", "comparing communication hooks")])
    hooks = results["comm_hooks"]
    plain = hooks["allreduce"]
    plain_bytes, plain_acc = plain["bytes_per_step"][-1], plain["val_acc"]
    found = Findings()
    if hooks.get("skipped"):
        found.append(skipped("hooks_skipped", hooks["skipped"]))
    for name, label in HOOK_NAMES.items():
        if name not in hooks:
            continue
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


def compiled(results):
    """Notebook 07, section 6: ``torch.compile`` of the DDP model, where it was timed."""
    if results is None:
        return Findings([needs_ranks("compiled", "timing torch.compile with DDP")])
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
        Finding("compiled", f"torch.compile(DDP) of {result.get('model', 'cnn')} at batch "
                            f"{result.get('batch_size', 32)} per rank: the first step took "
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


def fsdp_sharding(results, model_name, parameters):
    """Notebook 07, section 6: FSDP2 against DDP where it ran, and what FSDP would save for
    ``model_name`` (``parameters`` of them), from the count."""
    widest = fsdp.memory_rows(parameters)[-1]
    found = Findings([Finding(
        "fsdp_pointer",
        f"The course's {model_name} ({parameters / 1e6:.2f}M parameters, float32, Adam) on "
        f"{widest['gpus']} GPUs: DDP keeps {widest['ddp'] / 2**20:.1f} MiB of parameters, "
        f"gradients and optimizer state on each, ZeRO-1 {widest['zero1'] / 2**20:.1f}, ZeRO-2 "
        f"{widest['zero2'] / 2**20:.1f}, FSDP {widest['fsdp'] / 2**20:.1f} "
        f"({widest['fsdp'] / widest['ddp']:.0%} of DDP's), activations apart.")])
    if results is None:
        found.append(needs_ranks("fsdp", "running FSDP against DDP"))
        return found
    result = results["fsdp"]
    n = results["world_size"]
    same = result["max_difference"] < SAME_PARAMETERS
    held = {name: sum(values[0] for values in result["held"][name].values())
            for name in ("ddp", "fsdp")}
    share = held["fsdp"] / held["ddp"]
    ranks = f"{n} rank{'s' * (n > 1)}"
    found.append(Finding(
        "fsdp_same", f"fully_shard on {ranks} trained the course CNN as DDP does: largest "
                     f"parameter difference after {result['steps']} Adam steps "
                     f"{result['max_difference']:.1e} (the bar: {SAME_PARAMETERS:.0e}; training "
                     f"moved them {result['moved']:.1e})." if same else
        f"fully_shard on {ranks} ended {result['max_difference']:.1e} from DDP after "
        f"{result['steps']} Adam steps: more than the {SAME_PARAMETERS:.0e} of float rounding.",
        holds=same))
    sharded = share <= BALANCED / n
    found.append(Finding(
        "fsdp_memory", f"Rank 0 held {_size(held['fsdp'])} of parameters, gradients and Adam "
                       f"state under FSDP against {_size(held['ddp'])} under DDP: {share:.0%}, "
                       + (f"1/{n} of it (the bar: {BALANCED:.2f}/{n})." if sharded else
                          f"more than {BALANCED:.2f}/{n} of it."), holds=sharded))
    return found


def summary(results, model_name, parameters):
    """Notebook 07's closing summary: every section's findings."""
    return (zero1(results) + step_times(results)
            + bucket_sweep(results) + comm_hooks(results)
            + compiled(results) + fsdp_sharding(results, model_name, parameters))
