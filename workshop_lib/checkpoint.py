"""Checkpoints written atomically, so a crash mid-write never destroys the last good one."""
import os
import tempfile
from pathlib import Path

import torch


def save_atomic(state, path):
    """``torch.save`` to a temporary file beside ``path``, flush it to disk, then rename.

    ``os.replace`` is atomic on POSIX: a reader (or a restarted job) sees either the old
    checkpoint or the complete new one, never a half-written file.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load(path, map_location="cpu"):
    return torch.load(path, map_location=map_location, weights_only=True)


def training_state(model, optimizer, scheduler, epoch):
    """Everything needed to resume: ``model`` must be the plain (unwrapped) model."""
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(), "epoch": epoch}
