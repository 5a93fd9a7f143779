"""Joining and leaving a process group, the same way in every multi-process entry point.

Leaving is where jobs hang. ``dist.destroy_process_group()`` is a collective shutdown: with
NCCL it destroys the communicators, which waits for the other ranks (NCCL's
``ncclCommDestroy`` is collective within a node). On the error path the other ranks are
stuck inside a collective, waiting for the rank that failed, so a failing rank that waits
for any teardown may never exit: not for a destroy, and not for an abort either
(``ncclCommAbort``'s proxy thread waits while peers keep their connections: NVIDIA/nccl
#1777, #863). torchrun then never learns of the error, the job sits until the collective
timeout (``--dist-timeout``), and a healthy rank is blamed. So:

- when the work finished on every rank, ``destroy_process_group()``;
- when it raised, ``exit_at_once``: report the error (torchrun's error file, the one line
  or the traceback, flushed) and end the process with ``os._exit``, tearing nothing down.

What ends the other ranks then depends on the backend. With gloo, the process's exit
closes its TCP connections, and the others' collectives raise ("Connection closed by
peer") and take the same path. With NCCL on one machine nothing tells them: they keep
waiting in the collective. torchrun's agent ends them: it polls its workers every
``--monitor-interval`` (0.1 s); once one has exited non-zero it sends the others SIGTERM
(SIGKILL to any still alive 30 s later), then restarts the group or fails the job
(torch 2.14's ``distributed/elastic/agent/server/api.py``, ``_invoke_run``, and
``elastic/multiprocessing/api.py``, ``SubprocessContext._poll``: "if ALL procs are
finished or ANY have failed", ``self.close()``). An agent stops only its own machine's
workers: with agents on several machines (notebook 06), the others' NCCL ranks keep
waiting until the collective timeout, unless a lost connection fails them first or, with
restarts left, the failing agent's return to the rendezvous makes their agents restart.
No abort is started on the way out: the exit closes every connection an abort would,
and waiting for one is what hangs.

``train_ddp.py`` spells this out, for the lesson; the other entry points (the bench, the
trace, the BatchNorm comparison, the from-scratch wrapper's check) use ``process_group``,
and those that start their ranks with ``torch.multiprocessing`` use ``spawn``.
"""
import json
import os
import socket
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from workshop_lib import errors

# What a rank's collective raises when a peer's process has gone (gloo's TCP pairs).
PEER_LEFT = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")
# torchrun names as the job's root cause the failure with the smallest error-file timestamp,
# in whole seconds, ties going to the lowest rank: a rank that failed only because a peer
# left waits this long before it reports, so that the peer that failed first is named.
PEER_LEFT_WAIT_S = 1.5


def exit_at_once(error):
    """Report ``error`` as the course's scripts do (``errors.report``), flush the output and
    end this process, without waiting for any teardown of its process group. Never returns.
    """
    code = 1
    if any(words in str(error) for words in PEER_LEFT):
        time.sleep(PEER_LEFT_WAIT_S)  # a bounded wait of its own, not a teardown's
    try:
        code = errors.report(error)
    except BaseException:  # reporting failed (a full disk, say): say so, and still end
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # a closed or broken stream must not keep the process alive
                pass
        os._exit(code)


@contextmanager
def process_group(backend, timeout_s=300, device=None, **init_kwargs):
    """``init_process_group``; on leaving, destroy it (success), or on an error end the
    process at once (``exit_at_once``)."""
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
    except BaseException as error:
        exit_at_once(error)
    dist.destroy_process_group()


def _spawned(rank, worker, folder, args):
    errors.report_to_parent(Path(folder) / f"rank{rank}.json")
    try:
        worker(rank, *args)
    except BaseException as error:
        exit_at_once(error)


def spawn(worker, nprocs, *args):
    """Run ``worker(rank, *args)`` in ``nprocs`` fresh processes (``torch.multiprocessing``,
    spawned, not forked: a fork of a process whose OpenMP pool is running can deadlock).

    A worker that fails ends at once (``exit_at_once``) and tells this process why, through
    a file instead of its output; its parent then stops the other workers, as torchrun
    would, and raises: a worker's CourseError as a CourseError (one line, as everywhere),
    anything else as ``ProcessRaisedException`` with the worker's traceback.
    """
    with tempfile.TemporaryDirectory() as folder:
        try:
            mp.start_processes(_spawned, args=(worker, folder, args), nprocs=nprocs,
                               start_method="spawn", join=True)
        except mp.ProcessExitedException as failure:
            path = Path(folder) / f"rank{failure.error_index}.json"
            if not path.exists():  # killed by a signal, say: nothing was reported
                raise
            told = json.loads(path.read_text())
            if told["type"] == "CourseError":
                raise errors.CourseError(told["message"]) from None
            raise mp.ProcessRaisedException(
                f"\n\n-- Process {failure.error_index} terminated with the following error:\n"
                f"{told['traceback']}", failure.error_index, failure.error_pid) from None


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
