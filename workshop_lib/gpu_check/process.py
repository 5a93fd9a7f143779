"""Run one command of the check under a time limit, its output in log files.

A command that outlives its limit is stopped with everything it started: its process
group, and every descendant in a group of its own (torchrun starts each worker in a new
session, so its group alone would leave the workers running on the GPU). SIGTERM first,
so torchrun can stop its workers; SIGKILL for whatever is left after ``GRACE_S``. No step
waits on a teardown without a limit.
"""
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

GRACE_S = 5.0  # from SIGTERM to SIGKILL
TAIL_BYTES = 64 * 1024  # of each log, kept in memory for the report


@dataclass
class Finished:
    """What a command did: exit code (None if it had to be killed), whether it ran out of
    time, its seconds, and the ends of its stdout and stderr (whole logs in the files)."""

    command: list
    returncode: int | None
    timed_out: bool
    seconds: float
    limit_s: float
    stdout: str
    stderr: str
    stdout_path: Path
    stderr_path: Path

    @property
    def ok(self):
        return self.returncode == 0 and not self.timed_out


def run(command, limit_s, log_dir, name, env=None, cwd=None):
    """Run ``command`` (a list) for at most ``limit_s`` seconds; stdout and stderr go to
    ``log_dir/name.stdout`` and ``.stderr``."""
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    stdout_path, stderr_path = log_dir / f"{name}.stdout", log_dir / f"{name}.stderr"
    start = time.monotonic()
    with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
        process = subprocess.Popen([str(c) for c in command], stdout=out, stderr=err,
                                   stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                                   start_new_session=True)
        timed_out = False
        try:
            process.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            stop(process)
    return Finished(command=[str(c) for c in command], returncode=process.returncode,
                    timed_out=timed_out, seconds=time.monotonic() - start, limit_s=limit_s,
                    stdout=tail(stdout_path), stderr=tail(stderr_path),
                    stdout_path=stdout_path, stderr_path=stderr_path)


def tail(path, size=TAIL_BYTES):
    with open(path, "rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - size))
        return f.read().decode(errors="replace")


def stop(process):
    """SIGTERM to ``process``, its group and its descendants' groups; after ``GRACE_S``,
    SIGKILL to all of them that are left (the descendants are listed before the first
    signal: a worker whose torchrun exited is no longer below it)."""
    family = descendants(process.pid)
    for pid in (process.pid, *family):
        _signal_group_of(pid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and (process.poll() is None or any(map(_alive, family))):
        time.sleep(0.1)
    family += [pid for pid in descendants(process.pid) if pid not in family]
    for pid in (process.pid, *family):
        if pid == process.pid and process.poll() is not None:
            continue  # reaped: its pid may belong to another process by now
        if _alive(pid):
            _signal_group_of(pid, signal.SIGKILL)
    try:
        process.wait(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        pass  # not reaped: reported as timed out all the same, never waited on longer


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group_of(pid, sig):
    try:
        group = os.getpgid(pid)
    except ProcessLookupError:
        return
    if group == os.getpgrp():  # never this check's own group
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
        return
    try:
        os.killpg(group, sig)
    except (ProcessLookupError, PermissionError):
        pass


def descendants(pid):
    """Every process below ``pid`` (children, their children, ...), read from /proc;
    empty where there is no /proc."""
    children = {}
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = entry.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.parent.name))
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children.get(child, []))
    return found
