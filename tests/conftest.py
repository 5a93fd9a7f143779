"""Shared helpers: run a function in several real gloo ranks, run the course's commands."""
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from workshop_lib import hardware
from workshop_lib.distributed import free_port  # noqa: F401  (the tests import it from here)

REPO = Path(__file__).resolve().parent.parent

# Every verdict a test's notebook or check gives is recorded (workshop_lib.progress): into a
# file of this session's, never into the home of whoever runs the suite, and sent nowhere.
PROGRESS_DIR = tempfile.mkdtemp(prefix="ddp-workshop-progress-")
atexit.register(shutil.rmtree, PROGRESS_DIR, ignore_errors=True)
os.environ["DDP_WORKSHOP_PROGRESS"] = os.path.join(PROGRESS_DIR, "progress.jsonl")
os.environ.pop("CLASS_PROGRESS_URL", None)


NOTEBOOK_SECONDS = []  # (notebook, run, seconds) of every execute_notebook in this session
# Under ``pytest -n N`` N test processes share the cores: a notebook's one-device runs take
# their share of them (hardware.SHARERS_ENV), not every core while the other test process
# computes too (measured on 2 busy cores: a batch-32 epoch 16% less CPU on one thread than
# on two). A launched job's ranks, which take theirs by torchrun's local world size, take
# it by this count instead: the same share for the CPU profile's 2 ranks under ``-n 2``.
TEST_PROCESSES = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))


def pytest_terminal_summary(terminalreporter):
    """Each notebook execution's time against its budget (tests/budgets.py)."""
    from budgets import NOTEBOOK_BUDGET_S, RUNS

    if not NOTEBOOK_SECONDS:
        return
    terminalreporter.section("notebook time budgets (tests/budgets.py)")
    for name, run, seconds in NOTEBOOK_SECONDS:
        budget = NOTEBOOK_BUDGET_S.get(name, (0, 0))[run]
        over = "  OVER its budget" if seconds > budget else ""
        terminalreporter.write_line(f"{name:32} {RUNS[run]:24} {seconds:6.0f} s of "
                                    f"{budget:4d} s{over}")


def pytest_sessionfinish(session):
    """A worker of ``pytest -n`` hands its notebooks' times to the controller, which prints
    them (``pytest_testnodedown``)."""
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["notebook_seconds"] = json.dumps(NOTEBOOK_SECONDS)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    NOTEBOOK_SECONDS.extend(map(tuple, json.loads(
        getattr(node, "workeroutput", {}).get("notebook_seconds", "[]"))))


# ``make test`` runs the suite in two processes (pytest-xdist): a test file's tests go to one
# process, with its module fixtures, and so do the files that share a session fixture or a
# cluster (SHARED). What one process waits for (a hub, a timeout, a hang) the other computes
# through. The groups go out slowest first (FIRST, from the suite's slowest set-ups), so that
# no long one is left for the end.
SHARED = {  # 08 reads the session's fixture ddp_run and the challenge's verdict 03 recorded
    "test_training": "ddp_run", "test_reliability": "ddp_run", "test_notebook_08": "ddp_run",
    "test_notebook_03": "ddp_run",
    "test_notebook_02": "notebook_02", "test_bench": "notebook_02",
    "test_classroom": "slurm", "test_deploy": "slurm",  # each starts a SLURM cluster as root
}
FIRST = ("test_assessment", "slurm", "ddp_run", "test_notebooks_one_process", "notebook_02",
         "test_notebook_04", "test_notebook_01", "test_notebook_06", "test_gpu_check",
         "test_notebook_05", "test_notebook_07")


def group_of(nodeid):
    stem = Path(nodeid.split("::")[0]).stem
    return SHARED.get(stem, stem)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """Each group to one process, slowest first (pytest-xdist's own groups key on test ids,
    which pytest 9 no longer lets a plugin change)."""
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return group_of(nodeid)

    config.option.loadscopereorder = False  # the collection's order: FIRST first
    return ByGroup(config, log)


