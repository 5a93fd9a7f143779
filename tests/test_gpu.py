"""The CUDA and NCCL paths, on GPUs. Skipped where PyTorch sees too few GPUs (saying so);
`make gpu-check` runs them on an instructor's workstation image.

Each asserts behaviour the CPU tests pin only by their logic: NCCL jobs learn, a failing
rank ends an NCCL job fast (distributed.exit_at_once), SyncBatchNorm keeps the
ranks' statistics equal, a sweep uses every GPU, checkpoints hold one GPU's random state.
"""
import io

import pytest
import torch

from conftest import run_course_command
from workshop_lib import checkpoint, data, faults, launch, runlog, sweep
from workshop_lib.findings import keeping_accuracy_at_scale as nb03
from workshop_lib.findings import when_things_go_wrong as nb04

pytestmark = pytest.mark.slow
FLAGS = ["--device", "cuda", "--dataset", "digits", "--epochs", "4", "--batch-size", "32",
         "--no-progress"]


def launch_ddp(out, *flags, nproc=2, timeout=300):
    return launch.run(["-m", "workshop_lib.train_ddp", *FLAGS, "--out", str(out), *flags],
                      nproc=nproc, timeout=timeout, stream=io.StringIO())


@pytest.mark.gpu(2)
def test_ddp_on_gpus_learns_with_nccl(tmp_path):
    result = launch_ddp(tmp_path)
    assert result.ok, "".join(result.output)[-3000:]
    run = runlog.read(tmp_path)
    assert run.start["backend"] == "nccl" and run.start["device"] == "cuda:0"
    assert run.final["val_acc"] >= 0.95


@pytest.mark.gpu(2)
def test_a_raising_rank_ends_an_nccl_job_fast(tmp_path):
    train_set, _, _ = data.load("digits")
    step = faults.step_in_epoch(2, data.steps_per_epoch(len(train_set), 2, 32))
    result = launch_ddp(tmp_path, "--inject-fault", f"raise@1:{step}")
    assert not result.ok and result.failed_rank == 1
    assert result.fault_to_exit_s < nb04.FAIL_FAST_S, result.summary()


@pytest.mark.gpu(2)
def test_a_hanging_rank_under_nccl_becomes_an_error(tmp_path):
    train_set, _, _ = data.load("digits")
    step = faults.step_in_epoch(2, data.steps_per_epoch(len(train_set), 2, 32))
    result = launch_ddp(tmp_path, "--inject-fault", f"hang@1:{step}", "--dist-timeout", "20")
    assert not result.ok
    assert result.fault_to_exit_s < 20 + nb04.FAIL_FAST_S, result.summary()


@pytest.mark.gpu(1)
def test_one_gpu_run_learns_and_its_checkpoint_holds_that_gpus_random_state(tmp_path):
    from workshop_lib import train

    train.main([*FLAGS, "--out", str(tmp_path)])
    run = runlog.read(tmp_path)
    assert run.start["device"] == "cuda:0" and run.final["val_acc"] >= 0.95
    state = checkpoint.load(tmp_path / "checkpoint.pt")
    assert isinstance(state["cuda_rng"], torch.Tensor) and state["cuda_rng"].dtype == torch.uint8
    train.main([*FLAGS, "--epochs", "5", "--out", str(tmp_path), "--resume"])
    assert runlog.read(tmp_path).column("epoch") == [1, 2, 3, 4, 5]


@pytest.mark.gpu(2)
def test_sync_batchnorm_makes_ranks_match_one_process_on_gpus(tmp_path):
    out = tmp_path / "equivalence.json"
    result = run_course_command(["torchrun", "--standalone", "--nproc-per-node=2", "-m",
                                 "workshop_lib.equivalence", "--device", "cuda",
                                 "--out", str(out)])
    assert result.returncode == 0, result.stderr[-3000:]
    found = nb03.batchnorm(runlog.load_json(out))
    assert found["bn_free"].holds and found["batchnorm"].holds
    assert found["sync_batchnorm"].holds, found["sync_batchnorm"].text


@pytest.mark.gpu(2)
def test_a_sweep_uses_every_gpu(tmp_path):
    # Four runs, long enough that the second worker has started before the first could
    # take them all.
    runs = [(f"bs{b}", ["--batch-size", str(b)]) for b in (16, 32, 64, 128)]
    results = sweep.run_sweep(tmp_path, runs, ["--device", "cuda", "--dataset", "digits",
                                               "--epochs", "6"], parallel="2")
    assert {run.start["device"] for run in results.values()} == {"cuda:0", "cuda:1"}


@pytest.mark.gpu(1)
@pytest.mark.parametrize("amp", ["fp16", "bf16"])
def test_mixed_precision_on_a_gpu_learns_and_reports_its_peak_memory(tmp_path, amp):
    from workshop_lib import train

    train.main([*FLAGS, "--amp", amp, "--channels-last", "--out", str(tmp_path)])
    run = runlog.read(tmp_path)
    assert run.final["val_acc"] >= 0.95
    assert run.final["peak_memory_mib"] > 0
    if amp == "fp16":
        assert checkpoint.load(tmp_path / "checkpoint.pt")["scaler"]["scale"] > 0
