"""The assessment's checks: launch a training script under torchrun, then judge what it did.

The test cells of the assessment notebook call this module, one check per test cell, each
named after the cell's grade id:

    run = ddp_checks.launch("train_digits_ddp.py", ddp_checks.Config(epochs=3))
    ddp_checks.check_shards_disjoint_and_cover(run)

``launch`` starts the script once with torchrun, with ``ddp_recorder.py`` (next to this
file) as every process's entry point: it runs the script unchanged and records what each
rank does (ddp_recorder.py says what, and how); then, on GPUs, where the speed-up is
required, once more as a single process to measure it. Each ``check_<grade id>``
function judges one requirement from the records of all ranks, prints ``PASS: ...`` or
raises ``RequirementNotMet`` with the reason in one line. Nothing reads the script's
source: any correct way of writing it passes. ``passes`` is the pass mark, the one
definition that the notebook, the feedback (``report``) and the instructor's grades.csv
apply. ``run_script`` is the notebook's plain launch of the script, with a short summary
instead of torchrun's own output.

Your copy of this file is replaced by the instructor's when your work is graded.

``report`` also records your result in your workshop progress (``record_result``, with
the workshop's ``workshop_lib.progress``: the closing session reads it, and on the class
server your instructor's board shows it): when you run the cells, or press Validate; never
while nbgrader grades (``NBGRADER_EXECUTION=autograde``).

Standard library only (``workshop_lib.progress`` too): importing torch in the notebook's
kernel would add seconds to every graded notebook.
"""
import base64
import contextlib
import io
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from array import array
from dataclasses import dataclass, replace
from pathlib import Path

RUN_DIR = Path("grading_run")  # under the notebook's folder: the evidence and --out of a run
RECORDER = Path(__file__).resolve().with_name("ddp_recorder.py")
TIME_LIMIT_ENV = "DDP_CHECKS_TIME_LIMIT_S"  # instructor's override of Config.time_limit_s
NPROC_ENV = "DDP_CHECKS_NPROC"  # instructor's override of the number of processes
CPU_PROCESSES = 2  # processes to launch where there are fewer than two GPUs
# The job's output the grader keeps (its first characters): a correct job writes a few
# thousand; the rest of a flood is dropped, with a note in the output.
OUTPUT_CHARS = 1_000_000
ACC_TOLERANCE = 1e-4  # well under one validation sample (1/360)
LOSS_RTOL = 1e-3  # float32 sums in another order differ by ~1e-6
PARAM_RTOL = 1e-6  # ranks that average their gradients hold bit-identical parameters
START_RTOL = 1e-6  # ranks that start from rank 0's parameters hold exactly those
# Every optimizer step is replayed, in segments of a few steps (ddp_recorder.SEGMENT_STEPS),
# each from the parameters the ranks held at its start. A replay on the CPU in float32
# matches a correct job within ~1e-5 of a step's update; a job that sums its gradients, or
# whose ranks step alone for even one step, is off by ~0.3 or more. ddp_recorder's
# REPLAY_MATCH is the same bar.
REPLAY_RTOL = 0.02
LR_RTOL = 1e-3

# The speed-up over one process is reported, never required: no point and no pass depends
# on it. On GPUs it is measured (a second, single-process launch) and set against this
# bar, SPEEDUP_PER_GPU x N, which stays advisory until it is calibrated on the grading
# machine (SPEEDUP_UNCALIBRATED says why). On the CPU it is not measured by default
# (SPEEDUP_NOT_REQUIRED_ON_CPU says why; Config.measure_speedup=True measures it anyway).
SPEEDUP_PER_GPU = 0.6
SPEEDUP_UNCALIBRATED = (
    "reported, not required: this bar is not yet calibrated on the grading machine, and "
    "a timing over this small a model moves by a third with one stall or a busy core")
SPEEDUP_NOT_REQUIRED_ON_CPU = (
    "on the CPU the speed-up is not required: the processes share the machine's cores and "
    "memory, and for a model this small an all-reduce over gloo costs about as much as a "
    "training step, so a correct job can be slower than one process")
BASELINE_EPOCHS = 3  # the single-process run: the first epoch warms up, the others count

# The requirements, in the notebook's order: grade id -> points.
REQUIREMENTS = {
    "runs_and_reaches_target_accuracy": 1,
    "shards_disjoint_and_cover": 2,
    "shards_reshuffled_each_epoch": 1,
    "gradients_averaged_over_ranks": 3,
    "rank0_only_logs_and_writes": 1,
    "checkpoint_loads_into_plain_model": 1,
    "validation_metrics_are_global": 2,
    "learning_rate_follows_global_batch": 1,
}
# The pass mark: a data-parallel job that trains (requirement 1: the target, in time, and
# on GPUs faster than one GPU), each rank on its own shard (2), with every step equal to
# one process's step on the union of the ranks' batches (4); and this many points in all.
PASS_REQUIRES = ("runs_and_reaches_target_accuracy", "shards_disjoint_and_cover",
                 "gradients_averaged_over_ranks")
PASS_POINTS = 9


def passes(met):
    """Whether a learner who met the requirements ``met`` (grade ids) passes: the one
    definition of the pass mark."""
    points = sum(REQUIREMENTS[grade_id] for grade_id in met)
    return points >= PASS_POINTS and all(grade_id in met for grade_id in PASS_REQUIRES)


