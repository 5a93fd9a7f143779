"""Sharded optimizer state, ZeRO stage 1 (notebook 07, section 3): your version.

Each rank keeps the optimizer state of the parameters it owns only, steps them once the
gradients are averaged (DDP did that), and sends them to the other ranks. Write the two
pieces marked "Your code": who owns what, and the step.
"""
import torch
import torch.distributed as dist


def partition(params, world_size):
    """The owner rank of each parameter (a list as long as ``params``)."""
    # Your code: give every parameter an owner so that the ranks hold about the same
    # number of elements: for instance, largest first (numel()), each to the rank with the
    # fewest elements so far. Every rank computes this alone, so it must not depend on
    # the rank.
    raise NotImplementedError("give each parameter an owner rank, balancing the elements")


class ShardedOptimizer:
    """``optimizer_class(params, **defaults)``, with the state of each parameter on its
    owner rank only. Used like the optimizer it wraps: ``zero_grad()``, ``step()``."""

    def __init__(self, params, optimizer_class=torch.optim.SGD, **defaults):
        self.params = [p for p in params if p.requires_grad]
        self.owners = partition(self.params, dist.get_world_size())
        mine = [p for p, owner in zip(self.params, self.owners, strict=True)
                if owner == dist.get_rank()]
        # The optimizer over this rank's share (None when the share is empty: more ranks
        # than parameters).
        self.local = optimizer_class(mine, **defaults) if mine else None

    def zero_grad(self, set_to_none=True):
        for param in self.params:  # every gradient, not only this rank's share
            if set_to_none:
                param.grad = None
            elif param.grad is not None:
                param.grad.zero_()

    @torch.no_grad()
    def step(self):
        """Step this rank's share, then broadcast every parameter from its owner."""
        # Your code: step self.local (if this rank owns anything), then make every rank
        # hold every updated parameter: broadcast each of self.params from its owner
        # (dist.broadcast(param, src=owner); async_op=True and waiting on all is faster).
        raise NotImplementedError("step your share, then broadcast each parameter from its "
                                  "owner")
