"""What the script writes and prints, as each rank records it: the files it writes, what
it saves with ``torch.save`` (a copy of the bytes: another rank may overwrite the file
itself), and the lines it prints on stdout and writes to stderr.

Four patchers, each installed by ``ddp_recorder.Recorder`` and returning the function that
undoes it: ``torch.save`` (by path, or through a file object: the file its descriptor
names), ``os.replace`` / ``os.rename`` (a file saved under a temporary name counts under
the name it is renamed to), ``open`` (files opened for writing), and ``sys.stdout`` /
``sys.stderr`` (``logging`` writes to stderr). The record's checkpoint check reads the
saves; the checks of requirement 5 read the writes and the printed lines.

Your copy of this file is replaced by the instructor's when your work is graded.
"""
import io
import os
import sys

# torch is imported inside the functions that use it (ddp_recorder.py says why).

KEPT_SAVES = 8  # the last torch.save calls to a file kept, for the checkpoint check


def _file_path(f):
    """The absolute path torch.save writes to, for a path or a file object (one opened by
    open(), os.fdopen() or tempfile: its descriptor names the file); None for an in-memory
    buffer."""
    if isinstance(f, (str, bytes, os.PathLike)):
        return os.path.abspath(os.fsdecode(f))
    try:
        target = os.readlink(f"/proc/self/fd/{f.fileno()}")
        if target.startswith("/"):
            return target
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        pass
    name = getattr(f, "name", None)
    return os.path.abspath(os.fsdecode(name)) if isinstance(name, (str, bytes)) else None


def patch_torch_save(recorder):
    """Files written by torch.save (it opens them in C++, past the open() recorded below),
    given a path or a file object, and a copy of everything saved to a file: another rank
    may overwrite the file itself, and a file saved under a temporary name counts under
    the name it is renamed to (patch_rename)."""
    import torch

    original = torch.save

    def save(obj, f, *args, **kwargs):
        path = _file_path(f) if recorder.recording else None
        result = original(obj, f, *args, **kwargs)
        if path is not None:
            recorder.writes.append(path)
            buffer = io.BytesIO()
            original(obj, buffer)
            recorder.saves = [*recorder.saves, [path, buffer.getvalue()]][-KEPT_SAVES:]
        return result

    torch.save = save
    return lambda: setattr(torch, "save", original)


def patch_rename(recorder):
    """Files renamed into place (os.replace and os.rename; pathlib, shutil.move and
    tempfile-based atomic writes go through them): the destination is written, and what
    torch.save wrote under the old name now lives under the new one."""
    originals = os.replace, os.rename

    def renamer(original):
        def rename(src, dst, *args, **kwargs):
            result = original(src, dst, *args, **kwargs)
            if recorder.recording and isinstance(src, (str, bytes, os.PathLike)) \
                    and isinstance(dst, (str, bytes, os.PathLike)):
                old, new = (os.path.abspath(os.fsdecode(p)) for p in (src, dst))
                recorder.writes = [new if path == old else path for path in recorder.writes]
                if new not in recorder.writes:
                    recorder.writes.append(new)
                for save in recorder.saves:
                    if save[0] == old:
                        save[0] = new
            return result
        return rename

    os.replace, os.rename = (renamer(original) for original in originals)

    def undo():
        os.replace, os.rename = originals

    return undo


def patch_open(recorder):
    """Files opened for writing."""
    import builtins

    original = builtins.open

    def recorded_open(file, mode="r", *args, **kwargs):
        if (recorder.recording and isinstance(file, (str, bytes, os.PathLike))
                and any(flag in mode for flag in "wax+")):
            path = os.path.abspath(os.fsdecode(file))
            if not path.startswith(("/dev/", "/proc/", "/sys/")):
                recorder.writes.append(path)
        return original(file, mode, *args, **kwargs)

    builtins.open = io.open = recorded_open

    def undo():
        builtins.open = io.open = original

    return undo


class _Tee:
    """A stream (sys.stdout, sys.stderr) that also keeps the lines written."""

    def __init__(self, stream, lines):
        self._stream, self._lines, self._partial = stream, lines, ""

    def write(self, text):
        self._stream.write(text)
        *complete, self._partial = (self._partial + text).split("\n")
        self._lines.extend(complete)
        return len(text)

    def flush(self):
        self._stream.flush()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def tee_output(recorder):
    """The lines the script prints on stdout and writes to stderr (``logging``'s handlers
    look sys.stderr up when they are made, after this, or when they write)."""
    originals = sys.stdout, sys.stderr
    sys.stdout = _Tee(originals[0], recorder.stdout)
    sys.stderr = _Tee(originals[1], recorder.stderr)

    def undo():
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = originals

    return undo