def pass_rule():
    """The pass mark, in words."""
    return (f"requirements {', '.join(PASS_REQUIRES[:-1])} and {PASS_REQUIRES[-1]}, "
            f"and at least {PASS_POINTS} of the {sum(REQUIREMENTS.values())} points")


@dataclass(frozen=True)
class Config:
    """One graded run: the script's flags, the accuracy to reach, the time allowed, and
    whether to measure the speed-up (a second, single-process run of the script): None
    measures it where it is required (two or more GPUs), True on the CPU too, False
    nowhere."""

    epochs: int = 4
    batch_size: int = 8
    # --accumulate: the batches per rank whose gradients each optimizer step accumulates
    # (None: the flag is not passed, as for notebook 02's script, and not checked)
    accumulate: int | None = None
    lr: float = 0.03
    seed: int = 0
    target_accuracy: float = 0.85
    time_limit_s: float = 300
    measure_speedup: bool | None = None


class RequirementNotMet(AssertionError):
    """A requirement the run does not meet; shown as its message alone, no traceback."""

    def _render_traceback_(self):
        return [f"\x1b[0;31mRequirement not met\x1b[0m: {self}"]


# --------------------------------------------------------------------------------------
# Launch the script once and load the records.
# --------------------------------------------------------------------------------------

def visible_gpus():
    """How many GPUs a launched process can use, as PyTorch counts them.

    nvidia-smi lists the GPUs the driver sees, also those PyTorch cannot use (a driver
    too old for its CUDA, CUDA_VISIBLE_DEVICES); only where it lists two or more is PyTorch
    asked, in a subprocess (importing torch in this kernel would slow every graded
    notebook by seconds).
    """
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    if sum(1 for line in listed.splitlines() if line.startswith("GPU ")) < 2:
        return 0
    try:
        asked = subprocess.run(
            [sys.executable, "-c", "import torch; print(torch.cuda.device_count() "
                                   "if torch.cuda.is_available() else 0)"],
            capture_output=True, text=True, timeout=120, check=False)
        return int(asked.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return 0


def process_layout():
    """``(processes, on_gpu)``: one process per GPU where there are two or more GPUs,
    otherwise ``CPU_PROCESSES`` processes on the CPU (one GPU cannot be shared by two
    NCCL ranks). ``DDP_CHECKS_NPROC`` sets the number of CPU processes or GPUs to use.
    """
    gpus = visible_gpus()
    wanted = int(os.environ.get(NPROC_ENV, 0)) or None
    if gpus >= 2:
        return min(wanted or gpus, gpus), True
    return wanted or CPU_PROCESSES, False


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
    # The same script as a single process (a Run), for the speed-up. Annotated as object:
    # a string annotation makes dataclass look this module up in sys.modules, where
    # export_grades.py and the workshop's conversion check do not put it.
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


class CappedReader(threading.Thread):
    """Reads a job's output to its end, keeping its first OUTPUT_CHARS characters: the rest
    is counted and dropped, so no output can fill the grader's memory."""

    def __init__(self, stream):
        super().__init__(daemon=True)
        self.stream, self.kept, self.size, self.dropped = stream, [], 0, 0
        self.start()

    def run(self):
        for chunk in iter(lambda: self.stream.read(65536), ""):
            room = max(0, OUTPUT_CHARS - self.size)
            self.kept.append(chunk[:room])
            self.size += min(room, len(chunk))
            self.dropped += max(0, len(chunk) - room)

    def text(self, timeout):
        self.join(timeout)
        note = (f"\n[the job wrote {self.dropped:,} more characters; the grader kept its "
                f"first {OUTPUT_CHARS:,}]\n" if self.dropped else "")
        return "".join(self.kept) + note


def _kill(proc, evidence_dir, sandbox):
    """Stop torchrun and its workers. In the sandbox, killing bwrap ends its PID namespace
    and every process in it (and the pids the job recorded are the namespace's, not this
    machine's). Without it: torchrun starts each worker in a session of its own, so killing
    torchrun's process group would leave them running: kill each worker's group by the pid
    it recorded at start-up, then torchrun's."""
    for pid_file in [] if sandbox else evidence_dir.glob("pid.*"):
        try:
            os.killpg(int(pid_file.read_text()), signal.SIGKILL)
        except (ValueError, ProcessLookupError, PermissionError):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def launch(script, config=Config(), nproc=None, on_gpu=None):
    """Run ``script`` under torchrun with ``config``'s flags; return a ``Run``.

    ``nproc`` processes, on GPUs (NCCL) if ``on_gpu``, else on the CPU; what the caller
    leaves out comes from ``process_layout()``. Where the run measures the speed-up
    (``Run.measures_speedup``: on two or more GPUs, unless ``config`` says otherwise), a job
    that finished is run again as a single process on the same kind of device
    (``Run.one_process``). Never raises for the learner's
    failures (crash, hang, missing file): they become ``Run.failure``, which every check
    reports.
    """
    if nproc is None or on_gpu is None:
        layout_nproc, layout_on_gpu = process_layout()
        nproc = layout_nproc if nproc is None else nproc
        on_gpu = layout_on_gpu if on_gpu is None else on_gpu
    # A fresh folder each time: nothing left from an earlier run can count for this one.
    shutil.rmtree(RUN_DIR, ignore_errors=True)
    run = _launch_once(script, config, int(nproc), bool(on_gpu), RUN_DIR)
    print(run.summary())
    if run.ok:
        print("\n".join(run.ranks[0]["stdout"][-(config.epochs + 4):]))
        if run.measures_speedup:
            alone = replace(config, epochs=min(config.epochs, BASELINE_EPOCHS))
            run.one_process = _launch_once(script, alone, 1, run.on_gpu,
                                           RUN_DIR / "one_process")
            print(run.speed_summary())
    return run


def _sandbox_module():
    """ddp_sandbox.py next to this file, loaded by its path (the workshop's conversion
    check loads this file by its path too, with nothing on sys.path)."""
    global _SANDBOX
    if _SANDBOX is None:
        import importlib.util

        path = Path(__file__).resolve().with_name("ddp_sandbox.py")
        spec = importlib.util.spec_from_file_location("ddp_sandbox", path)
        _SANDBOX = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(_SANDBOX)
    return _SANDBOX


_SANDBOX = None


def _scratch_copy(script, run_dir):
    """run_dir, made afresh (0700), with what the job needs: the script, the recorder and
    the data module (the copy beside the script, where the script finds it)."""
    scratch = run_dir.resolve()
    scratch.mkdir(mode=0o700, parents=True)
    data = Path(script).resolve().with_name("digits_data.py")
    for source in (Path(script), RECORDER, data if data.is_file() else
                   RECORDER.with_name("digits_data.py")):
        shutil.copyfile(source, scratch / source.name)
    return scratch


def _launch_once(script, config, nproc, on_gpu, run_dir):
    time_limit = float(os.environ.get(TIME_LIMIT_ENV, config.time_limit_s))
    run = Run(script=str(script), config=config, nproc=nproc, on_gpu=on_gpu,
              time_limit_s=time_limit)
    if not Path(script).is_file():
        run.missing_script = True
        return run
    sandbox_module = _sandbox_module()
    sandboxed = sandbox_module.sandboxed()  # refuses while grading where none can be made
    scratch = _scratch_copy(script, run_dir)
    evidence_dir = scratch / "evidence"
    evidence_dir.mkdir()
    run.out_dir = scratch / "out"
    # The graded settings go in a file of the 0700 scratch folder: a command line is
    # visible to every account on the machine.
    settings = scratch / "settings.json"
    settings.write_text(json.dumps({
        "evidence_dir": str(evidence_dir), "out_dir": str(run.out_dir),
        "script": str(scratch / Path(script).name),
        "args": ["--epochs", str(config.epochs), "--batch-size", str(config.batch_size),
                 "--lr", str(config.lr), "--seed", str(config.seed), "--out",
                 str(run.out_dir)]
                + (["--accumulate", str(config.accumulate)] if config.accumulate else [])}))
    settings.chmod(0o600)
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={nproc}", str(scratch / RECORDER.name), str(settings),
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           # Spinning OpenMP threads on shared cores slow CPU ranks down many times over.
           "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    if not on_gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""  # one GPU cannot host two NCCL ranks: use the CPU
    sandbox = sandbox_module.Job(scratch, on_gpu, nproc, time_limit) if sandboxed else None
    start = time.perf_counter()
    # stderr joins stdout: a test cell that writes to stderr scores 0, and torchrun
    # always warns there.
    output = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True,
              "errors": "replace"}
    if sandbox:
        proc = sandbox.popen(command, env, **output)  # env: its allowlist's values only
    else:
        proc = subprocess.Popen(command, env=env, cwd=scratch, start_new_session=True,
                                **output)
    reader = CappedReader(proc.stdout)
    try:
        proc.wait(timeout=time_limit)
    except subprocess.TimeoutExpired:
        run.timed_out = True
        _kill(proc, evidence_dir, sandbox)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    run.output = reader.text(timeout=30)
    run.elapsed_s = time.perf_counter() - start
    run.returncode = proc.returncode
    if sandbox:
        sandbox.finish()
    run.ranks = []
    for rank in range(nproc):
        path = evidence_dir / f"rank{rank}.json"
        run.ranks.append(json.loads(path.read_text()) if path.is_file() else None)
    return run


