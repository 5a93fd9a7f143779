"""Notebook kernels for the tests that cannot lose a port race.

jupyter_client picks a kernel's five TCP ports by binding port 0 and closing the sockets
before the kernel binds them; in between, another process may take one (a gloo job opens
many ephemeral ports), and the kernel dies with "Address already in use" ("Kernel died
before replying to kernel_info"). Over the ``ipc`` transport the five channels are Unix
sockets in a folder that only this kernel uses, so nothing else can take them. A Unix
socket's path must stay under 107 bytes: the folder is a short one under the temporary
directory (or /tmp where that is long), made private (0700) by ``mkdtemp``.

Run as a script, it is papermill's command line with this kernel manager (the side-by-side
runs of tests/conftest.py start one such process per notebook):

    python tests/notebook_kernels.py IN.ipynb OUT.ipynb --cwd DIR \\
        --parameters '{"profile": "cpu"}' --execution-timeout 900
"""
import argparse
import json
import os
import shutil
import sys
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


def execute(input_path, output_path, parameters, cwd, execution_timeout):
    """``papermill.execute_notebook`` in the python3 kernel, over ipc."""
    import papermill

    papermill.execute_notebook(
        str(input_path), str(output_path), parameters=parameters, kernel_name="python3",
        cwd=str(cwd), execution_timeout=execution_timeout, progress_bar=False,
        kernel_manager_class=IpcKernelManager)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python tests/notebook_kernels.py")
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("--cwd", required=True)
    parser.add_argument("--parameters", default="{}", type=json.loads)
    parser.add_argument("--execution-timeout", type=float, required=True)
    args = parser.parse_args(argv)
    execute(args.input, args.output, args.parameters, args.cwd, args.execution_timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
