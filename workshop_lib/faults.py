"""Fault injection: make one rank fail on purpose, to see (and test) how a job fails.

    --inject-fault KIND@RANK:STEP

fires on rank RANK when it is about to run training step STEP (counted from 0 over the
whole run). KIND is what goes wrong:

- ``raise``: the rank raises an exception (a bug, a bad batch);
- ``kill``:  the rank SIGKILLs itself (a machine or process dying without a word);
- ``hang``:  the rank stops making progress, so the others wait in their next collective
  until the process-group timeout (``--dist-timeout``) turns the hang into an error.

A fault fires only in a job's first attempt: after an elastic restart
(``torchrun --max-restarts``) the job runs clean and can resume from its checkpoint.
A fault that could not fire (a step past the run's last, or one it resumed after; a
rank the job does not have) is refused at the start: steps per epoch change with the
machine's shape and the dataset, and a demo whose fault silently never happens shows
nothing. Notebook 04 uses these to show what each failure looks like.
"""
import os
import re
import signal
import time
from dataclasses import dataclass

from workshop_lib.errors import CourseError

FAULT_KINDS = ("raise", "kill", "hang")


class InjectedFault(RuntimeError):
    """The exception a ``raise`` fault raises."""


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    step: int


def parse(spec):
    """``"kill@1:30"`` -> Fault("kill", 1, 30); None for None."""
    if spec is None:
        return None
    match = re.fullmatch(r"(\w+)@(\d+):(\d+)", spec)
    if not match or match[1] not in FAULT_KINDS:
        raise CourseError(f"--inject-fault takes KIND@RANK:STEP with KIND one of "
                          f"{', '.join(FAULT_KINDS)} (e.g. kill@1:30), got {spec!r}")
    return Fault(match[1], int(match[2]), int(match[3]))


def step_in_epoch(epoch, steps_per_epoch):
    """The step half-way through ``epoch`` (1-based): a fault at ``step_in_epoch(2, n)``
    lands after the first epoch's checkpoint, so a restart has something to resume."""
    return (epoch - 1) * steps_per_epoch + steps_per_epoch // 2


def check_fires(fault, world_size, epochs, steps_per_epoch, steps_done=0):
    """Raise a CourseError if ``fault`` can never fire in this run: ``epochs`` epochs of
    ``steps_per_epoch`` steps (counted as ``FaultyLoader`` counts them: every batch, from
    0), on ranks 0 to ``world_size - 1``, resumed after ``steps_done`` steps."""
    last_step = epochs * steps_per_epoch - 1
    if fault.rank < world_size and steps_done <= fault.step <= last_step:
        return
    resumed = f", resumed at step {steps_done}" if steps_done else ""
    raise CourseError(
        f"--inject-fault {fault.kind}@{fault.rank}:{fault.step} would never fire: this run's "
        f"last step is {last_step} ({epochs} epoch(s) x {steps_per_epoch} steps, counted from "
        f"0{resumed}) and its world size is {world_size} (ranks 0 to {world_size - 1}); pick "
        f"a step from {steps_done} to {last_step} and a rank below {world_size}")


def inject(loader, spec, rank, world_size, epochs, steps_done=0):
    """Wrap a training loader so that the fault in ``spec`` fires on ``rank``, if any.

    ``world_size``, ``epochs``: the job's, to refuse a fault that could never fire.
    ``steps_done``: steps already trained before this process started (after a resume).
    """
    fault = parse(spec)
    first_attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0
    if fault is None or not first_attempt:
        return loader
    check_fires(fault, world_size, epochs, len(loader), steps_done)
    if fault.rank != rank:
        return loader
    return FaultyLoader(loader, fault, steps_done)


class FaultyLoader:
    def __init__(self, loader, fault, steps_done):
        self.loader, self.fault, self.step = loader, fault, steps_done

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        for batch in self.loader:
            if self.step == self.fault.step:
                fire(self.fault)
            self.step += 1
            yield batch


def fire(fault):
    print(f"[fault] rank {fault.rank}: injected '{fault.kind}' at step {fault.step}", flush=True)
    if fault.kind == "raise":
        raise InjectedFault(f"injected fault on rank {fault.rank} at step {fault.step}")
    if fault.kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    while True:  # hang: no progress, no collectives
        time.sleep(60)