# --------------------------------------------------------------------------------------
# The notebook's plain launch: the job's own output, then one line on how it ended.
# --------------------------------------------------------------------------------------

RANK_LINE = re.compile(r"^\[rank(\d+)\]: ?(.*)$")  # torchrun --tee's prefix, set below
# The last line of a Python traceback: "ValueError: ...", "torch.OutOfMemoryError: ...".
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b")
TRACEBACK_START = "Traceback (most recent call last)"


class JobOutput:
    """What a learner needs from torchrun's output (``--tee`` with RANK_LINE's prefix):
    rank 0's lines as they are, every other rank's tagged ``[rank N]``, without torchrun's
    own messages and the tracebacks' frames (each exception line is kept); and, at the
    end, one line on how the job ended."""

    def __init__(self, show=print):
        self.show = show
        self.exceptions = {}  # rank -> its last exception line
        self.in_traceback = set()  # the ranks whose traceback's frames are coming
        self.launcher = []  # torchrun's own lines

    def feed(self, line):
        line = line.rstrip("\n")
        tagged = RANK_LINE.match(line)
        if not tagged:
            self.launcher.append(line)
            return
        rank, text = int(tagged[1]), tagged[2]
        if text.startswith(TRACEBACK_START):
            self.in_traceback.add(rank)
            return
        if rank in self.in_traceback:
            if not EXCEPTION_LINE.match(text):
                return  # a frame
            self.in_traceback.discard(rank)
            self.exceptions[rank] = text
        self.show(text if rank == 0 else f"[rank {rank}] {text}")

    def ending(self, job, returncode, seconds, time_limit_s=None):
        """``SUCCESS: ...``, ``STOPPED: ...`` (time limit) or ``FAILED: ...`` (the rank
        torchrun saw fail first, its exit code and exception)."""
        if returncode == 0:
            return f"SUCCESS: {job}, finished in {seconds:.0f} s."
        if time_limit_s is not None:
            return (f"STOPPED: {job} did not finish within {time_limit_s:.0f} s. Look for "
                    f"an endless loop, or for a collective that not every rank reaches.")
        cause = re.search(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)",
                          "\n".join(self.launcher), re.S)
        rank = int(cause[1]) if cause else min(self.exceptions, default=None)
        if rank is None:
            return f"FAILED after {seconds:.0f} s: {job}: torchrun exited with status " \
                   f"{returncode}."
        how = f" (exit code {cause[2]})" if cause else ""
        what = f": {self.exceptions[rank]}" if rank in self.exceptions else ""
        return f"FAILED after {seconds:.0f} s: {job}: rank {rank} failed first{how}{what}"


