"""A rank that fails leaves its process group by abort, never by a collective shutdown.

With NCCL, ``destroy_process_group()`` on a failing rank waits for the other ranks, which
wait in a collective for the failing one: the job hangs until the collective timeout.
Gloo does not show this, so these tests pin the error path itself, in this process, on
a one-rank gloo group: every entry point that joins a group aborts it when its work
raises, and destroys it (the collective, clean shutdown) only when the work finished.
"""
import pytest
import torch
import torch.distributed as dist

import workshop_lib.bench.__main__ as bench_command
from conftest import free_port
from workshop_lib import distributed, equivalence, train_ddp
from workshop_lib.bench import measure, plan, workers


@pytest.fixture
def one_rank(monkeypatch):
    """torchrun's environment for a one-process job, and a record of how it left."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    left = []
    destroy, abort = dist.destroy_process_group, distributed.abort
    monkeypatch.setattr(dist, "destroy_process_group",
                        lambda *a, **k: (left.append("destroy"), destroy(*a, **k)))
    monkeypatch.setattr(distributed, "abort", lambda: (left.append("abort"), abort()))
    yield left
    assert not dist.is_initialized(), "the process group was left behind"


def fails(*args, **kwargs):
    raise RuntimeError("a bug on this rank")


def test_train_ddp_aborts_on_error(one_rank, monkeypatch, tmp_path):
    monkeypatch.setattr(train_ddp, "fit", fails)
    with pytest.raises(RuntimeError, match="a bug on this rank"):
        train_ddp.main(["--device", "cpu", "--out", str(tmp_path)])
    assert one_rank == ["abort"]


def test_train_ddp_leaves_together_when_it_finished(one_rank, monkeypatch, tmp_path):
    monkeypatch.setattr(train_ddp, "fit", lambda *args: None)
    train_ddp.main(["--device", "cpu", "--out", str(tmp_path)])
    assert one_rank == ["destroy"]


def test_the_batchnorm_comparison_aborts_on_error(one_rank, monkeypatch):
    monkeypatch.setattr(equivalence, "measure", fails)
    with pytest.raises(RuntimeError, match="a bug on this rank"):
        equivalence.main(["--device", "cpu"])
    assert one_rank == ["abort"]


def test_the_shared_helper_aborts_on_error_and_destroys_on_success(one_rank):
    with pytest.raises(KeyboardInterrupt), distributed.process_group("gloo"):
        raise KeyboardInterrupt  # Ctrl-C in a notebook is an error path too
    with distributed.process_group("gloo"):
        pass
    assert one_rank == ["abort", "destroy"]


def test_bench_worker_aborts_on_error(one_rank, monkeypatch, tmp_path):
    """A bench worker whose measurement raises aborts the group, and rank 0 writes nothing."""
    bench_plan = plan.make_plan(bench_command.parse_args(["--quick", "--nproc", "1"]),
                                torch.device("cpu"))
    monkeypatch.setattr(measure, "collective", fails)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # keep pytest's threads
    raw = tmp_path / "raw.json"
    with pytest.raises(RuntimeError, match="a bug on this rank"):
        workers.worker(0, bench_plan, free_port(), str(raw))
    assert one_rank == ["abort"]
    assert not raw.exists()


# A finished collective whose tensor's last reference is gloo's worker thread, dropped
# slowly (a tensor subclass whose __del__ takes 0.3 s): the main thread reaches Python's
# shutdown while the worker still holds the tensor, as happens by chance at the end of a
# training job on a loaded machine.
LATE_TENSOR_JOB = """
import sys, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
if sys.argv[1] == "guarded":
    import workshop_lib  # registers gloo_exit.wait_for_gloo_workers
import threading
class Slow(torch.Tensor):
    def __del__(self):
        worker = threading.current_thread() is not threading.main_thread()
        print("dropped by", "gloo's worker" if worker else "the main thread", file=sys.stderr,
              flush=True)
        end = time.perf_counter() + 0.3
        while time.perf_counter() < end:
            pass
dist.init_process_group("gloo")
model = DDP(torch.nn.Linear(4, 2))  # after DDP, the workers outlive the group
t = torch.Tensor._make_subclass(Slow, torch.ones(10))
work = dist.all_reduce(t, async_op=True)
del t, work  # the worker now holds the last reference
time.sleep(0.1)
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["unguarded", "guarded"])
def test_a_tensor_dropped_by_gloo_during_shutdown_aborts_unless_the_exit_guard_waits(
        mode, monkeypatch):
    """PyTorch issue 190489, reproduced: without ``gloo_exit.wait_for_gloo_workers`` the
    process aborts (SIGABRT, "terminate called without an active exception") after its
    work is done; with it (registered by ``import workshop_lib``), it exits cleanly."""
    import signal
    import subprocess
    import sys
    # Which thread drops the tensor is a race (the worker may let go before the main thread's
    # `del`): retry until the worker did, the case this test is about.
    for _ in range(5):
        env = {**__import__("os").environ, "RANK": "0", "WORLD_SIZE": "1",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        result = subprocess.run([sys.executable, "-c", LATE_TENSOR_JOB, mode], env=env,
                                capture_output=True, text=True, timeout=120)
        if "dropped by gloo's worker" in result.stderr:
            break
    assert "dropped by gloo's worker" in result.stderr, result.stderr[-2000:]
    if mode == "unguarded":
        assert result.returncode == -signal.SIGABRT, (
            "PyTorch no longer aborts here: the exit guard may be removable", result.stderr)
        assert "terminate called without an active exception" in result.stderr
    else:
        assert result.returncode == 0, result.stderr[-2000:]
