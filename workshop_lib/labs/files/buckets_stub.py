"""Gradient buckets (notebook 07, section 2): your version.

``OverlappedDataParallel`` (section 1) starts one all-reduce per group of parameters once
the whole group's gradients arrived, in group order, and handles frozen, unused and tied
parameters. Here a group is a bucket of about ``bucket_bytes``: write how the buckets are
planned, filled and emptied (the three methods marked "Your code").
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
        """Buckets of indices into ``params``, which come in reverse parameter order."""
        # Your code: return a list of buckets, each a list of indices into params, filled
        # in the order given; start a new bucket when the next parameter's bytes
        # (numel() * element_size()) would take the bucket past self.bucket_bytes, so a
        # parameter larger than that gets a bucket of its own.
        raise NotImplementedError("group the parameters into buckets of bucket_bytes")

    def all_reduce(self, g):
        """Flatten bucket ``g``'s gradients into its buffer; start one all-reduce of it."""
        # Your code: copy the gradients of the parameters in self.groups[g] into
        # self.flat[g] (torch.cat of the flattened gradients, out=self.flat[g]), then start
        # an asynchronous all-reduce of self.flat[g] and return its Work.
        raise NotImplementedError("flatten the bucket and start its all-reduce")

    def unpack(self, g):
        """Sums to means, then each parameter's piece of the buffer back into ``.grad``."""
        # Your code: divide self.flat[g] by self.world_size, split it into one piece per
        # parameter of the bucket, and copy each piece (viewed in its parameter's shape)
        # into that parameter's .grad.
        raise NotImplementedError("average the bucket and copy it back into the gradients")