def run_script(script, *args, nproc=None, on_gpu=None, time_limit_s=300):
    """Launch ``script`` with ``args`` under torchrun, as a learner would; show its output
    through ``JobOutput`` and end with one line on how it ended. Returns the exit status."""
    if nproc is None or on_gpu is None:
        layout_nproc, layout_on_gpu = process_layout()
        nproc = layout_nproc if nproc is None else nproc
        on_gpu = layout_on_gpu if on_gpu is None else on_gpu
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nproc}", "--tee", "3",
               "--log-line-prefix-template", "[rank${rank}]: ", str(script), *map(str, args)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    if not on_gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""  # one GPU cannot host two NCCL ranks: use the CPU
    output = JobOutput(show=lambda text: print(text, flush=True))
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", env=env, start_new_session=True)
    # At the limit, SIGTERM: torchrun then stops its workers itself.
    timer = threading.Timer(time_limit_s, os.killpg, (proc.pid, signal.SIGTERM))
    timer.start()
    for line in proc.stdout:
        output.feed(line)
    returncode = proc.wait()
    stopped = returncode != 0 and not timer.is_alive()
    timer.cancel()
    print(output.ending(f"{script} on {where(nproc, on_gpu)}", returncode,
                        time.perf_counter() - start, time_limit_s if stopped else None))
    return returncode


# --------------------------------------------------------------------------------------
# One check per requirement, named after its test cell's grade id.
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


def check_runs_and_reaches_target_accuracy(run):
    """The job finishes in time on every rank and rank 0's final model reaches the target
    accuracy on the whole validation set. The speed-up over one process is reported where
    it was measured, and never fails the requirement (SPEEDUP_UNCALIBRATED)."""
    _require_model(run)
    evaluation = run.ranks[0]["val_eval"]
    if "error" in evaluation:
        raise RequirementNotMet(f"rank 0: {evaluation['error']}")
    acc = sum(evaluation["correct"]) / len(evaluation["correct"])
    target = run.config.target_accuracy
    reached = (f"after {run.config.epochs} epochs the model classifies {acc:.1%} of the "
               f"validation set correctly")
    if acc < target:
        raise RequirementNotMet(f"{reached}; the target is {target:.0%}.")
    reached += f" (target {target:.0%}), in {run.elapsed_s:.0f} s"
    speedup, why_not = run.speed()
    if run.on_gpu and run.measures_speedup:
        bar = SPEEDUP_PER_GPU * run.nproc
        if speedup is None:
            reached += f"; the speed-up over one GPU: {why_not}"
        else:
            reached += (f"; {speedup:.2f} times as fast as one GPU (the bar, "
                        f"{SPEEDUP_PER_GPU} x {run.nproc} = {bar:.2f}, is "
                        f"{SPEEDUP_UNCALIBRATED})")
            if speedup < bar:
                reached += (". Below the bar, look for work that every rank repeats in "
                            "full, work on rank 0 alone inside the training loop that the "
                            "others wait for, or ranks sharing one GPU "
                            "(torch.cuda.set_device(local_rank) and device_ids=[local_rank])")
        _passed(reached + ".")
        return
    if speedup is not None:
        reached += (f"; {speedup:.2f} times as fast as one process "
                    f"({SPEEDUP_NOT_REQUIRED_ON_CPU})")
    _passed(reached + ".")


