"""Joining and leaving a process group, the same way in every multi-process entry point.

Leaving is where jobs hang. ``dist.destroy_process_group()`` is a collective shutdown: with
NCCL it destroys the communicators, which waits for the other ranks (NCCL's
``ncclCommDestroy`` is collective within a node). On the error path the other ranks are
stuck inside a collective, waiting for the rank that failed, so a failing rank that
destroys its group waits for them, never exits, and torchrun never learns of the error:
the job sits until the collective timeout, and a healthy rank is blamed. So:

- when the work finished on every rank, ``destroy_process_group()``;
- when it raised, ``abort()`` the group (which tears the connections down at once: the
  other ranks' collectives fail, torchrun sees the failed rank and stops the job) and
  let the error end the process.

``train_ddp.py`` spells this out, for the lesson; the other entry points (the bench, the
trace, the BatchNorm comparison, the from-scratch wrapper's check) use ``process_group``.
"""
import os
import socket
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist


def abort():
    """Tear down every process group without waiting for the other ranks."""
    if dist.is_available() and dist.is_initialized():
        dist.distributed_c10d._abort_process_group()


@contextmanager
def process_group(backend, timeout_s=300, device=None, **init_kwargs):
    """``init_process_group``; on leaving, destroy it (success) or abort it (an error)."""
    if device is not None and device.type == "cuda":
        # This rank's GPU becomes its current device: object collectives (all_gather_object,
        # ...) put their objects there, and device_id below does not set it; without this
        # every rank would send from cuda:0.
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s),
                            device_id=device if device is not None and device.type == "cuda"
                            else None, **init_kwargs)
    try:
        yield
    except BaseException:
        abort()
        raise
    dist.destroy_process_group()


def free_port(host="127.0.0.1"):
    """A TCP port nothing listens on now (for a rendezvous on this machine)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def job_id():
    """What names this torchrun job: the same in every restart of the job, different for
    the next job. torchrun's run id (``--rdzv-id``; a fresh one per ``--standalone`` job);
    without one, this machine's torchrun agent (the parent process) and its start time."""
    run = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    if run != "none":
        return run
    agent = os.getppid()
    try:
        started = Path(f"/proc/{agent}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        started = "?"
    return f"{socket.gethostname()}:{agent}:{started}"
