"""Two edges of notebook 05's tools, on the CPU: an fp16 step the gradient scaler skips, and
a largest-batch search that reaches its cap before the memory's limit."""
import warnings

import pytest
import torch
import torch.distributed as dist

from workshop_lib import distributed, memory, train, train_ddp
from workshop_lib.findings import worked_example as nb05
from workshop_lib.precision import Precision


def linear_model():
    """A model small enough for float16 on a CPU (emulated: the course CNN's fp16 backward
    takes seconds there)."""
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))


def overflowing_then_fine(digits, steps=4, batch=32):
    """Batches whose first overflows float16 (inputs of 1e6: the scaler must skip that step),
    then ordinary ones."""
    x, y = digits[0].tensors
    batches = [(x[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch])
               for i in range(steps)]
    batches[0] = (batches[0][0] * 1e6, batches[0][1])
    return batches


def fp16_epoch(script, model, batches):
    """One epoch of ``script``'s train_epoch in fp16 on the CPU, with a warmup schedule;
    returns (warnings raised, optimizer steps taken, the scheduler, the precision)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    taken = []
    optimizer.register_step_post_hook(lambda *_: taken.append(1))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: (step + 1) / 10)
    precision = Precision("fp16", "cpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        script.train_epoch(model, batches, optimizer, scheduler, precision, 1, False)
    return [str(w.message) for w in caught], len(taken), scheduler, precision


def assert_schedule_follows_the_steps_taken(caught, taken, scheduler, precision, batches):
    assert not [w for w in caught if "lr_scheduler.step()" in w], caught
    assert taken == len(batches) - 1, "the overflowed step was skipped, the others taken"
    assert precision.scaler.get_scale() < 2.0**16, "the scaler backed off once"
    # The schedule counts the optimizer's steps: the warmup is not eaten by skipped ones.
    assert scheduler.last_epoch == taken
    assert scheduler.get_last_lr() == [pytest.approx(0.1 * (taken + 1) / 10)]


def test_a_skipped_fp16_step_does_not_step_the_schedule(digits):
    torch.manual_seed(0)
    batches = overflowing_then_fine(digits)
    caught, taken, scheduler, precision = fp16_epoch(train, linear_model(), batches)
    assert_schedule_follows_the_steps_taken(caught, taken, scheduler, precision, batches)


def test_the_ddp_script_too(digits):
    """train_ddp's loop (no_sync, the DDP wrap) in a one-rank gloo group in this process."""
    torch.manual_seed(0)
    batches = overflowing_then_fine(digits)
    device = torch.device("cpu")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{distributed.free_port()}",
                            rank=0, world_size=1)
    try:
        model = train_ddp.wrap(linear_model(), device)
        result = fp16_epoch(train_ddp, model, batches)
    finally:
        dist.destroy_process_group()
    assert_schedule_follows_the_steps_taken(*result, batches)


def test_precision_step_says_whether_the_optimizer_stepped():
    param = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([param], lr=0.1)
    plain, fp16 = Precision("off"), Precision("fp16", "cpu")
    plain.backward(param.sum())
    assert plain.step(optimizer) is True
    optimizer.zero_grad()
    fp16.backward((param * float("inf")).sum())  # gradients that overflow
    assert fp16.step(optimizer) is False
    assert param.tolist() == [pytest.approx(0.9)] * 2, "the skipped step changed nothing"
    optimizer.zero_grad()
    fp16.backward(param.sum())
    assert fp16.step(optimizer) is True
    assert param.tolist() == [pytest.approx(0.8)] * 2


def fits_up_to(limit, mib_per_sample=0.5):
    """A fake training step for the search: its memory, or None (out of memory) past
    ``limit`` samples."""
    return lambda batch: batch * mib_per_sample if batch <= limit else None


def test_the_largest_batch_search_says_when_its_cap_stopped_it():
    found = memory.search_largest(fits_up_to(1000), start=32, cap=1 << 16)
    assert (found.batch, found.capped, found.mib_per_sample) == (512, False, 0.5)
    assert str(found) == "512"
    capped = memory.search_largest(fits_up_to(10**9), start=32, cap=1 << 16)
    assert (capped.batch, capped.capped) == (65536, True)
    assert str(capped) == "at least 65536 (the search cap)"
    none = memory.search_largest(fits_up_to(16), start=32)
    assert (none.batch, none.capped) == (None, False)
    assert memory.largest_batch(None, None, "cpu", None) is None, "no allocator on a CPU"


def test_capped_searches_are_compared_per_sample_not_by_batch():
    plain = memory.search_largest(fits_up_to(10**9, mib_per_sample=1.0))
    checkpointed = memory.search_largest(fits_up_to(10**9, mib_per_sample=0.3))
    (found,) = nb05.largest_batch(plain, checkpointed, "cuda")
    assert "at least 65536 (the search cap) without checkpointing" in found.text
    assert "not at the GPU's memory, so these batches do not compare" in found.text
    assert "0.30x" in found.text and found.holds
    same = nb05.largest_batch(plain, memory.search_largest(fits_up_to(10**9, 0.8)), "cuda")
    assert not same["largest_batch"].holds, "0.8x the memory per sample is no real saving"
    uncapped = nb05.largest_batch(memory.search_largest(fits_up_to(3000, 1.0)),
                                      memory.search_largest(fits_up_to(9000, 0.3)), "cuda")
    assert "2,048 without checkpointing, 8,192 with it (4x" in uncapped["largest_batch"].text
    assert nb05.largest_batch(None, None, "cpu")["largest_batch"].skipped
