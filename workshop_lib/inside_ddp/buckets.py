"""Buckets: fewer, larger all-reduces, each started as soon as its gradients are ready.

Notebook 07, "Inside DDP", section 2 ("Gradient buckets") reads this file. Every
all-reduce pays a fixed cost (a round trip between the ranks, a kernel launch on a GPU)
before its bytes move, so one all-reduce per parameter (section 1, ``overlap.py``) spends
most of its time on that cost when parameters are small. DDP packs gradients into buckets
of about ``bucket_cap_mb`` (25 MB by default):

1. At wrap time, walk the trainable parameters in reverse order (backward produces the
   last layers' gradients first) and fill buckets up to ``bucket_bytes`` each.
2. During backward, when a bucket's last gradient arrives, copy its gradients into one
   flat buffer and start one asynchronous all-reduce of it (in bucket order on every
   rank: ``overlap.py`` explains why the order must be fixed).
3. After the wait, divide the buffer by the world size and copy each piece back into its
   parameter's ``.grad``.

The bucket size trades the two costs: tiny buckets pay the fixed cost many times, one
huge bucket cannot start before backward ends (no overlap left). ``timing.py`` sweeps it.
Unused, frozen and tied parameters are handled by ``OverlappedDataParallel``, unchanged.
(DDP also re-plans its buckets after the first step in the order gradients really
arrived, and can make ``.grad`` a view into the bucket to save the copies; not here.)
"""
import torch
import torch.distributed as dist

from workshop_lib.inside_ddp.overlap import OverlappedDataParallel

DEFAULT_BUCKET_BYTES = 25 * 2**20  # DDP's bucket_cap_mb=25


class BucketedDataParallel(OverlappedDataParallel):
    """``OverlappedDataParallel`` that all-reduces buckets of about ``bucket_bytes``."""

    def __init__(self, module, bucket_bytes=DEFAULT_BUCKET_BYTES):
        self.bucket_bytes = bucket_bytes
        super().__init__(module)  # calls self.plan(...) below
        self.flat = [torch.empty(sum(self.params[i].numel() for i in bucket),
                                 dtype=self.params[bucket[0]].dtype,
                                 device=self.params[bucket[0]].device)
                     for bucket in self.groups]  # one flat buffer per bucket, reused

    def plan(self, params):
        """Buckets of about ``bucket_bytes`` instead of one group per parameter."""
        return plan_buckets(params, self.bucket_bytes)

    def all_reduce(self, g):
        """Flatten bucket ``g``'s gradients into its buffer; start one all-reduce of it."""
        torch.cat([self.params[i].grad.flatten() for i in self.groups[g]], out=self.flat[g])
        return dist.all_reduce(self.flat[g], async_op=True)

    def unpack(self, g):
        """Sums to means, then each parameter's piece of the buffer back into ``.grad``."""
        bucket = self.groups[g]
        self.flat[g] /= self.world_size
        pieces = self.flat[g].split([self.params[i].numel() for i in bucket])
        for i, piece in zip(bucket, pieces, strict=True):
            self.params[i].grad.copy_(piece.view_as(self.params[i]))


def plan_buckets(params, bucket_bytes):
    """Buckets of indices into ``params`` (given in launch order: reverse parameter order),
    filled in that order; a new bucket starts when the next gradient would overflow
    ``bucket_bytes`` (a parameter larger than that gets a bucket of its own) or has another
    dtype (a bucket becomes one flat tensor)."""
    buckets, size = [], 0
    for i, param in enumerate(params):
        nbytes = param.numel() * param.element_size()
        if (not buckets or size + nbytes > bucket_bytes
                or param.dtype != params[buckets[-1][0]].dtype):
            buckets.append([])
            size = 0
        buckets[-1].append(i)
        size += nbytes
    return buckets
