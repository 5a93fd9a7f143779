"""The worked example's tools in both training scripts: mixed precision, gradient
accumulation with no_sync, gradient checkpointing, and what each epoch records of memory."""
import contextlib
import io

import pytest
import torch

from conftest import run_in_ranks
from workshop_lib import data, models, runlog, train, train_ddp
from workshop_lib.precision import PLAIN, Precision

FLAGS = ["--device", "cpu", "--dataset", "digits", "--no-progress"]


def train_quietly(out, *flags):
    with contextlib.redirect_stdout(io.StringIO()):
        train.main([*FLAGS, "--out", str(out), *flags])
    return runlog.read(out)


def bn_free_model():
    torch.manual_seed(0)
    info = data.DATASETS["digits"]
    return models.SmallCNN(info.in_channels, info.num_classes, width=8, batch_norm=False)


def one_epoch(batch_size, accumulate, samples=256):
    train_set, _, _ = data.load("digits")
    subset = torch.utils.data.TensorDataset(*(t[:samples] for t in train_set.tensors))
    sampler = torch.utils.data.RandomSampler(subset, generator=torch.Generator().manual_seed(0))
    model = bn_free_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    steps = []
    optimizer.register_step_post_hook(lambda *_: steps.append(1))
    loader = data.TensorLoader(subset, batch_size, sampler, "cpu")
    train.train_epoch(model, loader, optimizer, scheduler, PLAIN, accumulate, progress=False)
    return model, len(steps)


def test_four_accumulated_batches_are_one_step_on_their_union():
    accumulated, steps = one_epoch(batch_size=8, accumulate=4)
    whole, whole_steps = one_epoch(batch_size=32, accumulate=1)
    assert steps == whole_steps == 256 // 32, "one optimizer step per 4 batches"
    for a, b in zip(accumulated.parameters(), whole.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_bf16_trains_to_the_learning_bar(tmp_path):
    run = train_quietly(tmp_path, "--amp", "bf16", "--epochs", "5", "--batch-size", "64")
    assert run.start["amp"] == "bf16" and run.final["val_acc"] >= 0.95


def test_fp16_scales_the_loss_and_keeps_the_scaler_in_the_checkpoint():
    model = bn_free_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    precision = Precision("fp16", "cpu")
    x, y = torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,))
    before = [p.detach().clone() for p in model.parameters()]
    loss = train.train_step(model, optimizer, x, y, precision)
    assert torch.isfinite(loss) and precision.scaler.get_scale() > 1
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert precision.state_dict()["scale"] == precision.scaler.get_scale()


@pytest.mark.slow
def test_checkpointing_saves_less_for_backward_with_the_same_training_loss(tmp_path):
    plain = train_quietly(tmp_path / "plain", "--epochs", "2", "--batch-size", "64")
    lean = train_quietly(tmp_path / "lean", "--epochs", "2", "--batch-size", "64",
                         "--grad-checkpointing")
    saved, saved_lean = (run.final["saved_activation_bytes"] for run in (plain, lean))
    assert saved_lean <= 0.6 * saved, (saved, saved_lean)  # at least 40% less
    # Recomputation reruns the same operations: the same batches give the same losses.
    torch.testing.assert_close(lean.column("train_loss"), plain.column("train_loss"),
                               rtol=1e-4, atol=1e-5)
    assert plain.final["peak_memory_mib"] is None, "no GPU allocator to ask on a CPU"


@pytest.mark.parametrize("name", list(models.MODELS))
def test_checkpointing_cuts_saved_activations_by_40_percent_on_every_course_model(name):
    from workshop_lib import memory

    info = data.DATASETS["fashion-mnist"] if name != "cnn" else data.DATASETS["digits"]
    size = info.image_size
    saved = {}
    for checkpointed in (False, True):
        torch.manual_seed(0)
        model = models.build(name, info, grad_checkpointing=checkpointed)
        x, y = torch.randn(4, info.in_channels, size, size), torch.randint(0, 10, (4,))
        with memory.SavedForBackward(model) as counter:
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        saved[checkpointed] = counter.bytes
    assert saved[True] <= 0.6 * saved[False], saved


def accumulating_ddp_epoch(rank, world_size):
    """One epoch of train_ddp.fit with --accumulate 4, counting DDP's all-reduces."""
    calls, steps = [], []
    wrap = train_ddp.wrap

    def counting_wrap(model, device, process_group=None):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp = wrap(model, device, process_group)
        ddp.register_comm_hook(None, lambda state, bucket: (
            calls.append(1), default_hooks.allreduce_hook(state, bucket))[1])
        return ddp

    train_ddp.wrap = counting_wrap
    original_step = torch.optim.SGD.step

    def counting_step(self, *args, **kwargs):
        steps.append(1)
        return original_step(self, *args, **kwargs)

    torch.optim.SGD.step = counting_step
    import tempfile

    args = train_ddp.parse_args([*FLAGS, "--epochs", "1", "--batch-size", "8",
                                 "--accumulate", "4", "--out", tempfile.mkdtemp()])
    with contextlib.redirect_stdout(io.StringIO()):
        train_ddp.fit(args, torch.device("cpu"), rank, world_size)
    return {"all_reduces": len(calls), "steps": len(steps)}


@pytest.mark.slow
def test_ddp_accumulation_all_reduces_once_per_optimizer_step(tmp_path):
    train_set, _, _ = data.load("digits")
    batches = data.steps_per_epoch(len(train_set), 2, 8)
    for rank in run_in_ranks(accumulating_ddp_epoch, 2, tmp_path):
        assert rank["steps"] == -(-batches // 4)
        # The model's gradients fit in one bucket: one all-reduce per optimizer step, not
        # one per batch.
        assert rank["all_reduces"] == rank["steps"]
