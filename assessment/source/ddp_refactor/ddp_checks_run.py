"""What one launch of the script did (``Run``), and what every check asks of it first.

``ddp_checks.launch`` returns a ``Run``: the job's exit status, time and output, and each
rank's record (what ``ddp_recorder`` saw it do). ``Run.failure`` says, in one sentence for
the learner, why a job cannot be graded at all (a crash, a hang, a missing file); every
check begins with ``_require`` (or ``_require_model``), which raises that sentence, so a
broken job fails each requirement with the same reason. ``Run.speed`` is the speed-up over
one process, reported and never required (``ddp_checks_rules.SPEEDUP_UNCALIBRATED``).

Your copy of this file is replaced by the instructor's when your work is graded.

Standard library only: the notebook's kernel imports this file.
"""
import re
from dataclasses import dataclass
from pathlib import Path

from ddp_checks_rules import (
    SPEEDUP_NOT_REQUIRED_ON_CPU,
    SPEEDUP_PER_GPU,
    SPEEDUP_UNCALIBRATED,
    Config,
    RequirementNotMet,
)


def where(nproc, on_gpu):
    return (f"{nproc} GPU{'s' * (nproc > 1)} (NCCL)" if on_gpu
            else f"{nproc} CPU process{'es' * (nproc > 1)}")


@dataclass
class Run:
    """What one launch did: exit status, time, output, and each rank's record."""

    script: str
    config: Config
    nproc: int
    on_gpu: bool
    time_limit_s: float
    returncode: int | None = None
    timed_out: bool = False
    elapsed_s: float = 0.0
    output: str = ""
    ranks: list | None = None
    out_dir: Path | None = None
    missing_script: bool = False
    # The same script as a single process (a Run), for the speed-up. Annotated as object,
    # not "Run": a string annotation makes dataclass look this module up in sys.modules,
    # where only a load through ddp_checks puts it.
    one_process: object = None

    @property
    def failure(self):
        """Why the job cannot be graded (a sentence for the learner), or None."""
        if self.missing_script:
            return (f"{self.script} does not exist: run the cell that writes it "
                    f"(%%writefile {self.script}).")
        if self.timed_out:
            last = _tail(self.output, 1)
            return (f"the job did not finish within {self.time_limit_s:.0f} s and was "
                    f"stopped. Look for an endless loop, or for a collective (all_reduce, "
                    f"barrier, ...) that not every rank reaches."
                    + (f" The last line it printed: {last!r}" if last else ""))
        for rank, record in enumerate(self.ranks or []):
            if record and record.get("error"):
                error = record["error"]
                message = f": {error['message']}" if error["message"] else ""
                reason = f"rank {rank} stopped with {error['type']}{message} ({error['where']})."
                if error["type"] == "NotImplementedError":
                    reason += " A place marked '# YOUR CODE HERE' still needs your code."
                return reason
        if self.returncode != 0:
            return (f"the job exited with status {self.returncode}. The end of its "
                    f"output:\n{_tail(self.output)}")
        for rank, record in enumerate(self.ranks or []):
            if record is None:
                return f"rank {rank} finished without reporting what it did."
            if not record["data_loaded"]:
                return ("the script never called load_data(): keep loading the data "
                        "with it.")
        return None

    @property
    def ok(self):
        return self.failure is None

    def summary(self):
        head = (f"{self.script} on {where(self.nproc, self.on_gpu)}, {self.config.epochs} "
                f"epochs, batch size {self.config.batch_size} per process, --lr "
                f"{self.config.lr}, seed {self.config.seed}: ")
        if self.ok:
            return head + f"finished in {self.elapsed_s:.1f} s."
        return head + "could not be graded: " + self.failure

    @property
    def samples_per_s(self):
        """Training samples per second over the job's passes over the training set after
        the first (which warms up): all ranks' samples over the slowest rank's time in
        those passes. None where no such pass was timed."""
        if not self.ok:
            return None
        samples, seconds = 0, []
        for record in self.ranks:
            timed = [p for p in record["passes"] if p["split"] == "train"][1:]
            timed = [p for p in timed if p.get("seconds")]
            if not timed:
                return None
            samples += sum(len(batch) for p in timed for batch in p["batches"])
            seconds.append(sum(p["seconds"] for p in timed))
        return samples / max(seconds)

    @property
    def measures_speedup(self):
        """Whether this job is run again as a single process, for the speed-up (reported,
        never required)."""
        wanted = self.config.measure_speedup
        return self.nproc >= 2 and (self.on_gpu if wanted is None else wanted)

    def speed(self):
        """``(speed-up, why not measured)``: this job's samples per second over the
        single-process run's, or None and the reason."""
        if not self.measures_speedup:
            if self.nproc >= 2 and not self.on_gpu and self.config.measure_speedup is None:
                return None, f"not measured ({SPEEDUP_NOT_REQUIRED_ON_CPU})."
            return None, "not measured for this run."
        if self.one_process is None or not self.one_process.ok:
            failure = self.one_process.failure if self.one_process else "it did not run."
            return None, (f"the same script as a single process (torchrun "
                          f"--nproc-per-node=1) could not be measured: {failure}")
        mine, alone = self.samples_per_s, self.one_process.samples_per_s
        if not mine or not alone:
            return None, ("no pass over train_set after the first one was timed: "
                          "iterate over the whole training DataLoader in every epoch.")
        return mine / alone, None

    def speed_summary(self):
        """One line: samples per second of this job and of one process, the speed-up and
        whether it is required here."""
        speedup, why_not = self.speed()
        if speedup is None:
            return f"Speed-up: {why_not}"
        bar = SPEEDUP_PER_GPU * self.nproc
        line = (f"Speed-up: {self.samples_per_s:,.0f} training samples/s on "
                f"{where(self.nproc, self.on_gpu)}, {self.one_process.samples_per_s:,.0f} "
                f"as a single process: {speedup:.2f}x")
        if self.on_gpu:
            return line + (f" (the bar, {SPEEDUP_PER_GPU} x {self.nproc} = {bar:.2f}x, is "
                           f"{SPEEDUP_UNCALIBRATED}).")
        return line + f" ({SPEEDUP_NOT_REQUIRED_ON_CPU})."


def _tail(text, lines=12):
    """The end of torchrun's output, without its routine warnings."""
    kept = [line for line in text.splitlines()
            if line.strip() and not re.match(r"^[WI]\d{4} ", line) and "*****" not in line]
    return "\n".join(kept[-lines:])


# --------------------------------------------------------------------------------------
# What every check asks first: a job that can be graded (and, for most, its model).
# --------------------------------------------------------------------------------------

def _require(run):
    if not isinstance(run, Run):
        raise RequirementNotMet("run the cell that launches your script first.")
    if not run.ok:
        raise RequirementNotMet(run.failure)


def _require_model(run):
    _require(run)
    for rank, record in enumerate(run.ranks):
        if not record["model"]["found"]:
            raise RequirementNotMet(f"rank {rank}: {record['model']['problem']}")


def _passed(message):
    print(f"PASS: {message}")
