"""User-facing errors: one line that says what went wrong and what to do about it."""
import functools
import sys


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
