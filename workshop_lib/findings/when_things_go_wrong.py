"""Notebook 04, When things go wrong: its closing findings, computed from its runs."""
from workshop_lib.findings.base import Finding, Findings, skipped

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


RESUME_SPREAD = 3  # on GPUs: the resumed job within this many times two plain runs' gap


def resume(gap, device, spread=None):
    """The resumed job against the uninterrupted one (``checkpoint.largest_difference`` of
    their last checkpoints): on the CPU the same bits (the bar: a difference of 0.0). On
    GPUs cuDNN's algorithm choices and atomic additions round differently from run to run,
    so the yardstick is ``spread``, the same difference between the uninterrupted job and
    the same job run again: the resumed job is the same job when its gap is within
    RESUME_SPREAD times that (one pair of runs is one sample of the spread)."""
    epochs, worst = gap["epochs"], max(gap["model"], gap["optimizer"])
    said = (f"The resumed job's last checkpoint (epoch {epochs[0]}) against the uninterrupted "
            f"job's (epoch {epochs[1]}): the weights differ by at most {gap['model']:.3g}, the "
            f"optimizer state by {gap['optimizer']:.3g}")
    if device != "cpu":
        if spread is None:
            return Findings([Finding("resume", said + " (on GPUs cuDNN's algorithm choices "
                                                      "and atomic additions round differently "
                                                      "from run to run; without a second "
                                                      "uninterrupted run to measure that: not "
                                                      "judged).")])
        plain = max(spread["model"], spread["optimizer"])
        bar = RESUME_SPREAD * plain
        same = worst <= bar and epochs[0] == epochs[1]
        return Findings([Finding("resume", said + (
            f"; the uninterrupted job and the same job run again differ by up to {plain:.3g} "
            f"(GPU kernels round differently from run to run). The resumed job is "
            + (f"within {RESUME_SPREAD}x that ({bar:.3g}): the same job, up to the GPU's "
               f"rounding." if same else
               f"beyond {RESUME_SPREAD}x that ({bar:.3g}): more than the GPU's rounding "
               f"differs; something the checkpoint does not hold changed the run.")),
            holds=same)])
    same = worst == 0.0 and epochs[0] == epochs[1]
    return Findings([Finding("resume", said + (": bit for bit the same job (the bar: 0.0)."
                                               if same else ": not the same bits (the bar: "
                                               "0.0); something the checkpoint does not hold "
                                               "changed the run."), holds=same)])
