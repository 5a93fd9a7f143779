"""Multi-process jobs fail loudly and fast, resume after a killed rank, and lose nothing.

Each failure is real: a rank raises or SIGKILLs itself (workshop_lib/faults.py, the
training script's documented --inject-fault flag), under a real torchrun launch. The
plain cases are notebook 04's own demos, asserted in tests/test_notebook_04.py: a rank
that raises, one that hangs until the collective timeout, one killed and resumed to the
uninterrupted job bit for bit. Here: what the notebook does not show.
"""
import io
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

from conftest import DDP_RUN_EPOCHS, DDP_RUN_FLAGS, free_port
from workshop_lib import checkpoint, data, faults, launch, runlog
from workshop_lib.errors import CourseError

BOUND_S = 60  # from the fault to the whole job's exit


def launch_ddp(out, *flags, max_restarts=0, timeout=300):
    stream = io.StringIO()
    result = launch.run(["-m", "workshop_lib.train_ddp", *DDP_RUN_FLAGS, "--out", str(out),
                         *flags], nproc=2, max_restarts=max_restarts, timeout=timeout,
                        stream=stream)
    return result, stream.getvalue()


# train_ddp with every process-group teardown made to never return, as NCCL's destroy or
# abort can when the other ranks wait in a collective (NVIDIA/nccl#1777, #863).
TEARDOWN_NEVER_RETURNS = """
import threading
import torch.distributed as dist
from torch.distributed import distributed_c10d

def never_returns(*args, **kwargs):
    threading.Event().wait()

for module in (dist, distributed_c10d):
    for name in ("destroy_process_group", "_abort_process_group"):
        setattr(module, name, never_returns)

from workshop_lib import train_ddp
train_ddp.main()
"""


@pytest.mark.slow
def test_a_raising_rank_ends_the_job_even_if_its_teardown_never_returns(tmp_path):
    """The failing rank must not wait for any teardown: its exit is what tells torchrun
    (and, with gloo, the other rank's collective) that it failed. Waiting, it would keep
    the other rank in its all-reduce until the 300 s collective timeout."""
    script = tmp_path / "teardown_never_returns.py"
    script.write_text(TEARDOWN_NEVER_RETURNS)
    stream = io.StringIO()
    result = launch.run([str(script), *DDP_RUN_FLAGS, "--out", str(tmp_path / "run"),
                         "--inject-fault", "raise@1:30"], nproc=2, timeout=150, stream=stream)
    assert result.failed_rank == 1, stream.getvalue()[-3000:]
    # From rank 1's error file, which it wrote before it ended:
    assert "InjectedFault: injected fault on rank 1 at step 30" in result.error, result.error


@pytest.mark.slow
def test_a_restart_never_resumes_from_another_jobs_checkpoint(tmp_path, ddp_run):
    reference_dir, _ = ddp_run
    # An earlier run's finished checkpoint sits in --out; this job dies in its epoch 1,
    # before writing one of its own. Its restart must train from the start.
    shutil.copy(reference_dir / "checkpoint.pt", tmp_path / "checkpoint.pt")
    train_set, _, _ = data.load("digits")
    step = faults.step_in_epoch(1, data.steps_per_epoch(len(train_set), 2, 32))
    result, shown = launch_ddp(tmp_path, "--inject-fault", f"kill@1:{step}", max_restarts=1)
    assert result.ok and result.attempts == 2, shown
    resumed = runlog.read(tmp_path)
    assert [r["start_epoch"] for r in resumed.resumes] == [], "the restart started afresh"
    assert resumed.start["start_epoch"] == 1 and resumed.column("epoch") == list(
        range(1, DDP_RUN_EPOCHS + 1))
    assert "not resuming from" in shown and "written by another run" in shown


@pytest.mark.slow
def test_sigkill_while_writing_a_checkpoint_keeps_the_previous_one(tmp_path):
    path = tmp_path / "checkpoint.pt"
    writer = subprocess.Popen([sys.executable, "-c", f"""
import torch
from workshop_lib import checkpoint
big = torch.zeros(25_000_000)
for version in range(1000):
    checkpoint.save_atomic({{"version": version, "weights": big}}, {str(path)!r})
    print(version, flush=True)
"""], stdout=subprocess.PIPE, text=True)
    assert writer.stdout.readline().strip() == "0"  # one complete checkpoint exists
    time.sleep(0.3)  # now it is in the middle of writing another 100 MB
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    state = checkpoint.load(path)
    assert state["weights"].shape == (25_000_000,) and state["version"] >= 0


def test_a_taken_port_is_one_clear_error():
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        with pytest.raises(CourseError, match=f"port {port} is already in use"):
            launch.run(["-m", "workshop_lib.train_ddp"], nproc=2, master_port=port)


def test_out_of_memory_is_one_line_with_the_fix(capsys, monkeypatch, tmp_path):
    from workshop_lib import train

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(train, "train_epoch", out_of_memory)
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--epochs", "1", "--out", str(tmp_path), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 3 and len(err) == 1
    assert "ran out of memory" in err[0] and "lower --batch-size" in err[0]
