"""User-facing errors: one line that says what went wrong and what to do about it.

A script's ``main`` gets two decorators: ``record_errors`` (outermost: a crash's traceback
also goes to torchrun's error file) and ``exit_cleanly_on_course_error`` (a CourseError or
a GPU out of memory becomes one line and exit code 2 or 3). Inside a process group an
error does not travel up to them: ``distributed.exit_at_once`` reports it the same way,
with ``report``, and ends the process there (``distributed.py`` says why).
"""
import argparse
import functools
import json
import os
import sys
import time
import traceback

from workshop_lib import files

ERROR_FILE = "TORCHELASTIC_ERROR_FILE"  # where torchrun looks for a failed worker's error
# In a worker of ``distributed.spawn``: the file its error goes to, for its parent to raise.
_parent_reads = None


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad flag prints one line (no usage block) and exits with code 2.

    Every entry point's parser (``cli.ArgumentParser`` is this class): it lives here, at the
    bottom of the package, so that any module can build one without an import cycle."""

    def error(self, message):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


class CourseError(Exception):
    """A problem the learner can fix (bad flag, missing data, ...).

    The message is printed as a single ``error: ...`` line, never as a traceback, and
    should end with the fix (a command to run or a flag to change).
    """


def is_out_of_memory(error):
    return type(error).__name__ == "OutOfMemoryError"  # torch.OutOfMemoryError (CUDA)


def one_line(error):
    """``(exit code, the line to print)`` for an error that is the learner's to fix;
    None for any other (a bug: it gets its traceback)."""
    if isinstance(error, CourseError):
        return 2, f"error: {error}"
    if is_out_of_memory(error):
        return 3, (f"error: the GPU ran out of memory ({str(error).splitlines()[0][:100]}); "
                   f"lower --batch-size (it is per process), or use a smaller --model")
    return None


def exit_cleanly_on_course_error(main):
    """Decorate a script's ``main`` so a CourseError becomes one stderr line and exit code 2
    (a GPU out of memory: one line and exit code 3)."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except Exception as error:
            short = one_line(error)
            if short is None:
                raise
            print(short[1], file=sys.stderr, flush=True)
            sys.exit(short[0])

    return wrapper


def write_error_file(error):
    """Write ``error`` where torchrun reads a failed worker's error, if it gave a place.

    torchrun (``torch.distributed.elastic``) reads each failed worker's error file
    (``TORCHELASTIC_ERROR_FILE``) to name the root cause. Its own ``@record`` decorator
    writes that file in place; when torchrun stops the other ranks after a failure, it
    can catch one mid-write, then reads an empty file and crashes itself, and the job
    is not restarted (seen here in 1 of 20 kill-and-restart runs). Writing to a
    temporary file and renaming it means torchrun sees no file or a complete one.
    """
    path = os.environ.get(ERROR_FILE)
    if not path:
        return
    report = {"message": {"message": f"{type(error).__name__}: {error}",
                          "extraInfo": {"py_callstack": "".join(
                              traceback.format_exception(error)),
                              "timestamp": str(int(time.time()))}}}
    with files.atomic(path, "w") as f:
        json.dump(report, f)


def record_errors(main):
    """Decorate a script's ``main`` so that a crash's error goes to torchrun's error file."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except Exception as error:
            write_error_file(error)
            raise

    return wrapper


def report_to_parent(path):
    """From now on, ``report`` writes this process's error to ``path`` (for the parent that
    spawned it to raise) instead of printing it."""
    global _parent_reads
    _parent_reads = path


def exit_code(error):
    """The exit status a process that ends with ``error`` should have (see ``report``)."""
    if isinstance(error, SystemExit):
        return error.code if isinstance(error.code, int) else 0 if error.code is None else 1
    short = one_line(error)
    if short is not None:
        return short[0]
    return 130 if isinstance(error, KeyboardInterrupt) else 1


def report(error):
    """Say what ended this process, as the two decorators and Python would; return the exit
    code. A SystemExit: its own code (its message, if it has one). A CourseError or an
    out-of-memory: its one line (2, 3). Ctrl-C: the traceback, 130 (128 + SIGINT, as a
    shell reports it). Anything else: torchrun's error file and the traceback, 1. In a
    worker whose parent reads its error (``report_to_parent``), the error goes to that
    file instead of the output."""
    if isinstance(error, SystemExit):
        if exit_code(error) and not isinstance(error.code, int):
            print(error.code, file=sys.stderr)
        return exit_code(error)
    if _parent_reads is not None:
        told = {"type": type(error).__name__, "message": str(error),
                "traceback": "".join(traceback.format_exception(error))}
        with files.atomic(_parent_reads, "w") as f:
            json.dump(told, f)
        return exit_code(error)
    short = one_line(error)
    if short is not None:
        print(short[1], file=sys.stderr)
        return short[0]
    if isinstance(error, Exception):
        write_error_file(error)
    # Through sys.excepthook, as Python prints an uncaught error: in a process group torch
    # installs a hook that tags every line "[rankN]: " (init_process_group), by which the
    # course's launcher keeps a crashed rank's frames in its log folder, out of the stream.
    sys.excepthook(type(error), error, error.__traceback__)
    return exit_code(error)
