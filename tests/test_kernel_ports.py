"""The tests' notebook kernels cannot lose a port race (tests/notebook_kernels.py).

Over TCP, jupyter_client chooses a kernel's ports free, closes them, and the kernel binds
them later; a gloo job beside it, which opens many ephemeral ports, can take one first,
and the kernel dies ("Kernel died before replying to kernel_info"). Over ipc its channels
are Unix sockets in a private folder. Here: the race made certain over TCP, the same
attack harmless over ipc, many kernels started side by side next to a real gloo job, and
a failure in one side-by-side notebook that fails its own test only.
"""
import asyncio
import itertools
import os
import socket
import stat
import time
from datetime import timedelta
from pathlib import Path

import nbformat
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from jupyter_client.connect import LocalPortCache
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

import conftest
from conftest import execute_notebooks_side_by_side, notebook_text_outputs
from workshop_lib.distributed import free_port
from workshop_lib.kernels import SOCKET_PATH_MAX, IpcKernelManager

pytestmark = pytest.mark.slow  # starts dozens of kernels and a gloo job

KERNELS, AT_ONCE = 40, 4
STARTUP_TIMEOUT_S = 300  # a loaded 2-core machine: generous, this test is about ports


def gloo_churn(rank, world_size, port, folder):
    """A gloo job that keeps opening ephemeral ports: a new gloo group (its own listening
    socket and connections) for every all_reduce, until ``folder/stop`` exists. Rank 0
    keeps the number of groups made so far in ``folder/groups``."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=120))
    try:
        for groups in itertools.count():
            if rank == 0:  # whole or not at all: the test reads it while the job runs
                (Path(folder) / "groups.new").write_text(str(groups))
                os.replace(Path(folder) / "groups.new", Path(folder) / "groups")
            stop = torch.tensor([float(rank == 0 and (Path(folder) / "stop").exists())])
            dist.all_reduce(stop)  # every rank leaves after the same round
            if stop.item():
                break
            group = dist.new_group(list(range(world_size)))
            dist.all_reduce(torch.ones(8), group=group)
            dist.destroy_process_group(group)
    finally:
        dist.destroy_process_group()


@pytest.fixture
def gloo_groups(tmp_path):
    """A two-rank gloo job churning ports for the test's duration; yields a function that
    says how many groups it has made so far."""
    job = mp.start_processes(gloo_churn, args=(2, free_port(), str(tmp_path)), nprocs=2,
                             start_method="spawn", join=False)
    made = tmp_path / "groups"

    def groups():
        return int(made.read_text() or 0) if made.exists() else 0

    yield groups
    (tmp_path / "stop").touch()
    while not job.join(timeout=300):
        pass


def one_cell_notebook(source):
    notebook = nbformat.v4.new_notebook()
    notebook.cells.append(nbformat.v4.new_code_cell(source))
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                       "language": "python"}
    return notebook


async def run_kernels(count, at_once):
    """``count`` one-cell notebooks, ``at_once`` kernels at a time; their outputs."""
    outputs = []
    for first in range(0, count, at_once):
        clients = [NotebookClient(one_cell_notebook("import os; print(os.getpid())"),
                                  kernel_name="python3", kernel_manager_class=IpcKernelManager,
                                  startup_timeout=STARTUP_TIMEOUT_S, timeout=STARTUP_TIMEOUT_S)
                   for _ in range(first, min(first + at_once, count))]
        for notebook in await asyncio.gather(*(c.async_execute() for c in clients)):
            outputs.append([out.get("text", "").strip() for out in notebook.cells[0].outputs
                            if out.get("name") == "stdout"])
    return outputs


def test_many_kernels_side_by_side_beside_a_gloo_job_all_start(gloo_groups):
    while gloo_groups() < 10:  # the job churns before the first kernel starts
        time.sleep(1)
    before = gloo_groups()
    outputs = asyncio.run(run_kernels(KERNELS, AT_ONCE))
    during = gloo_groups() - before
    assert len(outputs) == KERNELS
    pids = {pid for printed in outputs for pid in printed if pid.isdigit()}
    assert len(pids) == KERNELS, outputs  # each of forty kernels ran its cell
    assert during > 0, "the gloo job made no groups while the kernels started"
    print(f"\n{KERNELS} kernels, {AT_ONCE} at a time, beside {during} new gloo groups")


def take_the_first_port_chosen(monkeypatch):
    """Another socket takes the first port jupyter_client chooses for a kernel, right after
    it is chosen and before the kernel binds it: the moment of the race, made certain.
    Returns the sockets that took a port."""
    takers = []
    choose = LocalPortCache.find_available_port

    def chosen_then_taken(self, ip):
        port = choose(self, ip)
        if not takers:
            taker = socket.socket()
            taker.bind((ip, port))
            taker.listen()
            takers.append(taker)
        return port

    monkeypatch.setattr(LocalPortCache, "find_available_port", chosen_then_taken)
    return takers


async def start_kernel(manager):
    """Start the kernel and wait until it answers; shut it down."""
    try:
        await manager.start_kernel()
        client = manager.client()
        client.start_channels()
        try:
            await client.wait_for_ready(timeout=STARTUP_TIMEOUT_S)
        finally:
            client.stop_channels()
    finally:
        if await manager.is_alive():
            await manager.shutdown_kernel(now=True)
        await manager.cleanup_resources()


def test_a_port_taken_before_the_kernel_binds_kills_a_tcp_kernel(monkeypatch):
    """The flake made certain: the probe that the race is real over TCP."""
    takers = take_the_first_port_chosen(monkeypatch)
    try:
        with pytest.raises(RuntimeError, match="Kernel died before replying to kernel_info"):
            asyncio.run(start_kernel(AsyncKernelManager(kernel_name="python3")))
    finally:
        for taker in takers:
            taker.close()
    assert len(takers) == 1


def test_an_ipc_kernel_has_no_port_to_take_and_its_sockets_are_private(monkeypatch):
    manager = IpcKernelManager(kernel_name="python3")
    folder = manager.runtime_dir
    assert manager.transport == "ipc"
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    manager.write_connection_file()
    sockets = [f"{manager.ip}-{port}" for port in manager.ports]
    assert all(path.startswith(folder + os.sep) for path in sockets), sockets
    assert all(len(os.fsencode(path)) < SOCKET_PATH_MAX for path in sockets), sockets
    asyncio.run(manager.cleanup_resources())
    assert not os.path.exists(folder)

    takers = take_the_first_port_chosen(monkeypatch)
    asyncio.run(start_kernel(IpcKernelManager(kernel_name="python3")))
    assert takers == [], "an ipc kernel chose a TCP port"


FAILS = 'raise ValueError("this notebook fails")'


def test_a_failing_notebook_beside_others_fails_its_own_test_only(tmp_path, monkeypatch):
    monkeypatch.setattr(conftest, "NOTEBOOK_SECONDS", [])  # not one of the course's budgets
    for name, source in {"fails.ipynb": FAILS, "works.ipynb": "print('ran')"}.items():
        nbformat.write(one_cell_notebook(source), tmp_path / name)
        (tmp_path / name[:-6]).mkdir()
    outcomes = execute_notebooks_side_by_side(
        [(name, tmp_path / name[:-6], {}) for name in ("fails.ipynb", "works.ipynb")],
        folder=tmp_path)
    with pytest.raises(AssertionError, match="(?s)fails.ipynb failed to execute.*"
                                             "this notebook fails"):
        outcomes["fails.ipynb"].notebook()
    works = outcomes["works.ipynb"].notebook()
    assert notebook_text_outputs(works).strip() == "ran"
