"""How the checks start a job, stop it and read what it printed.

``_launch_once`` is one graded launch: a fresh scratch folder (0700) holding a copy of the
script, the recorder and the data module; the run's settings in a file of that folder (a
command line is visible to every account on the machine); torchrun with the recorder as
every process's entry point, inside the bubblewrap sandbox of ``ddp_sandbox.py`` wherever
one can be made; the job stopped, all its processes with it, at its time limit; then each
rank's record read back. ``ddp_checks.launch`` calls it for the graded run and, where the
speed-up is measured, for the single-process run.

``JobOutput`` is for the notebook's plain launch (``ddp_checks.run_script``): it reads
torchrun's output and keeps what a learner needs, then says in one line how the job ended.

Your copy of this file is replaced by the instructor's when your work is graded.

Standard library only: the notebook's kernel imports this file.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from ddp_checks_run import Run

RECORDER = Path(__file__).resolve().with_name("ddp_recorder.py")
# The recorder and the rooms it loads beside itself: each job gets a copy of all of them.
RECORDER_FILES = ("ddp_recorder.py", "ddp_recorder_data.py", "ddp_recorder_steps.py",
                  "ddp_recorder_outputs.py", "ddp_recorder_replay.py")
TIME_LIMIT_ENV = "DDP_CHECKS_TIME_LIMIT_S"  # instructor's override of Config.time_limit_s
# The job's output the grader keeps (its first characters): a correct job writes a few
# thousand; the rest of a flood is dropped, with a note in the output.
OUTPUT_CHARS = 1_000_000


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


def _sandbox_module():
    """ddp_sandbox.py next to this file, loaded by its path (the workshop's conversion
    check loads ddp_checks by its path too, with nothing on sys.path)."""
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
    """run_dir, made afresh (0700), with what the job needs: the script, the recorder's
    files and the data module (the copy beside the script, where the script finds it)."""
    scratch = run_dir.resolve()
    scratch.mkdir(mode=0o700, parents=True)
    data = Path(script).resolve().with_name("digits_data.py")
    for source in (Path(script), *(RECORDER.with_name(name) for name in RECORDER_FILES),
                   data if data.is_file() else RECORDER.with_name("digits_data.py")):
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

RANK_LINE = re.compile(r"^\[rank(\d+)\]: ?(.*)$")  # torchrun --tee's prefix (run_script's)
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
