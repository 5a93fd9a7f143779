"""Notebook kernels that talk over private Unix sockets instead of TCP ports.

A kernel's five channels are TCP ports on 127.0.0.1 by default, and two things go wrong
with them on a machine the course shares. jupyter_client picks the ports by binding port 0
and closing the sockets before the kernel binds them; in between another process may take
one (a gloo job opens many ephemeral ports), and the kernel dies with "Address already in
use". And any local account may connect to them: IOPub needs no key to read, so another
user hears every cell the kernel runs and what it prints (the grader's hidden tests among
them, while a submission is autograded). Over the ``ipc`` transport the channels are Unix
sockets in a folder only this kernel's user may enter (0700, from ``mkdtemp``), removed
with the kernel. A Unix socket's path must stay under 107 bytes, so the folder is a short
one under the temporary directory, or /tmp where that is long.

The tests run notebooks with it (tests/notebook_kernels.py), so does the GPU check
(gpu_check/run_notebook.py), and the assessment's autograde runs each submission's kernel
with it (assessment/autograde_guard.py).
"""
import os
import shutil
import tempfile

from jupyter_client.manager import AsyncKernelManager

SOCKET_PATH_MAX = 107  # bytes of a Unix socket's path, its terminating NUL excluded
# The longest socket name inside the folder: "kernel-ipc-" and a channel number.
LONGEST_SOCKET_NAME = len("kernel-ipc-99999")


def private_runtime_dir():
    """A new folder, 0700, short enough for the kernel's socket paths."""
    base = tempfile.gettempdir()
    folder = tempfile.mkdtemp(prefix="k", dir=base)
    if len(os.fsencode(folder)) + 1 + LONGEST_SOCKET_NAME > SOCKET_PATH_MAX:
        os.rmdir(folder)
        folder = tempfile.mkdtemp(prefix="k", dir="/tmp")
    return folder


class IpcKernelManager(AsyncKernelManager):
    """A kernel whose channels are Unix sockets in a private folder, removed with it."""

    def __init__(self, **kwargs):
        self.runtime_dir = private_runtime_dir()
        kwargs.setdefault("transport", "ipc")
        kwargs.setdefault("connection_file", os.path.join(self.runtime_dir, "kernel.json"))
        super().__init__(**kwargs)

    async def _async_cleanup_resources(self, restart=False):
        await super()._async_cleanup_resources(restart=restart)
        if not restart:
            shutil.rmtree(self.runtime_dir, ignore_errors=True)

    # AsyncKernelManager binds cleanup_resources to the base class's function: rebind it.
    cleanup_resources = _async_cleanup_resources
