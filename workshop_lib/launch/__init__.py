"""Launch a torchrun job and report it: rank-tagged output, then a one-paragraph summary.

torchrun's own report of a failure is a wall of tracebacks from every layer of the
launcher. This wrapper shows each process's output as it comes (rank 0 as is, with its
progress bar; other ranks prefixed ``[rank N]``), hides torchrun's internals, and ends
with what a learner needs: success and the run record's path, or which rank failed
first, with what error and exit code, and how many restarts were used.

    python -m workshop_lib.launch --nproc-per-node=2 -m workshop_lib.train_ddp --epochs 5
    python -m workshop_lib.launch --max-restarts=1 -m workshop_lib.train_ddp \
        --inject-fault kill@1:50
    python -m workshop_lib.launch --nnodes=2 --nproc-per-node=1 -m workshop_lib.train_ddp

From Python (notebooks): ``result = launch.run(["-m", "workshop_lib.train_ddp", ...])``;
``launch.start`` returns the running job, whose ``dump_stacks()`` prints each rank's Python
stack while it seems stuck (each rank writes its own on a signal: ``stacks.py``).
torchrun's internal tracebacks go to a log folder.
A rank that stops calling collectives becomes an error once the others' next collective
times out (``--dist-timeout``); ``faults.py`` makes a rank fail on purpose to show each
case (notebook 04, ``tests/test_reliability.py``).
With ``--nnodes``, one torchrun agent per node, all on this machine (``nodes.py``).
"""
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from workshop_lib import hardware, stacks
from workshop_lib.errors import CourseError

# torchrun keeps one key-value store for all restarts of a job by default; a restarted
# rank can then read the address a dead rank published in the previous attempt and fail
# with "Gloo connectFullMesh failed ... Connection refused", or hang. A fresh store per
# attempt removes the stale keys: set it too when calling torchrun --max-restarts by hand.
# Measured on the course's CPU set-up (2 gloo ranks, rank 1 SIGKILLed mid-epoch, one
# restart allowed), runs that finished: torchrun's defaults 4 of 9 (3 failed with
# connectFullMesh, 2 hung until stopped after 4-5 min); a fresh store per attempt 19 of
# 20 (in the 20th torchrun read a crashing rank's half-written error file and crashed:
# errors.record_errors); both, 20 of 20, each resumed run bit-identical to the
# uninterrupted one (tests/test_reliability.py checks that).
RESTART_SAFE_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
# On GPUs a collective that times out is ended by NCCL's watchdog thread, not by Python:
# it logs the collective, has the Flight Recorder dump each rank's last collectives, sleeps
# 4 x TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC (60 s by default) and takes the process down with
# SIGABRT (torch 2.11-2.14, ProcessGroupNCCL.cpp, Watchdog::runLoop). Mode 3 rethrows
# without aborting the communicators (torchrun's 1 can hang in ncclCommAbort); 4 s a dump
# attempt ends a rank within its timeout + about 25 s. A learner's own settings win.
NCCL_FAIL_FAST_ENV = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
                      "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "4000"}
FLIGHT_RECORDER = "flight_recorder"  # in the log folder: rank_<global rank>, one per rank
# ProcessGroupNCCL's own words for a timed-out collective (WorkNCCL::checkTimeout).
WATCHDOG = re.compile(r"\[Rank (\d+)\] Watchdog caught collective operation timeout: "
                      r"WorkNCCL\(SeqNum=(\d+), OpType=(\w+), NumelIn=(\d+), "
                      r"NumelOut=(\d+), Timeout\(ms\)=(\d+)\) ran for (\d+) milliseconds")
SIGNALS = {-s.value: s.name for s in signal.Signals}
# The last line of a Python traceback: "RuntimeError: ...", "torch.OutOfMemoryError: ...".
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Fault|Interrupt)\b.*: ")
# The frames of a crashed rank's traceback ("[rank1]:   File ..."): kept in the log folder,
# left out of the stream, where the exception line itself still shows.
TRACEBACK_FRAME = re.compile(r"^\[rank\d+\]:( {2,}|\s*Traceback|\s*\^+\s*$)")


