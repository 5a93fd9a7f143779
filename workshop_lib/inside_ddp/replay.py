"""The yardstick for every stage: N ranks after k steps against one process replaying them.

Notebook 07, "Inside DDP", reads this in every section's check. Data parallelism is right
when N ranks, each on its own batch of b samples, end with exactly the parameters one
process reaches on the global batch of N*b samples: same start, same optimizer, the mean
gradient over all N*b samples at every step. ``train`` runs the distributed side on each
rank (every rank starting from *different* random weights, so that the broadcast is
tested too); ``replay`` recomputes it in one process, from the same shards, which every
rank can do on its own, so that no result has to travel.

Models: ``cnn``, the course's SmallCNN without BatchNorm (BatchNorm's batch statistics are
per rank, so with it N ranks do not compute what one process does), and ``edge``,
``edge_cases.EdgeCaseNet`` (frozen, tied, sometimes unused), on the digits dataset.
"""
import itertools

import torch
import torch.nn.functional as F
from torch.utils.data.distributed import DistributedSampler

from workshop_lib import data, models
from workshop_lib.inside_ddp.edge_cases import EdgeCaseNet, uses_branch

MODELS = ("cnn", "edge")
OPTIMIZERS = {
    "sgd": (torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4}),
    "adam": (torch.optim.Adam, {"lr": 0.01}),
}
STEPS, BATCH_SIZE, START_SEED = 6, 16, 1000


def build(kind, seed):
    torch.manual_seed(seed)
    info = data.DATASETS["digits"]
    if kind == "cnn":
        return models.SmallCNN(info.in_channels, info.num_classes, width=8, batch_norm=False)
    return EdgeCaseNet(info.in_channels * info.image_size**2, 32, info.num_classes)


def loss_on(model, kind, x, y, step, rank):
    """Rank ``rank``'s loss at ``step`` (the edge model takes its branch by the schedule)."""
    out = model(x, use_branch=uses_branch(step, rank)) if kind == "edge" else model(x)
    return F.cross_entropy(out, y)


def batches(world_size, steps=STEPS, batch_size=BATCH_SIZE):
    """``[step][rank] -> (x, y)``: what each rank trains on (DistributedSampler shards)."""
    train_set, _, _ = data.load("digits")
    loaders = [data.TensorLoader(train_set, batch_size,
                                 DistributedSampler(train_set, world_size, r, seed=0), "cpu")
               for r in range(world_size)]
    return [list(step) for step in itertools.islice(zip(*loaders, strict=True), steps)]


def train(rank, world_size, kind, wrap, make_optimizer, steps=STEPS, after_backward=None):
    """``steps`` steps on this rank's shards; returns the unwrapped model's parameters.

    ``wrap(model)`` makes the data-parallel model (a wrapper with ``sync_gradients()``, or
    DDP); ``make_optimizer(params)`` its optimizer. ``after_backward()``, if given, runs
    after every ``backward()``, before ``sync_gradients()``.
    """
    model = wrap(build(kind, START_SEED + rank))  # a different start on every rank
    optimizer = make_optimizer(model.parameters())
    for step, shards in enumerate(batches(world_size, steps)):
        optimizer.zero_grad()
        loss_on(model, kind, *shards[rank], step, rank).backward()
        if after_backward is not None:
            after_backward()
        if hasattr(model, "sync_gradients"):
            model.sync_gradients()
        optimizer.step()
    return [p.detach().clone() for p in model.module.parameters()]


def replay(kind, optimizer, world_size, steps=STEPS):
    """One process, the global batch: the mean of the ranks' losses (equal batches) at
    every step, from rank 0's start. ``optimizer``: a key of ``OPTIMIZERS``."""
    model = build(kind, START_SEED)
    optimizer_class, settings = OPTIMIZERS[optimizer]
    opt = optimizer_class(model.parameters(), **settings)
    for step, shards in enumerate(batches(world_size, steps)):
        opt.zero_grad()
        losses = [loss_on(model, kind, x, y, step, r) for r, (x, y) in enumerate(shards)]
        (sum(losses) / world_size).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def max_difference(params, reference):
    return max((a - b).abs().max().item() for a, b in zip(params, reference, strict=True))


def rank_batches(train_set, rank, world_size, batch_size, steps, device):
    """Rank ``rank``'s first ``steps`` batches of ``batch_size``, epoch after epoch
    (``DistributedSampler`` shards, reshuffled each epoch), on ``device``: what the
    measurements of notebook 07 train every variant on."""
    sampler = DistributedSampler(train_set, world_size, rank, seed=0)
    loader = data.TensorLoader(train_set, batch_size, sampler, device, drop_last=True)
    out = []
    for epoch in itertools.count():
        sampler.set_epoch(epoch)
        out += itertools.islice(loader, steps - len(out))
        if len(out) == steps:
            return out
