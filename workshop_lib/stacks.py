"""Where a stuck rank's Python code is, read without a tracer: each rank dumps its own stack.

py-spy reads another process's memory with ptrace, which an ordinary account often may
not do: under Ubuntu's default ``kernel.yama.ptrace_scope=1`` a process may trace only its
own descendants (torchrun's workers are not the notebook's), and a container without
``SYS_PTRACE`` may trace nothing. So every rank of a job ``workshop_lib.launch`` starts
asks Python's ``faulthandler`` to write its threads' stacks to a file of its own on
``SIGUSR1`` (set up when the rank imports ``workshop_lib``). Its handler is C code that
runs at once, even while the rank waits inside a collective, and any process that may
signal the rank (its own user's) may ask: no ptrace involved. ``dump`` signals each rank
that has set it up and reads its file; py-spy serves only a process that has not, and only
where it can attach.
"""
import contextlib
import faulthandler
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

ENV = "WORKSHOP_STACKS_DIR"  # set by the launcher: where each rank writes its dumps
SIGNAL = signal.SIGUSR1
# faulthandler's frame line: '  File "/path/to/file.py", line 42 in main'
FRAME = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+) in (?P<function>.*)$')
_dump_file = None  # kept open for the life of the rank: faulthandler writes to its fd


def dump_file(directory, rank, pid):
    """The file rank ``rank`` (process ``pid``) writes its stacks to in ``directory``."""
    return Path(directory) / f"rank{rank}-pid{pid}.txt"


def enable_from_env(environ=os.environ):
    """In a rank of a launched job (``RANK`` and ``WORKSHOP_STACKS_DIR`` set): dump every
    thread's stack to this rank's file on SIGUSR1. Elsewhere nothing: a process that never
    set it up keeps SIGUSR1's default, which ends it, and ``dump`` never sends it one."""
    global _dump_file
    directory, rank = environ.get(ENV), environ.get("RANK")
    if not directory or rank is None or _dump_file is not None:
        return None
    path = dump_file(directory, rank, os.getpid())
    unready = path.with_suffix(".starting")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _dump_file = unready.open("a")
        faulthandler.register(SIGNAL, file=_dump_file, all_threads=True, chain=False)
        # Named for ``dump`` only once the handler is in place: a signal sent earlier would
        # end the rank. The open file keeps its descriptor through the rename.
        unready.rename(path)
    except OSError:  # a folder this process may not write: no dumps, and nothing else lost
        return None
    return path


def dump(pids, directory, wait_s=5.0):
    """``{rank: text}``: where each rank's Python code is now, innermost frame first, one
    frame a line as ``function (file:line)``. ``pids``: ``{rank: pid}`` of the ranks."""
    return {rank: dump_one(rank, pid, directory, wait_s) for rank, pid in pids.items()}


def dump_one(rank, pid, directory, wait_s=5.0):
    path = dump_file(directory, rank, pid) if directory else None
    if path is not None and path.is_file():
        return readable(signal_and_read(pid, path, wait_s))
    return py_spy(pid)


def signal_and_read(pid, path, wait_s=5.0):
    """Signal ``pid`` to dump its stacks into ``path``; the text it added."""
    start = path.stat().st_size
    try:
        os.kill(pid, SIGNAL)
    except ProcessLookupError:
        return "(the process ended before it could be asked)"
    except PermissionError:
        return "(not allowed to signal it: it runs as another user)"
    deadline, size = time.monotonic() + wait_s, start
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = path.stat().st_size
        if now > start and now == size:  # it wrote, and has stopped writing
            break
        size = now
    with path.open(errors="replace") as f:
        f.seek(start)
        text = f.read()
    return text or f"(no stack written within {wait_s:.0f} s)"


def readable(text):
    """faulthandler's dump in py-spy's layout: ``function (file:line)`` per frame, paths
    inside the Python installation or the working folder shortened."""
    lines = []
    for line in text.splitlines():
        frame = FRAME.match(line)
        if frame:
            lines.append(f"    {frame['function']} ({short_path(frame['file'])}:"
                         f"{frame['line']})")
        elif line.strip():
            lines.append(line.strip())
    return "\n".join(lines) + "\n"


def short_path(path):
    """``torch/distributed/distributed_c10d.py`` for an installed module, ``debug_job.py``
    for a script in the working folder; other paths as they are."""
    roots = {sysconfig.get_paths()[key] for key in ("purelib", "platlib", "stdlib")}
    roots |= {entry for entry in sys.path if Path(entry).name in ("site-packages",
                                                                  "dist-packages")}
    for root in sorted(roots, key=len, reverse=True) + [os.getcwd()]:
        with contextlib.suppress(ValueError):
            return str(Path(path).relative_to(root))
    return path


def py_spy_path():
    """py-spy beside this Python, else on PATH; None when there is none."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.is_file() else shutil.which("py-spy")


def py_spy(pid):
    """py-spy's dump of a process that did not set up its own (it needs ptrace rights)."""
    tool = py_spy_path()
    if tool is None:
        return ("(this process does not dump its own stack (it did not import workshop_lib, "
                "or is still starting), and py-spy is not installed)")
    done = subprocess.run([tool, "dump", "--pid", str(pid)], capture_output=True, text=True)
    if done.returncode == 0:
        return done.stdout
    return (f"(this process does not dump its own stack (it did not import workshop_lib, or "
            f"is still starting), and py-spy could not attach: "
            f"{(done.stderr.strip().splitlines() or ['no reason given'])[-1]}; tracing "
            f"another process needs ptrace rights (kernel.yama.ptrace_scope=0, or "
            f"SYS_PTRACE in a container))")


# Frames a decorator adds between a call and the function called (torch's collectives are
# wrapped by c10d_logger's ``wrapper``): the call a rank made is the first frame past them.
DECORATORS = {"wrapper", "inner", "_fn", "decorate_context"}
READABLE_FRAME = re.compile(r"^\s+(?P<function>\S+) \((?P<file>.+):(?P<line>\d+)\)$")


def where_waiting(text, script):
    """Where a rank of ``dump``'s ``text`` waits in ``script`` (a file name as the dump
    shows it): ``{"line": n, "code": that line of the script, "calls": the function it
    called there}``, from the innermost thread that runs ``script``; None if none does."""
    thread = []
    for line in [*text.splitlines(), ""]:
        frame = READABLE_FRAME.match(line)
        if frame:
            thread.append(frame)
            continue
        ours = [i for i, f in enumerate(thread) if Path(f["file"]).name == Path(script).name]
        if ours:
            innermost = ours[0]
            number = int(thread[innermost]["line"])
            lines = Path(script).read_text().splitlines() if Path(script).is_file() else []
            called = [f["function"] for f in reversed(thread[:innermost])
                      if f["function"] not in DECORATORS]
            return {"line": number,
                    "code": lines[number - 1].strip() if number <= len(lines) else "",
                    "calls": called[0] if called else None}
        thread = []
    return None
