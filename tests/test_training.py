"""The two training scripts, launched as a learner launches them, actually learn.

One launch each (a torchrun launch costs ~10-30 s of start-up on a small machine);
every test of a run reads that run's record.
"""
import math

import pytest
import torch

from conftest import DDP_RUN_EPOCHS as EPOCHS
from conftest import run_course_command
from workshop_lib import checkpoint, data, faults, hardware, models, runlog, train

pytestmark = pytest.mark.slow  # starts processes: torchrun, spawned ranks, papermill

# Measured on a 2-core CPU: 0.98-0.99 after 4-5 epochs, whatever the seed. A broken
# gradient path (no all-reduce, a frozen layer, a wrong loss) stays far below.
ACCURACY_BAR = 0.95


@pytest.fixture(scope="module")
def single_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("train")
    result = run_course_command(["-m", "workshop_lib.train", "--device", "cpu",
                                 "--dataset", "digits",
                                 "--epochs", str(EPOCHS), "--batch-size", "64",
                                 "--no-progress", "--out", str(out)])
    assert result.returncode == 0, result.stderr
    return out, result


def assert_learned(run):
    losses = run.column("train_loss")
    assert losses[-1] < losses[0] / 4, f"training loss should fall steeply: {losses}"
    assert run.final["val_acc"] >= ACCURACY_BAR, run.column("val_acc")
    assert run.end["reason"] == f"{EPOCHS} epochs done"


def test_single_process_learns(single_run):
    out, _ = single_run
    run = runlog.read(out)
    assert_learned(run)
    assert run.start["world_size"] == 1 and run.final["global_batch_size"] == 64


def test_two_ranks_learn_with_the_global_batch_in_the_record(ddp_run):
    out, result = ddp_run
    run = runlog.read(out)
    assert_learned(run)
    assert run.start["backend"] == "gloo"
    assert run.start["world_size"] == 2 and run.start["batch_size"] == 32
    assert run.final["global_batch_size"] == 64
    # 2 ranks share the cores: each gets half of them (at least one thread).
    assert run.start["threads_per_process"] == hardware.threads_per_process(2)
    train_set, val_set, _ = data.load("digits")
    assert all(e["val_samples"] == len(val_set) for e in run.epochs), \
        "metrics cover the whole validation set"
    shard = math.ceil(len(train_set) / 2)
    steps = data.steps_per_epoch(len(train_set), 2, 32)
    for rank in (0, 1):
        assert f"[rank {rank}/2] cpu samples={shard} steps={steps}" in result.stdout


def test_only_rank0_writes_and_the_checkpoint_loads_into_the_plain_model(ddp_run):
    out, result = ddp_run
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint.pt", "run.jsonl"]
    assert result.stdout.count("epoch train_loss") == 1, "one table, printed by rank 0"

    state = checkpoint.load(out / "checkpoint.pt")
    _, val_set, info = data.load("digits")
    model = models.build("cnn", info)
    model.load_state_dict(state["model"])  # strict: no "module." prefixes from the wrapper
    assert state["epoch"] == EPOCHS
    sums = train.evaluate(model, data.TensorLoader(val_set, 512, range(len(val_set)), "cpu"))
    # The logged global accuracy is the saved model's accuracy on the full validation set.
    assert sums[1].item() / sums[2].item() == pytest.approx(runlog.read(out).final["val_acc"])


def test_single_process_checkpoint_restores_model_optimizer_and_schedule(single_run):
    out, _ = single_run
    state = checkpoint.load(out / "checkpoint.pt")
    model = models.build("cnn", data.DATASETS["digits"])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    assert checkpoint.resume(out / "checkpoint.pt", model, optimizer, scheduler) == EPOCHS
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, state["model"][name])
    saved = state["optimizer"]["state"]
    restored = optimizer.state_dict()["state"]
    assert saved and set(restored) == set(saved), "a momentum buffer per parameter"
    for key in saved:
        assert torch.equal(restored[key]["momentum_buffer"], saved[key]["momentum_buffer"])
    train_set, _, _ = data.load("digits")
    steps = data.steps_per_epoch(len(train_set), 1, 64)
    assert scheduler.last_epoch == EPOCHS * steps, "the schedule continues where it stopped"


def test_single_process_resume_reproduces_the_uninterrupted_run(single_run, tmp_path):
    from workshop_lib.faults import InjectedFault

    reference_dir, _ = single_run
    flags = ["--device", "cpu", "--dataset", "digits", "--epochs", str(EPOCHS),
             "--batch-size", "64",
             "--no-progress", "--out", str(tmp_path)]
    train_set, _, _ = data.load("digits")
    step = faults.step_in_epoch(3, data.steps_per_epoch(len(train_set), 1, 64))
    with pytest.raises(InjectedFault):  # dies in epoch 3, after epoch 2's checkpoint
        train.main([*flags, "--inject-fault", f"raise@0:{step}"])
    assert checkpoint.load(tmp_path / "checkpoint.pt")["epoch"] == 2
    train.main([*flags, "--resume"])
    resumed, reference = runlog.read(tmp_path), runlog.read(reference_dir)
    assert resumed.column("val_acc") == reference.column("val_acc")
    assert resumed.column("train_loss") == reference.column("train_loss")