def pytest_collection_modifyitems(config, items):
    """Skip ``@pytest.mark.gpu(n)`` tests where PyTorch sees fewer than n GPUs, and
    ``@pytest.mark.whole_class`` under CI, saying so; the slowest groups first under
    ``pytest -n``."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    # A worker of ``pytest -n`` collects what the controller schedules (its numprocesses is
    # None there): the order is set in the workers.
    if hasattr(config, "workerinput"):
        order = {name: i for i, name in enumerate(FIRST)}
        items.sort(key=lambda item: order.get(group_of(item.nodeid), len(FIRST)))  # stable
    for item in items:
        if item.get_closest_marker("whole_class") and os.environ.get("CI"):
            item.add_marker(pytest.mark.skip(
                reason="CI leaves out grading a whole class (about 9 min on 2 cores, "
                       "BENCHMARKS.md); `make test` runs it, `make test-class` alone"))
        marker = item.get_closest_marker("gpu")
        needed = marker.args[0] if marker and marker.args else 1
        if marker and gpus < needed:
            item.add_marker(pytest.mark.skip(
                reason=f"needs {needed} GPU(s) that PyTorch can use; this machine has {gpus} "
                       f"(`make gpu-check` runs these on a GPU workstation)"))


def _rank_main(rank, fn, world_size, rendezvous, result_dir, args):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=60))
    try:
        torch.save(fn(rank, world_size, *args), Path(result_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


# The ranks of run_in_ranks start from a fork server: one process per test process, which
# imports these once and computes nothing. A spawned rank imported them itself, about 2.6
# CPU-s of its 4.6 (torch 1.6, and torch._dynamo 1.0, which DDP's constructor imports).
RANK_PRELOAD = ["torch", "torch.distributed", "torch._dynamo"]
mp.set_forkserver_preload(RANK_PRELOAD)


def run_in_ranks(fn, world_size, tmp_path, *args):
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh processes joined in a
    gloo process group; return each rank's result. ``fn`` must live at module level.

    Processes come from the fork server (RANK_PRELOAD), not forked from this process:
    forking a parent whose OpenMP pool is running can deadlock the child, and the server
    has run nothing. They see the environment the server started with, not later changes.
    They meet through a file, not a port: a free port chosen here can be taken by another
    test's job in the seconds the ranks take to start (it was, once, under ``pytest -n
    2``: EADDRINUSE).
    """
    handle, rendezvous = tempfile.mkstemp(prefix="rendezvous-", dir=tmp_path)  # empty
    os.close(handle)
    mp.start_processes(_rank_main, args=(fn, world_size, rendezvous, str(tmp_path), args),
                       nprocs=world_size, start_method="forkserver", join=True)
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world_size)]


def run_course_command(args, timeout=600, env=None, cwd=REPO):
    """Run a course command (``python -m ...`` or ``torchrun ...``) from the virtual env."""
    bin_dir = Path(sys.executable).parent
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    command = [str(bin_dir / args[0]), *args[1:]] if args[0] == "torchrun" else [
        sys.executable, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          env=full_env, cwd=cwd)


@pytest.fixture
def digits():
    from workshop_lib import data

    return data.load("digits")


