"""Steps, and running them: each under its own time limit, each reported on its own.

A step is a name, what it checks, a time limit and a function that does the work and
returns an ``Outcome``. ``run_steps`` skips a step that needs CUDA on a machine without
it (saying so; in a CPU rehearsal a step that can run on the CPU runs there instead), or
whose own precondition is missing, or that would start after the check's deadline; it
turns an exception inside a step into that step's failure, with the exception's own line,
and goes on with the next step.
"""
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from workshop_lib.gpu_check import failures, library, process
from workshop_lib.gpu_check.report import FAIL, PASS, SKIPPED, Outcome

NEEDS_CUDA = "needs CUDA (torch.cuda.is_available() is False here)"
NOT_REHEARSED = "needs a GPU: not rehearsed on the CPU (--cpu-rehearsal)"
MIN_STEP_S = 10  # a step with less time than this left before the deadline is skipped
# A rehearsed step's limit, this many times its GPU limit: the same work on a CPU (bf16
# emulated on most), maybe shared (a 2-core machine under load took 3x as long as idle)
REHEARSAL_SLOWER = 4


@dataclass
class Context:
    out: Path                  # the check's folder: report, logs, each step's files
    env: dict                  # the environment of every command the check runs
    cuda: bool                 # a GPU PyTorch can use, in the check's process
    deadline: float | None = None  # time.monotonic() after which no step starts
    rehearsal: bool = False    # --cpu-rehearsal: the CUDA steps that can, run on the CPU
    python: str = sys.executable
    cwd: Path | None = None
    results: dict = field(default_factory=dict)  # step name -> Outcome, as they finish

    def command(self, name, args, limit_s, cwd=None):
        """Run ``python ARGS`` for at most ``limit_s`` seconds, logs in ``out/logs``."""
        return process.run([self.python, *args], limit_s, self.out / "logs", _file_name(name),
                           env=self.env, cwd=cwd or self.cwd)

    @property
    def device(self):
        """The device the steps' commands ask for."""
        return "cpu" if self.rehearsal else library.DEVICE

    def folder(self, name):
        path = self.out / _file_name(name)
        path.mkdir(parents=True, exist_ok=True)
        return path


def _file_name(name):
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in name).strip("-").lower()


@dataclass
class Step:
    name: str
    checks: str                          # what it checks, one line (the report's notes)
    limit_s: float
    run: Callable                        # (context, limit_s) -> Outcome
    needs_cuda: bool = True
    rehearses: bool = False              # --cpu-rehearsal runs it on the CPU
    skip: Callable | None = None         # (context) -> a reason to skip, or None
    budget_s: float | None = None        # make gpu-check: the step's estimated seconds


def run_steps(context, steps, say=print):
    """Run ``steps`` in order; return their Outcomes (one per step, always)."""
    outcomes = []
    for step in steps:
        limit = step.limit_s * (REHEARSAL_SLOWER if context.rehearsal and step.rehearses else 1)
        reason = None
        if step.needs_cuda and not context.cuda:
            reason = NOT_REHEARSED if context.rehearsal and not step.rehearses else \
                None if context.rehearsal else NEEDS_CUDA
        if reason is None and step.skip is not None:
            reason = step.skip(context)
        if reason is None and context.deadline is not None:
            left = context.deadline - time.monotonic()
            if left < MIN_STEP_S:
                reason = "the check's deadline had passed (--deadline)"
            limit = min(limit, max(left, MIN_STEP_S))
        if reason is not None:
            outcome = Outcome(step.name, SKIPPED, reason)
        else:
            say(f"gpu-check: {step.name} (limit {limit:.0f} s) ...")
            start = time.monotonic()
            try:
                outcome = step.run(context, limit)
            except Exception as error:  # the step's own bug or a missing file: its failure
                failure = failures.describe_exception(error)
                outcome = Outcome(step.name, FAIL, failure.line, where=failure.where,
                                  tail=failures.last_lines(traceback.format_exc()))
            if not isinstance(outcome, Outcome):  # a step that forgot to return: its failure
                outcome = Outcome(step.name, FAIL, f"the step returned {outcome!r}, not an "
                                                   f"Outcome: a bug in the check")
            outcome.seconds = time.monotonic() - start
        outcome.name, outcome.limit_s, outcome.budget_s = step.name, limit, step.budget_s
        context.results[step.name] = outcome
        if outcome.status != SKIPPED:
            say(f"gpu-check: {step.name}: {outcome.status}"
                + (f": {outcome.reason}" if outcome.reason else ""))
        outcomes.append(outcome)
    return outcomes


def _shown(command, context):
    """A command as the report shows it: ``python`` for this interpreter, paths as given."""
    return " ".join("python" if part == context.python else part for part in command)


def from_process(name, finished, context, read=None):
    """An Outcome from a finished command.

    ``read(finished)`` returns ``(figures, values, problem)``: the step's key figures and a
    reason to fail it although the command succeeded (or None). It is called on failures
    too, for the figures a failed command still left (a trace file, a partial log); a
    problem it raises then is not the step's error, the command's is.
    """
    logs = [os.path.relpath(p, context.out) for p in (finished.stdout_path, finished.stderr_path)]
    outcome = Outcome(name, PASS, where=_shown(finished.command, context), logs=logs)
    figures, values, problem = [], {}, None
    if read is not None:
        try:
            figures, values, problem = read(finished)
        except Exception as error:
            if finished.ok:
                problem = failures.describe_exception(error).line
    outcome.figures, outcome.values = figures, values
    said = failures.error_line(finished.stderr) or failures.error_line(finished.stdout)
    tail = failures.last_lines(finished.stderr) or failures.last_lines(finished.stdout)
    if finished.timed_out:
        outcome.status, outcome.tail = FAIL, tail
        outcome.reason = (f"timed out after {finished.limit_s:.0f} s (its limit), stopped"
                          + (f"; its last line: {said}" if said else ", having written nothing"))
    elif finished.returncode != 0:
        outcome.status, outcome.tail = FAIL, tail
        outcome.reason = said or f"exited with status {finished.returncode}, writing nothing"
        outcome.where = f"{outcome.where} (exit status {finished.returncode})"
    elif problem:
        outcome.status, outcome.reason, outcome.tail = FAIL, problem, tail
    else:
        outcome.where = ""
    return outcome
