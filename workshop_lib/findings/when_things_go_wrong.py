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