@dataclass
class LaunchResult:
    returncode: int
    attempts: int
    log_dir: Path
    failed_rank: int | None = None
    exitcode: int | None = None
    error: str | None = None
    seconds: float = 0.0
    fault_to_exit_s: float | None = None  # from an injected fault's first report to the end
    output: list = field(default_factory=list)

    @property
    def ok(self):
        return self.returncode == 0

    def outcome(self):
        """What the job did, as plain values (for a notebook's record of it)."""
        return {"ok": self.ok, "attempts": self.attempts, "failed_rank": self.failed_rank,
                "exitcode": self.exitcode, "error": self.error, "seconds": self.seconds,
                "fault_to_exit_s": self.fault_to_exit_s}

    def summary(self):
        restarts = f" after {self.attempts - 1} restart(s)" if self.attempts > 1 else ""
        if self.ok:
            return f"SUCCESS in {self.seconds:.0f} s{restarts}."
        how = SIGNALS.get(self.exitcode, f"exit code {self.exitcode}")
        if self.exitcode is not None and self.exitcode < 0:
            how = f"killed by {how}"
        where = f"rank {self.failed_rank}" if self.failed_rank is not None else "the job"
        return (f"FAILED after {self.seconds:.0f} s{restarts}: {where} failed first ({how})"
                + (f": {self.error}" if self.error else "")
                + f". Each rank's full output: {self.log_dir}")


def local_rank_of(path):
    """The rank whose log file ``path`` is (``<log-dir>/<run>/attempt_N/<local rank>/...``):
    its local rank, which is its global rank where one torchrun agent runs every rank."""
    return int(Path(path).parent.name)


class _RankLogs:
    """Follow the per-rank log files torchrun writes (``--redirects 3 --log-dir``).

    ``rank_of(path)``: the global rank that writes a log file, or None while not yet known
    (its lines wait until it is).
    """

    def __init__(self, log_dir, echo, rank_of=local_rank_of):
        self.log_dir, self.echo, self.rank_of = Path(log_dir), echo, rank_of
        self.offsets, self.partial = {}, {}
        self.fault_seen_at = None

    def poll(self):
        for path in sorted(self.log_dir.glob("*/attempt_*/*/std*.log")):
            rank = self.rank_of(path)
            if rank is None:
                continue
            with path.open("rb") as f:
                f.seek(self.offsets.get(path, 0))
                chunk = f.read()
                self.offsets[path] = f.tell()
            if chunk:
                self._show(path, rank, chunk.decode(errors="replace"))

    def _show(self, path, rank, text):
        if "[fault]" in text and self.fault_seen_at is None:
            self.fault_seen_at = time.monotonic()
        if rank == 0:  # rank 0 verbatim, so its progress bar's \r redraws keep working
            for piece in text.splitlines(keepends=True):
                if not (piece.endswith("\n") and TRACEBACK_FRAME.match(piece)):
                    self.echo(piece)
            return
        text = self.partial.pop(path, "") + text
        *lines, rest = re.split(r"\r?\n", text)
        self.partial[path] = rest
        for line in lines:
            if line.strip() and not TRACEBACK_FRAME.match(line):
                self.echo(f"[rank {rank}] {line}\n")


def _root_cause(torchrun_output, log_dir, rank_of=local_rank_of):
    """(rank, exitcode, message) of the first failure torchrun observed, if any."""
    block = torchrun_output.split("Root Cause (first observed failure):")[-1]
    rank = re.search(r"rank\s*:\s*(\d+)", block)
    exitcode = re.search(r"exitcode\s*:\s*(-?\d+)", block)
    rank = int(rank[1]) if rank else None
    message = None
    error_files = sorted(Path(log_dir).glob("*/attempt_*/*/error.json"))
    for error_file in error_files:
        if rank is None or rank_of(error_file) == rank:
            info = json.loads(error_file.read_text()).get("message", {})
            message = (info.get("message") if isinstance(info, dict) else str(info)) or message
    if message is None and rank is not None:
        # A clean one-line "error: ..." from a course script, else the exception line that
        # ends the rank's traceback (a script without torchrun's error file).
        for path in sorted(Path(log_dir).glob("*/attempt_*/*/stderr.log")):
            if rank_of(path) != rank:
                continue
            lines = [re.sub(r"^\[rank\d+\]: ", "", line)
                     for line in path.read_text(errors="replace").splitlines()]
            errors = [line[len("error: "):] for line in lines if line.startswith("error: ")]
            raised = [line for line in lines if EXCEPTION_LINE.match(line)]
            message = (errors or raised or [message])[-1]
    message = watchdog_timeout(log_dir, rank, rank_of) or message
    return rank, int(exitcode[1]) if exitcode else None, message