def _train_passes(run):
    """``[rank][epoch] -> list of batches``, each the training-set indices of one batch."""
    passes = [[p["batches"] for p in record["passes"] if p["split"] == "train"]
              for record in run.ranks]
    epochs = run.config.epochs
    for rank, rank_passes in enumerate(passes):
        if len(rank_passes) != epochs:
            raise RequirementNotMet(
                f"rank {rank} went through a DataLoader over train_set {len(rank_passes)} "
                f"times in {epochs} epochs; expected once per epoch. Keep training from a "
                f"DataLoader over train_set (with a sampler, or over a Subset of it).")
    return passes


def _samples(batches):
    return [i for batch in batches for i in batch]


def _droppable(batches):
    """How many samples a pass may have left out of a last, incomplete batch: none if its
    last batch is smaller than the others (nothing was dropped); otherwise up to one batch
    less one (DataLoader(drop_last=True))."""
    if not batches:
        return 0
    size = max(len(batch) for batch in batches)
    return size - 1 if all(len(batch) == size for batch in batches) else 0


def check_shards_disjoint_and_cover(run):
    """In every epoch the ranks train on disjoint shards that together cover the data.

    DistributedSampler may repeat up to world_size - 1 samples to make the shards equal,
    or leave out as many (drop_last=True); a DataLoader with drop_last=True leaves out each
    rank's last incomplete batch. That much overlap, or shortfall, is allowed.
    """
    _require(run)
    passes = _train_passes(run)
    n_train = run.ranks[0]["n_train"]
    sampler_slack = run.nproc - 1
    for epoch in range(run.config.epochs):
        drawn = [_samples(passes[rank][epoch]) for rank in range(run.nproc)]
        total = sum(len(d) for d in drawn)
        covered = set().union(*map(set, drawn))
        repeats = total - len(covered)
        if repeats > sampler_slack:
            sizes = " and ".join(str(len(d)) for d in drawn)
            raise RequirementNotMet(
                f"in epoch {epoch + 1} the ranks drew {sizes} training samples, "
                f"{repeats} of them drawn more than once: the ranks train on overlapping "
                f"data. Give each rank its own shard (DistributedSampler).")
        allowed = sampler_slack + sum(_droppable(passes[rank][epoch])
                                      for rank in range(run.nproc))
        if len(covered) < n_train - allowed:
            raise RequirementNotMet(
                f"in epoch {epoch + 1} {n_train - len(covered)} of the {n_train:,} training "
                f"samples went to no rank (at most {allowed} may be left out by drop_last): "
                f"together the shards must cover the training set.")
    _passed(f"in each of the {run.config.epochs} epochs the {run.nproc} ranks trained on "
            f"disjoint shards that cover the {n_train:,} training samples.")


def check_shards_reshuffled_each_epoch(run):
    """Each rank's samples come in a different order (or from a different shard) in
    every epoch."""
    _require(run)
    passes = _train_passes(run)
    if run.config.epochs < 2:
        raise RequirementNotMet("this check needs a run of two epochs or more.")
    for rank, rank_passes in enumerate(passes):
        for epoch in range(1, len(rank_passes)):
            if _samples(rank_passes[epoch]) == _samples(rank_passes[epoch - 1]):
                raise RequirementNotMet(
                    f"rank {rank} drew the same samples in the same order in epochs "
                    f"{epoch} and {epoch + 1}. DistributedSampler shuffles by epoch "
                    f"number: call set_epoch(epoch) on it before each epoch.")
    _passed(f"every rank drew its samples in a new order in each of the "
            f"{run.config.epochs} epochs.")


def _params(record):
    return array("f", base64.b64decode(record["model"]["params_b64"]))


def _replayed(replay):
    """Which steps a replay result covers, in words."""
    if "segment" in replay:
        first, last = replay["segment"]
        return f"in optimizer steps {first}-{last} (of {replay['steps']})"
    return f"over all {replay['steps']} optimizer steps"


def _replay_verdict(run, replay):
    """The mistake the replay shows, as a reason; None when every step is right."""
    ranks = replay["ranks"]
    moved = [r for r, result in enumerate(ranks) if result["start"] > START_RTOL]
    if moved:
        return (f"the ranks started training from different parameters (rank {moved[0]}'s "
                f"differ from rank 0's by {ranks[moved[0]]['start']:.2g} of their size): "
                f"start every rank from rank 0's parameters (DistributedDataParallel "
                f"broadcasts them when it wraps the model).")
    if all(result["averaged"] <= REPLAY_RTOL for result in ranks):
        return None
    replayed = _replayed(replay)
    if all(result["summed"] is not None and result["summed"] <= REPLAY_RTOL
           for result in ranks):
        return (f"{replayed} the ranks' parameters equal a replay in which the ranks' "
                f"gradients are summed, not averaged: divide the all-reduced gradients by "
                f"the world size (DistributedDataParallel averages them)"
                + (f", and each batch's loss by the number of batches its step accumulates "
                   f"(--accumulate {run.config.accumulate}), as the single-device script "
                   f"does." if (run.config.accumulate or 1) > 1 else "."))
    if all(result["local"] is not None and result["local"] <= REPLAY_RTOL
           for result in ranks):
        return (f"{replayed} each rank's parameters equal a replay of its own batches alone: "
                f"each rank stepped on its own gradients. Average the gradients over the "
                f"ranks at every step (DistributedDataParallel does it in backward()); "
                f"averaging the parameters now and then, or averaging only some steps, is "
                f"not the same.")
    worst = max(range(len(ranks)), key=lambda r: ranks[r]["averaged"])
    return (f"{replayed} rank {worst}'s parameters differ from a single-process replay of "
            f"the same global batches by {ranks[worst]['averaged']:.2g} of a step's update "
            f"(at most {REPLAY_RTOL} allowed): average the gradients over the ranks at "
            f"every step. The replay trains each step on the batches all ranks took from "
            f"their DataLoader since their previous step, with F.cross_entropy (each "
            f"batch's mean, averaged over the step's batches and ranks) and your "
            f"optimizer; keep the model deterministic (no dropout).")


