"""Sharded optimizer state (ZeRO stage 1): each rank keeps and steps 1/N of the optimizer.

Notebook 07, "Inside DDP", section 3 ("Shard the optimizer state") reads this file. With
plain data parallelism every rank holds the whole optimizer state and takes the very same
step: SGD with momentum keeps one extra tensor per parameter, Adam two (``exp_avg``,
``exp_avg_sq``), so Adam's state alone is twice the model, on every rank, computed N times.
ZeRO stage 1 (Rajbhandari et al., 2020) keeps each parameter's state on one rank only:

1. ``partition``: give each trainable parameter an owner rank, balancing the elements
   (largest first, each to the least-loaded rank, as PyTorch's ``ZeroRedundancyOptimizer``
   does), the same on every rank since every rank computes it from the same shapes.
2. Each rank builds an ordinary optimizer over the parameters it owns: only their state
   ever exists here.
3. ``step()``, once the gradients are averaged (by DDP or a wrapper of sections 1-2):
   each rank steps its own parameters, then every parameter is broadcast from its owner,
   so all ranks hold the whole updated model again.

The memory saved is optimizer state (``state_bytes``); the gradients and parameters are
still whole on every rank (ZeRO stages 2 and 3, and FSDP, shard those too). A parameter no
rank used this step keeps ``.grad = None`` and its owner's optimizer skips it, as a
replicated one would; frozen parameters get no owner.
"""
import copy

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer


def partition(params, world_size):
    """The owner rank of each parameter: largest first, each to the least-loaded rank."""
    owners, load = [None] * len(params), [0] * world_size
    for i in sorted(range(len(params)), key=lambda i: params[i].numel(), reverse=True):
        rank = load.index(min(load))
        owners[i] = rank
        load[rank] += params[i].numel()
    return owners


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
        if self.local is not None:
            self.local.step()
        works = [dist.broadcast(param, src=owner, async_op=True)
                 for param, owner in zip(self.params, self.owners, strict=True)]
        for work in works:
            work.wait()


def state_bytes(optimizer):
    """Bytes of optimizer state this process holds (a torch optimizer, or a
    ``ShardedOptimizer`` / ``ZeroRedundancyOptimizer``'s local one)."""
    local = getattr(optimizer, "local", optimizer)  # a ShardedOptimizer's share
    local = getattr(local, "optim", local)          # a ZeroRedundancyOptimizer's share
    if local is None:  # a ShardedOptimizer with an empty share
        return 0
    return sum(value.numel() * value.element_size()
               for state in local.state.values() for value in state.values()
               if torch.is_tensor(value))


def state_bytes_per_rank(optimizer, device="cpu"):
    """``state_bytes`` of every rank, as a list (a collective: every rank calls it;
    ``device``: where the group's backend takes tensors, a GPU for NCCL)."""
    mine = torch.tensor([state_bytes(optimizer)], dtype=torch.int64, device=device)
    everyone = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    return [int(t) for t in everyone]


def compare_state_memory(model, optimizer_class=torch.optim.SGD, sharded_class=None,
                         **defaults):
    """Optimizer-state bytes per rank, replicated vs sharded, for ``model`` (a collective).

    Both optimizers take one step on zero gradients (state appears at the first step) on
    copies of the model. ``sharded_class``: ``ShardedOptimizer`` unless another is given
    (a learner's). Returns ``{"parameter_bytes", "largest_parameter_bytes", "replicated",
    "sharded": [per rank]}``.
    """
    device = next(model.parameters()).device
    replica, shard = copy.deepcopy(model), copy.deepcopy(model)
    replicated = optimizer_class(replica.parameters(), **defaults)
    sharded = (sharded_class or ShardedOptimizer)(shard.parameters(), optimizer_class,
                                                  **defaults)
    for param in (*replica.parameters(), *shard.parameters()):
        if param.requires_grad:
            param.grad = torch.zeros_like(param)
    replicated.step()
    sharded.step()
    sizes = [p.numel() * p.element_size() for p in model.parameters()]
    return {"parameter_bytes": sum(sizes), "largest_parameter_bytes": max(sizes),
            "replicated": state_bytes(replicated),
            "sharded": state_bytes_per_rank(sharded, device)}


def pytorch_state_bytes(model, optimizer_class=torch.optim.SGD, **defaults):
    """Optimizer-state bytes per rank under PyTorch's own ZeRO-1,
    ``ZeroRedundancyOptimizer``, for ``model`` (a collective; the same first step on zero
    gradients as ``compare_state_memory``, on a copy)."""
    copied = copy.deepcopy(model)
    optimizer = ZeroRedundancyOptimizer(copied.parameters(), optimizer_class, **defaults)
    for param in copied.parameters():
        param.grad = torch.zeros_like(param)
    optimizer.step()
    return state_bytes_per_rank(optimizer, next(copied.parameters()).device)
