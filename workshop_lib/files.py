"""Files that are written whole or not at all.

A process can die at any moment: a SIGKILL, a machine going down, torchrun stopping a
rank. A file written in place may then be left half-written, and the next reader (a
resumed job, torchrun reading a rank's error file) loads garbage or crashes. Written to a
temporary file beside the target, flushed to disk and renamed over it (``os.replace`` is
atomic on POSIX), a reader sees the old file or the complete new one, never a part.
"""
import contextlib
import os
import tempfile
from pathlib import Path


@contextlib.contextmanager
def atomic(path, mode="wb"):
    """A file object to write ``path`` through; it replaces ``path`` only once complete."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
