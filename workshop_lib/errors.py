"""User-facing errors: one line that says what went wrong and what to do about it."""
import argparse
import functools
import json
import os
import sys
import time
import traceback

from workshop_lib import files


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


def exit_cleanly_on_course_error(main):
    """Decorate a script's ``main`` so a CourseError becomes one stderr line and exit code 2."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except CourseError as error:
            print(f"error: {error}", file=sys.stderr, flush=True)
            sys.exit(2)
        except Exception as error:
            if type(error).__name__ != "OutOfMemoryError":  # torch.OutOfMemoryError (CUDA)
                raise
            print(f"error: the GPU ran out of memory ({str(error).splitlines()[0][:100]}); "
                  f"lower --batch-size (it is per process), or use a smaller --model",
                  file=sys.stderr, flush=True)
            sys.exit(3)

    return wrapper


def record_errors(main):
    """Write a crashing rank's error where torchrun looks for it, atomically.

    torchrun (``torch.distributed.elastic``) reads each failed worker's error file
    (``TORCHELASTIC_ERROR_FILE``) to name the root cause. Its own ``@record`` decorator
    writes that file in place; when torchrun stops the other ranks after a failure, it
    can catch one mid-write, then reads an empty file and crashes itself, and the job
    is not restarted (seen here in 1 of 20 kill-and-restart runs). Writing to a
    temporary file and renaming it means torchrun sees no file or a complete one.
    """

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except Exception as error:
            path = os.environ.get("TORCHELASTIC_ERROR_FILE")
            if path:
                report = {"message": {"message": f"{type(error).__name__}: {error}",
                                      "extraInfo": {"py_callstack": traceback.format_exc(),
                                                    "timestamp": str(int(time.time()))}}}
                with files.atomic(path, "w") as f:
                    json.dump(report, f)
            raise

    return wrapper