def _steps_of(batches, accumulate):
    """The batches of each optimizer step of one pass of ``batches`` batches, as the
    single-device script takes them: ``accumulate`` each, the last step those left."""
    return [accumulate] * (batches // accumulate) + [batches % accumulate] * bool(
        batches % accumulate)


def _accumulation_reason(run, replay):
    """Why the job's optimizer steps did not each take --accumulate batches per rank (an
    epoch's last step: those left); None when they did, or when the run asks for none."""
    accumulate = run.config.accumulate
    if accumulate is None:
        return None
    for rank, (record, taken) in enumerate(zip(run.ranks, replay.get("micro_batches", []),
                                               strict=False)):
        passes = [len(p["batches"]) for p in record["passes"] if p["split"] == "train"]
        expected = [n for batches in passes for n in _steps_of(batches, accumulate)]
        if taken == expected:
            continue
        step = next((i for i, (a, b) in enumerate(zip(taken, expected, strict=False))
                     if a != b),
                    min(len(taken), len(expected)))
        took = ", ".join(str(n) for n in sorted(set(taken)))
        return (f"rank {rank}'s optimizer steps took {took} batch(es) of train_set each "
                f"(step {step + 1} took {taken[step] if step < len(taken) else 'none'}, "
                f"expected {expected[step] if step < len(expected) else 'none'}): the "
                f"graded run passes --accumulate {accumulate}, so each optimizer step must "
                f"accumulate the gradients of {accumulate} batches on every rank (an "
                f"epoch's last step those left), as the single-device script does.")
    return None


def check_gradients_averaged_over_ranks(run):
    """The ranks train as one: they form one process group, each trains on samples of its
    own, and every rank's parameters after every optimizer step of the job equal a
    single-process replay of the job's steps on the global batch (all ranks' batches of
    each step: the batches each was handed since its previous step), replayed in short
    segments from the parameters at each segment's start; all ranks hold identical
    parameters at the end."""
    _require_model(run)
    for rank, record in enumerate(run.ranks):
        group = record.get("process_group_size")
        if group is not None and group != run.nproc:
            alone = group == 1
            raise RequirementNotMet(
                f"rank {rank} took its first optimizer step in a process group of "
                f"{group} process{'es' * (group > 1)}, not of the job's {run.nproc}"
                + (" (dist.init_process_group was never called): each process trained "
                   "alone, and nothing was averaged. Join the processes with "
                   "dist.init_process_group and wrap the model in DistributedDataParallel."
                   if alone else "."))
    replay = run.ranks[0].get("replay") or {"problem": "rank 0 recorded no replay."}
    if "problem" in replay:
        raise RequirementNotMet(f"the training steps could not be checked: "
                                f"{replay['problem']}")
    shared = replay.get("shared", 0)
    if shared > run.nproc - 1:  # more than DistributedSampler's padding can repeat
        raise RequirementNotMet(
            f"in the first {replay.get('shared_steps', replay['steps'])} optimizer steps "
            f"{shared} of the {max(replay['samples']):,} samples a rank trained on were "
            f"also another rank's: the ranks trained on the same samples, so their steps "
            f"prove nothing about averaging (copies of one training end identical too), and "
            f"the job does the same work several times. Give each rank its own shard "
            f"(DistributedSampler).")
    reason = _accumulation_reason(run, replay) or _replay_verdict(run, replay)
    if reason:
        raise RequirementNotMet(reason)
    reference = _params(run.ranks[0])
    for rank, record in enumerate(run.ranks[1:], start=1):
        params = _params(record)
        if len(params) != len(reference):
            raise RequirementNotMet(f"rank {rank}'s model has a different size from "
                                    f"rank 0's.")
        worst = max(abs(a - b) / (1 + abs(b)) for a, b in zip(params, reference, strict=True))
        if worst > PARAM_RTOL:
            raise RequirementNotMet(
                f"every optimizer step matches a single-process replay, but after training "
                f"rank {rank}'s parameters differ from rank 0's (by up to {worst:.3g}): "
                f"average the gradients over the ranks at every step.")
        gap = replay.get("optimizer_end_gap", [0.0] * run.nproc)[rank]
        if gap > PARAM_RTOL:
            raise RequirementNotMet(
                f"after training rank {rank}'s optimizer state (its momentum) differs from "
                f"rank 0's (by up to {gap:.3g}): the ranks did not average their gradients "
                f"at every step (averaging the parameters afterwards is not the same). "
                f"Average the gradients over the ranks at every step.")
    error = max(result["averaged"] for result in replay["ranks"])
    _passed(f"{_replayed(replay)} every rank's parameters equal a single-process replay on "
            f"the global batch (within {error:.1g} of a step's update), and the "
            f"{run.nproc} ranks hold identical parameters after training.")