def execute_notebook(name, runs_dir, timeout_per_cell=900, record=None, **parameters):
    """Execute ``notebooks/<name>`` with papermill in the CPU profile on the offline dataset,
    with the exercises' reference solutions, as CI does (on any machine: a GPU
    workstation's tests pin the CPU profile too).

    Runs write under ``runs_dir`` (passed as the ``runs_dir`` parameter), so the test can
    assert on the run records of this very execution. Returns the executed notebook. The
    kernel talks over Unix sockets (tests/notebook_kernels.py): no port to lose to a
    gloo job.

    Its checks record their verdicts in ``record`` (a learner's record file the test made),
    or else in a record of the execution's own, added to the session's afterwards: its
    progress line shows no other execution's verdicts, whichever ran before it.
    """
    from notebook_kernels import execute

    output = Path(runs_dir) / f"executed-{name}"
    started = time.perf_counter()
    session_record = os.environ["DDP_WORKSHOP_PROGRESS"]
    own = Path(record or progress_record(runs_dir))
    os.environ["DDP_WORKSHOP_PROGRESS"] = str(own)  # the kernel's, and its checks'
    sharers = os.environ.get(hardware.SHARERS_ENV)
    if TEST_PROCESSES > 1:
        os.environ[hardware.SHARERS_ENV] = str(TEST_PROCESSES)
    try:
        execute(REPO / "notebooks" / name, output,
                {"profile": "cpu", "dataset": "digits", "runs_dir": str(runs_dir),
                 "solutions": True, **parameters},
                cwd=notebook_workspace(runs_dir), execution_timeout=timeout_per_cell)
    finally:
        os.environ["DDP_WORKSHOP_PROGRESS"] = session_record
        if sharers is None:  # as it was: unset, or the value whoever ran the tests gave it
            os.environ.pop(hardware.SHARERS_ENV, None)
        else:
            os.environ[hardware.SHARERS_ENV] = sharers
        if record is None and own.exists():  # later tests read this session's verdicts
            with open(session_record, "a") as session:
                session.write(own.read_text())
    return _executed(name, output, time.perf_counter() - started, parameters)


def notebook_workspace(runs_dir, folder=REPO / "notebooks"):
    """The folder an execution of a notebook of ``folder`` runs in: its own, beside
    ``runs_dir``, laid out as a learner's workspace (jupyter/learner/make_workspace.py):
    ``notebooks/``, with ``deploy/`` beside it (notebook 06 reads the repository's cluster
    files there). What the notebook writes next to itself (my_train_ddp.py, debug_job.py,
    ...) stays its own: the stubs' execution and the references', in two test processes at
    once, wrote over each other's scripts in the repository's notebooks/ (under
    ``pytest -n 3`` notebook 02's conversion check ran the other's file)."""
    if Path(folder) != REPO / "notebooks":
        return Path(folder)  # a test's own notebooks, in its own folder
    workspace = Path(runs_dir).with_name(f"{Path(runs_dir).name}-workspace")
    (workspace / "notebooks").mkdir(parents=True, exist_ok=True)
    if not (workspace / "deploy").exists():
        (workspace / "deploy").symlink_to(REPO / "deploy")
    return workspace / "notebooks"


def progress_record(runs_dir):
    """Where an executed notebook's checks record their verdicts: beside its runs, its own,
    as a learner's own record would be, so that its progress line shows no other
    execution's verdicts (the one-process run's NOT YETs, whatever ran before)."""
    return str(Path(runs_dir).with_name(f"{Path(runs_dir).name}-progress.jsonl"))


def _executed(name, output, seconds, parameters):
    """The executed notebook at ``output``, its time recorded for the budget table."""
    import nbformat

    run = 1 if parameters.get("nproc") == 1 and parameters.get("solutions") is False else 0
    NOTEBOOK_SECONDS.append((Path(name).stem, run, seconds))
    notebook = nbformat.read(output, as_version=4)
    errors = stderr_outputs(notebook)
    assert not errors, f"{name} wrote to stderr (a red band in JupyterLab): {errors[:3]}"
    return notebook


