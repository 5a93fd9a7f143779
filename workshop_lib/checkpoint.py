"""Checkpoints written atomically, so a crash mid-write never destroys the last good one."""
from pathlib import Path

import torch

from workshop_lib import files
from workshop_lib.errors import CourseError


def save_atomic(state, path):
    """``torch.save`` to ``path`` through ``files.atomic``: a reader (or a restarted job)
    sees either the old checkpoint or the complete new one, never a half-written file."""
    with files.atomic(path) as f:
        torch.save(state, f)


def load(path, map_location="cpu"):
    return torch.load(path, map_location=map_location, weights_only=True)


def training_state(model, optimizer, scheduler, epoch, job=None, precision=None):
    """Everything needed to resume: ``model`` must be the plain (unwrapped) model.

    The data order needs no state of its own: each epoch's shuffle is seeded by
    (seed, epoch), so knowing the epoch restores the sampler position. ``job`` names the
    torchrun job that wrote it (``distributed.job_id``), so that an elastic restart
    resumes from its own job's checkpoint and never from one an earlier run left behind.
    The CUDA random state saved is this process's GPU's only: a job resumed on another
    number of GPUs restores it on each process's own GPU.
    """
    device = next(model.parameters()).device
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(), "epoch": epoch, "job": job,
            "scaler": precision.state_dict() if precision else None,
            "rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


def from_job(path, job, say=True):
    """Whether ``path`` is a checkpoint written by ``job``; if one is there but another
    job's, say so in one line (when ``say``) and answer False: it is not ours to load."""
    if not Path(path).is_file():
        return False
    written_by = load(path).get("job")
    if written_by == job:
        return True
    if say:
        print(f"not resuming from {path}: it was written by another run (job "
              f"{written_by}), not this one ({job}); training from the start", flush=True)
    return False


def resume(path, model, optimizer, scheduler, precision=None):
    """Restore a ``training_state`` checkpoint into live objects; return the epoch it ended."""
    if not Path(path).is_file():
        raise CourseError(f"no checkpoint at {path} to resume from; run without --resume, "
                          f"or pass the --out folder of the run to continue")
    state = load(path)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    if precision is not None:
        precision.load_state_dict(state.get("scaler"))
    torch.set_rng_state(state["rng"])
    device = next(model.parameters()).device
    if state.get("cuda_rng") is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda_rng"], device)
    return state["epoch"]


def largest_difference(path, other):
    """How far apart two ``training_state`` checkpoints are: ``{"model": ..., "optimizer":
    ...}``, each the largest absolute difference over their tensors (0.0: bit for bit), and
    both epochs. Notebook 04 compares a resumed job with the uninterrupted one."""
    first, second = load(path), load(other)

    def tensors(state):
        if isinstance(state, torch.Tensor):
            yield state
        elif isinstance(state, dict):
            for key in sorted(state, key=str):
                yield from tensors(state[key])
        elif isinstance(state, list | tuple):
            for item in state:
                yield from tensors(item)

    def gap(a, b):
        pairs = list(zip(tensors(a), tensors(b), strict=True))
        return max(((x.double() - y.double()).abs().max().item() if x.numel() else 0.0)
                   for x, y in pairs) if pairs else 0.0

    return {part: gap(first[part], second[part]) for part in ("model", "optimizer")} | {
        "epochs": [first["epoch"], second["epoch"]]}