def _under(path, folder):
    return folder is not None and Path(path).is_relative_to(folder)


def _short(path, run):
    for base in (run.out_dir.parent, Path.cwd()):
        if Path(path).is_relative_to(base):
            return str(Path(path).relative_to(base))
    return path


def _table_lines(record):
    """``(lines, stream)``: the per-epoch table's lines a rank printed on stdout, else those
    it wrote to stderr (``logging``, ``print(..., file=sys.stderr)``)."""
    if record["metric_lines"]:
        return record["metric_lines"], "stdout"
    return record.get("stderr_metric_lines", []), "stderr"


def check_rank0_only_logs_and_writes(run):
    """Rank 0, and only rank 0, prints the per-epoch table (on stdout or stderr: a line
    giving val_loss or val_acc a value) and writes files."""
    _require(run)
    for rank, record in enumerate(run.ranks[1:], start=1):
        if record["writes"]:
            names = ", ".join(sorted({_short(p, run) for p in record["writes"]})[:4])
            raise RequirementNotMet(
                f"rank {rank} wrote {names}: only rank 0 may write the log and the "
                f"checkpoint (every other rank would overwrite the same files).")
        lines, stream = _table_lines(record)
        if lines:
            raise RequirementNotMet(
                f"rank {rank} printed the per-epoch table too, on {stream}, e.g. "
                f"{lines[0]!r}: only rank 0 should print it.")
    rank0 = run.ranks[0]
    missing = [name for name in ("log.jsonl", "checkpoint.pt")
               if not (run.out_dir / name).is_file()]
    if missing or not any(_under(path, run.out_dir) for path in rank0["writes"]):
        raise RequirementNotMet(f"rank 0 did not write {' and '.join(missing) or 'anything'}"
                                f" in the --out folder.")
    lines, stream = _table_lines(rank0)
    if not lines:
        raise RequirementNotMet("rank 0 did not print the per-epoch table: a line per epoch "
                                "giving val_loss and val_acc their values, on stdout or "
                                "stderr.")
    _passed(f"only rank 0 printed the table (on {stream}"
            + (", where logging writes: stdout and stderr both count" if stream == "stderr"
               else "") + ") and wrote log.jsonl and checkpoint.pt.")


def check_checkpoint_loads_into_plain_model(run):
    """What rank 0 saved last loads into the plain model (no DDP) and holds the trained
    parameters."""
    _require_model(run)
    checkpoint = run.ranks[0]["checkpoint"]
    if not checkpoint["saved"]:
        raise RequirementNotMet("rank 0 saved nothing with torch.save in the --out folder "
                                "(by path, through a file object, or to a temporary file "
                                "renamed into it).")
    if not checkpoint["loads"]:
        raise RequirementNotMet(
            f"the checkpoint rank 0 saved does not load into the plain model with "
            f"load_state_dict: {checkpoint['problem']} Save model.module.state_dict(), "
            f"the model without its DDP wrapper.")
    if not checkpoint["matches_final"]:
        raise RequirementNotMet("the last checkpoint rank 0 saved does not hold the "
                                "parameters the model has at the end of training.")
    _passed("the checkpoint loads into the plain model and holds the trained parameters.")


def _expected_metrics(run):
    """The global validation metrics for what the ranks evaluated: each rank's final model
    on the validation samples of its last pass over val_set, summed over ranks. With no
    such pass on any rank, rank 0's model on the whole validation set."""
    loss_sum = correct = count = 0
    for record in run.ranks:
        shard = [_samples(p["batches"]) for p in record["passes"] if p["split"] == "val"]
        if shard:
            losses, hits = record["val_eval"]["loss"], record["val_eval"]["correct"]
            loss_sum += sum(losses[i] for i in shard[-1])
            correct += sum(hits[i] for i in shard[-1])
            count += len(shard[-1])
    if count == 0:
        evaluation = run.ranks[0]["val_eval"]
        loss_sum, correct = sum(evaluation["loss"]), sum(evaluation["correct"])
        count = len(evaluation["loss"])
    return loss_sum / count, correct / count


def _reported_metrics(run):
    log = run.out_dir / "log.jsonl"
    if not log.is_file():
        raise RequirementNotMet("there is no log.jsonl in the --out folder.")
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    try:
        last = json.loads(lines[-1])
        return float(last["val_loss"]), float(last["val_acc"])
    except (IndexError, ValueError, KeyError, TypeError):
        raise RequirementNotMet("the last line of log.jsonl is not a JSON record with "
                                "val_loss and val_acc.") from None