def flight_recorder_env(log_dir):
    """Where each rank's Flight Recorder dump goes (torch reads the first name, 2.11 the
    second too): ``<log_dir>/flight_recorder/rank_<rank>``."""
    folder = Path(log_dir) / FLIGHT_RECORDER
    folder.mkdir(parents=True, exist_ok=True)
    return {"TORCH_FR_DUMP_TEMP_FILE": f"{folder}/rank_",
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{folder}/rank_"}


def watchdog_timeout(log_dir, rank=None, rank_of=local_rank_of):
    """NCCL's watchdog's report of a timed-out collective in the ranks' logs (``rank``'s if
    given), as a sentence that names the collective and where the Flight Recorder's dumps
    are; None where no rank's log has one."""
    for path in sorted(Path(log_dir).glob("*/attempt_*/*/stderr.log")):
        if rank is not None and rank_of(path) != rank:
            continue
        found = WATCHDOG.search(path.read_text(errors="replace"))
        if found:
            who, seq, op, numel, _, timeout_ms, ran_ms = found.groups()
            said = (f"NCCL's watchdog: rank {who}'s {op} (collective #{seq} of its process "
                    f"group, {int(numel):,} elements) ran {int(ran_ms) / 1000:.0f} s, past its "
                    f"{int(timeout_ms) / 1000:.0f} s timeout, and it took the process down")
            dumps = sorted(Path(log_dir).glob(f"**/{FLIGHT_RECORDER}/rank_*"))
            if dumps:
                folder = dumps[0].parent
                said += (f"; each rank's last collectives: torchfrtrace {folder} -p rank_ "
                         f"(the Flight Recorder)")
            return said
    return None


def check_port_free(port, host="127.0.0.1"):
    """Fail with the fix, not torchrun's traceback, when a rendezvous port is taken."""
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            raise CourseError(
                f"port {port} is already in use (another torchrun job, or a notebook still "
                f"running one?); pick another --master-port, or let --standalone choose one"
            ) from None


def run(target, nproc="auto", max_restarts=0, timeout=None, env=None, quiet=False,
        stream=None, master_port=None):
    """Run ``torchrun ... <target>`` and return a LaunchResult; prints output and summary.

    ``target``: what follows torchrun's own flags, e.g. ``["-m", "workshop_lib.train_ddp",
    "--epochs", "5"]``. ``timeout`` (seconds) stops the whole job, as a hang would need.
    ``master_port``: a fixed rendezvous port instead of ``--standalone``'s free one.
    """
    job = start(target, nproc, max_restarts, env, quiet, stream, master_port)
    return job.wait(timeout)


def start(target, nproc="auto", max_restarts=0, env=None, quiet=False, stream=None,
          master_port=None):
    """Start ``torchrun ... <target>`` and return at once: a ``Job`` to watch (its
    ``dump_stacks()`` shows where each rank is, for a job that seems stuck) and ``wait``."""
    nproc = hardware.detect().ddp_nproc if nproc == "auto" else int(nproc)
    if master_port is None:
        rendezvous = ["--standalone"]
    else:
        check_port_free(master_port)
        rendezvous = ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{master_port}"]
    log_dir = Path(tempfile.mkdtemp(prefix="torchrun-logs-"))
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), *rendezvous, f"--nproc-per-node={nproc}",
               f"--max-restarts={max_restarts}", "--redirects=3", f"--log-dir={log_dir}",
               *target]
    full_env = {**NCCL_FAIL_FAST_ENV, **flight_recorder_env(log_dir), **os.environ,
                "PYTHONUNBUFFERED": "1", **RESTART_SAFE_ENV, **(env or {})}
    return Job(command, full_env, log_dir, quiet, stream or sys.stdout)


