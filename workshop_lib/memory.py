"""What a training step keeps in memory (notebook 05): the bytes autograd saves for the
backward pass, on any device, and the GPU's peak allocation.

Gradient checkpointing and mixed precision change how much a step saves for backward;
on a CPU that is the figure to watch (there is no allocator to ask), on a GPU the peak
memory the caching allocator reached as well.
"""
import contextlib
from dataclasses import dataclass

import torch


class SavedForBackward:
    """Count the bytes of the tensors autograd saves for backward inside this context.

    Each storage counts once (views of one tensor share it), and the model's parameters
    not at all (they are kept anyway): what is left is the activations, the memory that
    grows with the batch.
    """

    def __init__(self, model):
        self.parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.seen, self.bytes = set(), 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, tensor):
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key not in self.parameters and key not in self.seen:
            self.seen.add(key)
            self.bytes += storage.nbytes()
        return tensor

    def counting(self, on):
        """This counter as a context when ``on``, else a context that counts nothing."""
        return self if on else contextlib.nullcontext()

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        return self._hooks.__exit__(*exc)


def reset_peak(device):
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_mib(device):
    """The GPU's peak allocated memory since ``reset_peak`` (MiB), or None on a CPU."""
    if torch.device(device).type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 2**20


def saved_bytes_per_step(model, x, y, precision):
    """What one training step on (x, y) saves for backward (its gradients are discarded)."""
    import torch.nn.functional as F

    counter = SavedForBackward(model)
    with counter, precision.autocast():
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    model.zero_grad(set_to_none=True)
    return counter.bytes


SEARCH_CAP = 1 << 16  # the largest batch largest_batch tries


@dataclass(frozen=True)
class LargestBatch:
    """What a largest-batch search found.

    ``batch``: the largest power-of-two batch whose training step fitted (None if not even
    the first did). ``capped``: that batch is the search's cap and it still fitted, so the
    memory's limit lies somewhere above: ``batch`` is a lower bound, and comparing two
    capped searches says nothing. ``step_mib``: what that step allocated beyond what was
    allocated before it (activations, gradients, workspace), so ``mib_per_sample``
    compares runs even where both hit the cap.
    """

    batch: int | None
    capped: bool
    cap: int
    step_mib: float | None = None

    @property
    def mib_per_sample(self):
        return None if not (self.batch and self.step_mib) else self.step_mib / self.batch

    def __str__(self):
        if self.batch is None:
            return "none (not even the first batch tried fits)"
        return f"at least {self.batch} (the search cap)" if self.capped else str(self.batch)


def search_largest(step_mib, start=32, cap=SEARCH_CAP):
    """Double the batch from ``start`` up to ``cap`` while ``step_mib(batch)`` (a training
    step's memory in MiB, or None when it ran out of memory) says it fits."""
    found, found_mib, batch = None, None, start
    while batch <= cap:
        mib = step_mib(batch)
        if mib is None:
            return LargestBatch(found, capped=False, cap=cap, step_mib=found_mib)
        found, found_mib, batch = batch, mib, batch * 2
    return LargestBatch(found, capped=found is not None, cap=cap, step_mib=found_mib)


def step_mib(model, info, device, precision, batch):
    """The GPU memory one training step at ``batch`` allocated beyond what was allocated
    before it (MiB), or None when it raised ``torch.OutOfMemoryError``."""
    import torch.nn.functional as F

    before = torch.cuda.memory_allocated(device)
    reset_peak(device)
    try:
        x = torch.randn(batch, info.in_channels, info.image_size, info.image_size,
                        device=device)
        y = torch.randint(0, info.num_classes, (batch,), device=device)
        with precision.autocast():
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - before) / 2**20
    except torch.OutOfMemoryError:
        return None
    finally:
        model.zero_grad(set_to_none=True)
        x = y = loss = None
        torch.cuda.empty_cache()


def largest_batch(build_model, info, device, precision, start=32, cap=SEARCH_CAP):
    """The largest power-of-two batch whose training step fits in the GPU's memory
    (doubling until ``torch.OutOfMemoryError`` or the cap), as a ``LargestBatch``; None on
    a CPU, which has no such limit to find in reasonable time."""
    if torch.device(device).type != "cuda":
        return None
    model = build_model().to(device)
    return search_largest(lambda batch: step_mib(model, info, device, precision, batch),
                          start, cap)