def execute_notebooks_side_by_side(runs, side_by_side=2, timeout_per_cell=900,
                                   folder=REPO / "notebooks"):
    """``execute_notebook`` for each ``(name, runs_dir, parameters)`` of ``runs`` (the
    notebooks of ``folder``, each run from its ``notebook_workspace``), with
    ``side_by_side`` papermill processes at a time; ``{name: SideBySide}``, whose
    ``notebook()`` gives the executed notebook or raises that notebook's own failure, so a
    notebook that fails fails its own test and no other.

    For runs of one process each: two of them keep a 2-core machine busy where one alone
    leaves a core waiting while it starts Python, torch and torchrun. Every process a
    notebook starts is told it shares the machine (hardware.SHARERS_ENV), so each takes
    its share of the cores' threads. Each kernel talks over Unix sockets
    (tests/notebook_kernels.py): the gloo jobs of the notebook beside it open many
    ephemeral TCP ports, and one of them could take a port chosen for the kernel.
    """
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE",
           hardware.SHARERS_ENV: str(side_by_side * TEST_PROCESSES)}
    pending, running, executed = list(runs), [], {}

    def start(name, runs_dir, parameters):
        output = Path(runs_dir) / f"executed-{name}"
        # A learner of their own: the verdicts of the notebook's checks go to its own record,
        # and its progress line shows no other execution's.
        learner = {**env, "DDP_WORKSHOP_PROGRESS": progress_record(runs_dir)}
        values = {"profile": "cpu", "dataset": "digits", "runs_dir": str(runs_dir),
                  "solutions": True, **parameters}
        command = [sys.executable, str(REPO / "tests/notebook_kernels.py"),
                   str(Path(folder) / name), str(output),
                   "--cwd", str(notebook_workspace(runs_dir, folder)),
                   "--parameters", json.dumps(values), "--execution-timeout",
                   str(timeout_per_cell)]
        log = open(Path(runs_dir) / f"papermill-{name}.log", "w")  # noqa: SIM115
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=learner)
        return name, output, values, process, log, time.perf_counter()

    while pending or running:
        while pending and len(running) < side_by_side:
            running.append(start(*pending.pop(0)))
        time.sleep(0.5)
        for job in [job for job in running if job[3].poll() is not None]:
            running.remove(job)
            name, output, values, process, log, started = job
            log.close()
            if process.returncode != 0:
                tail = Path(log.name).read_text()[-3000:]
                executed[name] = SideBySide(name, failure=f"{name} failed to execute "
                                            f"(papermill {process.returncode}):\n{tail}")
                continue
            try:
                notebook = _executed(name, output, time.perf_counter() - started, values)
            except AssertionError as error:
                executed[name] = SideBySide(name, failure=str(error))
            else:
                executed[name] = SideBySide(name, executed=notebook)
    return executed


class SideBySide:
    """One notebook's outcome of ``execute_notebooks_side_by_side``."""

    def __init__(self, name, executed=None, failure=None):
        self.name, self.executed, self.failure = name, executed, failure

    def notebook(self):
        if self.failure is not None:
            raise AssertionError(self.failure)
        return self.executed


def stderr_outputs(notebook):
    """What a notebook's cells wrote to stderr: JupyterLab shows it as an error band, so a
    successful run writes none."""
    return [out.get("text", "")[:300] for cell in notebook.cells
            for out in cell.get("outputs", []) if out.get("name") == "stderr"]


def notebook_text_outputs(notebook):
    """All text a notebook's cells printed or displayed, joined."""
    parts = []
    for cell in notebook.cells:
        for out in cell.get("outputs", []):
            parts.append(out.get("text", ""))
            parts.append(out.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


# One uninterrupted 2-rank run, shared by the tests that check learning (test_training)
# and the one that compares a killed-and-resumed run with it (test_reliability).
DDP_RUN_EPOCHS = 5
DDP_RUN_FLAGS = ["--device", "cpu", "--dataset", "digits", "--epochs", str(DDP_RUN_EPOCHS),
                 "--batch-size", "32", "--no-progress"]


@pytest.fixture(scope="session")
def ddp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("train_ddp")
    result = run_course_command(["torchrun", "--standalone", "--nproc-per-node=2",
                                 "-m", "workshop_lib.train_ddp", *DDP_RUN_FLAGS,
                                 "--out", str(out)])
    assert result.returncode == 0, result.stdout + result.stderr
    return out, result


@pytest.fixture(scope="session")
def notebook_02(tmp_path_factory):
    """Notebook 02 executed once for the session: ``(runs folder, notebook, its text)``.
    tests/test_notebook_02.py asserts what it shows; tests/test_bench.py reads the
    benchmark it ran (bench.json, and the table it printed to bench.txt), which is the
    benchmark's CPU case that CI needs anyway."""
    runs = tmp_path_factory.mktemp("02")
    notebook = execute_notebook("02_from_one_gpu_to_many.ipynb", runs)
    return runs, notebook, notebook_text_outputs(notebook)