class Job:
    """A running torchrun job: its output is shown as it comes while someone waits.

    ``rank_of`` and ``output``: for one of several agents of a job (``nodes.py``), how
    to tell the global rank of its log files, and the list all agents' output goes to.
    """

    def __init__(self, command, env, log_dir, quiet, stream, rank_of=local_rank_of,
                 output=None):
        self.log_dir, self.quiet, self.stream = log_dir, quiet, stream
        self.rank_of = rank_of
        self.output = [] if output is None else output
        self.started = time.monotonic()
        self.stacks_dir = Path(log_dir) / "stacks"  # where each rank dumps its own stack
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT,
                                        env={**env, stacks.ENV: str(self.stacks_dir)},
                                        start_new_session=True)
        self.logs = _RankLogs(log_dir, self.echo, rank_of)
        self.torchrun_output = []
        self.reader = _Reader(self.process.stdout, self.torchrun_output)

    def echo(self, text):
        self.output.append(text)
        if not self.quiet:
            self.stream.write(text)
            self.stream.flush()

    def worker_pids(self):
        """``{rank: pid}`` of the training processes running now."""
        import psutil

        pids = {}
        try:
            children = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return pids
        for child in children:
            try:
                rank = child.environ().get("RANK")
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if rank is not None:
                pids[int(rank)] = child.pid
        return dict(sorted(pids.items()))

    def dump_stacks(self):
        """Print where every rank's Python code is now, rank by rank, innermost frame first
        (and return it, ``{rank: text}``):
        each rank of a course job writes its own stack on a signal (``stacks.py``), which
        needs no ptrace rights; py-spy serves only a process that does not."""
        self.logs.poll()
        pids = self.worker_pids()
        if not pids and self.process.poll() is not None:
            # A stuck job that nobody stopped ends at its collective timeout.
            print(f"no rank is running: the job has ended. {self.result().summary()}")
        elif not pids:
            print("no rank is running yet (the job has not started its processes)")
        dumps = stacks.dump(pids, self.stacks_dir)
        for rank, text in dumps.items():
            print(f"===== rank {rank} (pid {pids[rank]}) =====\n{text}")
        return dumps

    def wait_until_stuck(self, timeout=90, looks=3, every_s=1.0):
        """Wait until every rank's stack has stayed the same for ``looks`` looks ``every_s``
        apart: the ranks wait somewhere (a busy rank's stack keeps changing), and each has
        set up its own dump (a rank still importing has not). True then; False when the
        job ended or ``timeout`` seconds passed first."""
        deadline, seen = time.monotonic() + timeout, []
        while time.monotonic() < deadline and self.process.poll() is None:
            self.logs.poll()
            pids = self.worker_pids()
            ready = pids and all(stacks.dump_file(self.stacks_dir, rank, pid).is_file()
                                 for rank, pid in pids.items())
            seen = [*seen, stacks.dump(pids, self.stacks_dir)][-looks:] if ready else []
            if len(seen) == looks and all(look == seen[0] for look in seen):
                return True
            time.sleep(every_s)
        return False

    def wait(self, timeout=None):
        """Show the output until the job ends (or ``timeout`` seconds after its start, when
        it is stopped); return its LaunchResult and print its summary."""
        timed_out = False
        while self.process.poll() is None:
            self.logs.poll()
            if timeout is not None and time.monotonic() - self.started > timeout:
                timed_out = True
                self.stop()
                break
            time.sleep(0.1)
        result = self.result(timeout if timed_out else None)
        self.echo("\n" + result.summary() + "\n")
        return result

    def result(self, stopped_after=None):
        """The LaunchResult of the ended job (``stopped_after``: the time limit that
        stopped it, if one did)."""
        self.process.wait()
        self.reader.join()
        self.logs.poll()
        text = "".join(self.torchrun_output)
        attempts = len({p.name for p in self.log_dir.glob("*/attempt_*")}) or 1
        end = time.monotonic()
        result = LaunchResult(self.process.returncode, attempts, self.log_dir,
                              seconds=end - self.started, output=self.output)
        if self.logs.fault_seen_at is not None:
            result.fault_to_exit_s = end - self.logs.fault_seen_at
        if not result.ok:
            result.failed_rank, result.exitcode, result.error = _root_cause(
                text, self.log_dir, self.rank_of)
            if stopped_after is not None:
                result.error = f"stopped after the {stopped_after:.0f} s time limit"
            if result.exitcode is None:
                result.exitcode = result.returncode
        return result

    def stop(self):
        """Stop torchrun and its processes (SIGTERM; SIGKILL if they outlive 30 s). A job
        that already ended is left as it ended: stopping it twice, or after its own end, is
        no error."""
        workers = self.worker_pids().values()  # each in a session of its own
        # The group is gone once torchrun and everything it started have ended.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
        for pid in workers:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


class _Reader:
    """Drain torchrun's own output in a thread, so its pipe never fills and blocks it."""

    def __init__(self, pipe, sink):
        import threading

        self.thread = threading.Thread(target=lambda: sink.extend(
            line.decode(errors="replace") for line in pipe), daemon=True)
        self.thread.start()

    def join(self):
        self.thread.join(timeout=10)
