"""What DDP does in one training step, for a given model: the picture notebook 02 draws
before its conversion exercise (``plots.draw_ddp_step``).

At the wrap, rank 0's parameters and buffers are broadcast to every rank, so every replica
starts equal. Each step, every rank runs forward and backward on its own batch; during
backward DDP packs the gradients into buckets in the order backward produces them (the
last layers' first) and starts one all-reduce per bucket as soon as its last gradient is
ready, so the communication of the first buckets overlaps the backward of the earlier
layers. After the last all-reduce every rank holds the same averaged gradient, and the
optimizer takes the same step on every replica.

``buckets`` asks torch itself (``dist._compute_bucket_assignment_by_size``, what DDP's
constructor calls) for the buckets DDP uses once it has rebuilt them after the first step:
with DDP's defaults the first capped at ``dist._DEFAULT_FIRST_BUCKET_BYTES`` (1 MiB, so the
first all-reduce starts early), the others at 25 MiB. The order is the reverse of the model's
parameters: the order backward produces gradients for a model that runs its layers in the
order it defines them, as the course's models do (DDP records the real order in its first
step).
"""
from dataclasses import dataclass

import torch.distributed as dist

BUCKET_CAP_MB = 25  # DistributedDataParallel's default bucket_cap_mb


@dataclass(frozen=True)
class Bucket:
    names: tuple[str, ...]  # its parameters, in the order backward produces their gradients
    numel: int

    @property
    def bytes(self):
        return 4 * self.numel  # float32 gradients


def buckets(model, bucket_cap_mb=None):
    """The model's gradient buckets as DDP's rebuild forms them, first all-reduced first.
    ``bucket_cap_mb`` as DDP takes it: None is its default, which also caps the first
    bucket at 1 MiB; a value given caps every bucket (``BucketCapacityConfig``)."""
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad][::-1]
    cap = int((BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb) * 2**20)
    limits = [dist._DEFAULT_FIRST_BUCKET_BYTES, cap] if bucket_cap_mb is None else [cap]
    params = [p for _, p in named]
    indices, _ = dist._compute_bucket_assignment_by_size(params, limits, [False] * len(params))
    return [Bucket(tuple(named[i][0] for i in bucket), sum(params[i].numel() for i in bucket))
            for bucket in indices]
