"""FSDP: shard the parameters and the gradients too, not only the optimizer state.

Notebook 07, "Inside DDP", section 6 ("What comes next") shows these numbers. With DDP
every rank holds the whole model four times over in float32 with Adam: parameters,
gradients, and two optimizer states (``exp_avg``, ``exp_avg_sq``), 16 bytes a parameter.
ZeRO-1 (``zero1.py``) keeps 1/N of the optimizer state per rank; ZeRO-2 also reduces each
gradient only to the rank that steps it (a reduce-scatter instead of an all-reduce);
ZeRO-3, which PyTorch calls FSDP, also keeps 1/N of every parameter and all-gathers one
layer's full weights just before that layer runs (forward, and again in backward), freeing
them after. PyTorch's FSDP2, ``torch.distributed.fsdp.fully_shard``, applied per module,
makes each parameter a ``DTensor`` split along its first dimension over the ranks.

- ``memory_per_rank``: bytes each rank holds under each scheme, from a parameter count
  (no activations, no all-gathered layer in flight, no DDP bucket buffers); for the
  course's Wide ResNet (``wide_resnet``), in ``memory_rows``.
- ``compare``: DDP and ``fully_shard`` trained with Adam from one start on the same
  batches (a collective): the largest parameter difference after a few steps, and the
  bytes each rank holds under each, measured from the tensors it keeps.
"""
import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

from workshop_lib import data, models, profile, runlog, train_ddp
from workshop_lib.equivalence import full_float32
from workshop_lib.inside_ddp import replay

BYTES, STATES = 4, 2  # float32; Adam's exp_avg and exp_avg_sq
SCHEMES = ("ddp", "zero1", "zero2", "fsdp")
WORLD_SIZES = (2, 4, 8)  # the GPU counts of the memory table
STEPS, BATCH_SIZE, LR = 5, 32, 0.01


def memory_per_rank(parameters, world_size, nbytes=BYTES, states=STATES):
    """``{scheme: {"parameters", "gradients", "optimizer_state", "total"}}`` in bytes on
    each of ``world_size`` ranks, for a model of ``parameters`` parameters."""
    whole = parameters * nbytes
    shard = whole / world_size
    held = {"ddp": (whole, whole, states * whole),
            "zero1": (whole, whole, states * shard),
            "zero2": (whole, shard, states * shard),
            "fsdp": (shard, shard, states * shard)}
    return {scheme: {"parameters": p, "gradients": g, "optimizer_state": s,
                     "total": p + g + s} for scheme, (p, g, s) in held.items()}


def wide_resnet():
    """The course's Wide ResNet (the GPU profile's model): its name and parameter count."""
    name = profile.SIZES[("cuda", "fashion-mnist")].model
    return name, models.count_parameters(models.build(name, data.DATASETS["fashion-mnist"]))


def local(tensor):
    """This rank's part of a tensor: a DTensor's local shard, or the tensor itself."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def nbytes(tensors):
    return sum(local(t).numel() * local(t).element_size() for t in tensors
               if torch.is_tensor(t))


def held_bytes(model, optimizer):
    """Bytes of parameters, gradients and optimizer state this rank holds."""
    params = list(model.parameters())
    return {"parameters": nbytes(params),
            "gradients": nbytes(p.grad for p in params if p.grad is not None),
            "optimizer_state": nbytes(v for state in optimizer.state.values()
                                      for v in state.values())}


def per_rank(held, device):
    """``held`` (a dict of ints) of every rank: ``{key: [rank 0's, rank 1's, ...]}``."""
    mine = torch.tensor(list(held.values()), dtype=torch.int64, device=device)
    everyone = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    return {key: [int(t[i]) for t in everyone] for i, key in enumerate(held)}


def shard(model):
    """``fully_shard`` every block that owns parameters, then the root (the rest)."""
    for block in model.features:
        if any(True for _ in block.parameters()):
            fully_shard(block)
    return fully_shard(model)


def train(model, batches, steps):
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    for x, y in batches[:steps]:
        optimizer.zero_grad(set_to_none=False)  # keep the gradients, to count them
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    return optimizer


@full_float32()
def compare(rank, world_size, device, dataset="digits", steps=STEPS, batch_size=BATCH_SIZE):
    """DDP against FSDP2 on the course CNN (a collective), in full float32 with cuDNN's
    deterministic algorithms on a GPU (``equivalence.full_float32``: TF32 and cuDNN's
    choices, not sharding, would decide "the same" otherwise). Returns ``{"max_difference",
    "moved", "held": {"ddp": per rank, "fsdp": per rank}, "parameters", "steps"}``."""
    train_set, _, info = data.load(dataset)
    batches = replay.rank_batches(train_set, rank, world_size, batch_size, steps, device)
    torch.manual_seed(0)
    start = models.build("cnn", info).to(device)
    ddp = train_ddp.wrap(copy.deepcopy(start), device)
    ddp_optimizer = train(ddp, batches, steps)
    sharded = shard(copy.deepcopy(start))
    fsdp_optimizer = train(sharded, batches, steps)
    full = [p.full_tensor() for p in sharded.parameters()]  # all-gathered: a collective
    ddp_params = [p.detach() for p in ddp.module.parameters()]
    return {"max_difference": replay.max_difference(full, ddp_params),
            "moved": replay.max_difference(ddp_params, list(start.parameters())),
            "held": {"ddp": per_rank(held_bytes(ddp.module, ddp_optimizer), device),
                     "fsdp": per_rank(held_bytes(sharded, fsdp_optimizer), device)},
            "parameters": models.count_parameters(start), "steps": steps}


def memory_rows(parameters, world_sizes=WORLD_SIZES):
    """Bytes a rank holds (parameters, gradients, Adam state, float32) under DDP, ZeRO-1,
    ZeRO-2 and FSDP, for a model of ``parameters`` on each of ``world_sizes`` GPUs."""
    return [{"gpus": n, **{scheme: held["total"] for scheme, held in
                           memory_per_rank(parameters, n).items()}}
            for n in world_sizes]


def table(rows):
    """``memory_rows``: MiB per GPU under each scheme, one line per GPU count."""
    return runlog.format_table(
        [{"gpus": row["gpus"], **{s: row[s] / 2**20 for s in SCHEMES}} for row in rows],
        {"gpus": ("GPUs", "d"), **{s: (f"{s} MiB", ",.1f") for s in SCHEMES}})


def held_table(result):
    """What rank 0 held, measured: KiB of parameters, gradients, optimizer state."""
    held = result["held"]
    return runlog.format_table(
        [{"how": name, **{k: v[0] / 2**10 for k, v in held[name].items()}} for name in held],
        {"how": ("rank 0", ""), "parameters": ("parameters KiB", ",.1f"),
         "gradients": ("gradients KiB", ",.1f"), "optimizer_state": ("Adam state KiB", ",.1f")})
