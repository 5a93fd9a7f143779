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

    return wrapper