def check_validation_metrics_are_global(run):
    """The validation loss and accuracy in the log are over the whole validation set
    (every rank's share), not one rank's."""
    _require_model(run)
    for rank, record in enumerate(run.ranks):
        if "error" in record["val_eval"]:
            raise RequirementNotMet(f"rank {rank}: {record['val_eval']['error']}")
    loss, acc = _reported_metrics(run)
    expected_loss, expected_acc = _expected_metrics(run)
    if (abs(acc - expected_acc) > ACC_TOLERANCE
            or not math.isclose(loss, expected_loss, rel_tol=LOSS_RTOL, abs_tol=1e-4)):
        raise RequirementNotMet(
            f"the last epoch's log reports val_loss {loss:.4f}, val_acc {acc:.4f}; over "
            f"the whole validation set the model scores val_loss {expected_loss:.4f}, "
            f"val_acc {expected_acc:.4f}. Each rank evaluates only its share: sum the "
            f"ranks' sums (dist.all_reduce) before dividing.")
    _passed(f"the log reports the global validation metrics (val_loss {loss:.4f}, "
            f"val_acc {acc:.4f}).")


def scaled_learning_rates(lr, world_size):
    """``{rule: learning rate}``: ``lr``, tuned for one process's batch, scaled to a global
    batch world_size times as large (notebook 03)."""
    return {"linear": lr * world_size, "square-root": lr * math.sqrt(world_size)}


def check_learning_rate_follows_global_batch(run):
    """The learning rate the optimizer uses (its peak over the run, so warmup is allowed)
    is --lr scaled from one process's batch to the global batch, by the linear or the
    square-root rule."""
    _require(run)
    base, world = run.config.lr, run.nproc
    allowed = scaled_learning_rates(base, world)
    for rank, record in enumerate(run.ranks):
        if not record["lrs"]:
            raise RequirementNotMet(f"rank {rank} made no optimizer step.")
        peak = max(record["lrs"])
        if not any(math.isclose(peak, lr, rel_tol=LR_RTOL) for lr in allowed.values()):
            rules = " or ".join(f"{lr:.4g} ({rule})" for rule, lr in allowed.items())
            raise RequirementNotMet(
                f"rank {rank}'s optimizer trained with a learning rate of at most "
                f"{peak:.4g}; the global batch is {world} x --batch-size, so scale --lr "
                f"{base:g} by the world size: {rules}.")
    rule = next(rule for rule, lr in allowed.items()
                if math.isclose(max(run.ranks[0]["lrs"]), lr, rel_tol=LR_RTOL))
    _passed(f"the learning rate peaks at {max(run.ranks[0]['lrs']):.4g}: --lr {base:g} "
            f"scaled to a global batch {world} times as large ({rule} rule).")


CHECKS = {grade_id: globals()[f"check_{grade_id}"] for grade_id in REQUIREMENTS}


def report(run):
    """Print each requirement's verdict, the points, whether they reach the pass mark and,
    if not, what is missing; return ``(points, passed)``."""
    met, lines = set(), []
    for grade_id, points in REQUIREMENTS.items():
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                CHECKS[grade_id](run)
        except RequirementNotMet:
            lines.append(f"  not met  {grade_id} (0 of {points})")
        else:
            met.add(grade_id)
            lines.append(f"  met      {grade_id} ({points} of {points})")
    points = sum(REQUIREMENTS[grade_id] for grade_id in met)
    passed = passes(met)
    print("\n".join(lines))
    if isinstance(run, Run) and run.ok:
        print(run.speed_summary())
    print(f"Total: {points} of {sum(REQUIREMENTS.values())} points. Pass mark: "
          f"{pass_rule()}. Result: {'PASSED' if passed else 'NOT PASSED'}.")
    missing = [grade_id for grade_id in PASS_REQUIRES if grade_id not in met]
    if missing:
        print(f"Not passed without {' and '.join(missing)}: the pass mark requires "
              f"{'them' if len(missing) > 1 else 'it'} whatever the other points.")
    record_result(run, met)
    return points, passed


PROGRESS_KEY = "ddp_refactor"  # the assessment's key (and notebook) in the learner's progress


def record_result(run, met):
    """Record the result of the requirements ``met`` in the learner's workshop progress
    (workshop_lib.progress; its record, or None): where the learner runs the checks, their
    cells or Validate (``NBGRADER_EXECUTION=validate``), never while nbgrader autogrades (as
    the grader, into nobody's progress), nor where the workshop's library is not installed.
    Never raises: a result that cannot be recorded costs the learner nothing."""
    if _sandbox_module().grading():
        return None
    try:
        from workshop_lib import progress
    except ImportError:
        return None
    points, total = sum(REQUIREMENTS[g] for g in met), sum(REQUIREMENTS.values())
    not_met = [grade_id for grade_id in REQUIREMENTS if grade_id not in met]
    details = {"points": points, "max_points": total,
               "met": [grade_id for grade_id in REQUIREMENTS if grade_id in met],
               "not_met": not_met,
               "validate": os.environ.get("NBGRADER_EXECUTION") == "validate"}
    if isinstance(run, Run):
        details.update(processes=run.nproc, on_gpu=run.on_gpu, epochs=run.config.epochs,
                       elapsed_s=round(run.elapsed_s, 1))
        try:
            details.update(samples_per_s=run.samples_per_s, speedup=run.speed()[0])
        except Exception:  # noqa: BLE001 - records a job too broken to time: no speed then
            pass
    passed = passes(met)
    reason = (f"{points} of {total} points: {'PASSED' if passed else 'NOT PASSED'}"
              + (f"; not met: {', '.join(not_met)}" if not_met else ""))
    return progress.record_quietly("assessment", PROGRESS_KEY, PROGRESS_KEY, passed, reason,
                                   details)
