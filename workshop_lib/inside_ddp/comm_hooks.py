"""Communication hooks: change what DDP sends for each bucket, measured.

Notebook 07, "Inside DDP", section 6 ("What comes next") shows these numbers. A bucket of
sections 1-2 is all-reduced as it is; ``DistributedDataParallel.register_comm_hook(state,
hook)`` replaces that with any function of the bucket that returns a future of the
averaged gradients. PyTorch ships a few (``torch.distributed.algorithms.ddp_comm_hooks``):

- ``allreduce``: ``default_hooks.allreduce_hook``, what DDP does without a hook, written
  in Python (so its bytes can be counted here): the yardstick;
- ``fp16`` / ``bf16``: ``fp16_compress_hook`` / ``bf16_compress_hook`` cast the bucket to
  16 bits, all-reduce it, cast back: half the bytes, gradients rounded to 16 bits (fp16
  keeps more mantissa, bf16 more range);
- ``powersgd_rank1``, ``powersgd_rank4``: ``powerSGD_hook.powerSGD_hook`` sends a rank-1
  (PyTorch's default) or rank-4 approximation of each gradient matrix (two thin matrices,
  P and Q) and keeps what it left out for the next step (error feedback); vectors
  (biases) go uncompressed. It all-reduces whole buckets for its first
  ``START_POWERSGD_ITER`` steps (PyTorch allows no fewer than 2).

``compare`` trains the course CNN from one start on the same batches with each hook and
records, per step, the bytes every rank handed to ``dist.all_reduce`` (a ring all-reduce
then sends ``2(N-1)/N`` of them); at the end, the parameters' largest difference from the
``allreduce`` run and the validation accuracy.
"""
import copy

import torch
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.utils.data import SequentialSampler

from workshop_lib import data, models, runlog, train_ddp
from workshop_lib.inside_ddp import replay
from workshop_lib.inside_ddp.verify import recorded_all_reduces

HOOKS = ("allreduce", "fp16", "bf16", "powersgd_rank1", "powersgd_rank4")
START_POWERSGD_ITER = 2  # steps of whole buckets first: the fewest PyTorch allows
STEPS, BATCH_SIZE, LR = 45, 32, 0.05  # two epochs of digits on 2 ranks


def runnable_hooks():
    """``HOOKS`` this environment can run, and why any is left out: torch's PowerSGDState
    imports numpy (to seed its random projections), which a bare GPU image may lack."""
    try:
        import numpy  # noqa: F401 - only whether it imports
    except ImportError:
        return (tuple(hook for hook in HOOKS if not hook.startswith("powersgd")),
                "PowerSGD left out: torch's PowerSGDState imports numpy, which is not "
                "installed here (pip install numpy, or make setup)")
    return HOOKS, None


def register(model, name):
    """Register hook ``name`` (one of ``HOOKS``) on the DDP ``model``."""
    if name.startswith("powersgd_rank"):
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=int(name.removeprefix("powersgd_rank")),
            start_powerSGD_iter=START_POWERSGD_ITER)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    else:
        hook = {"allreduce": default_hooks.allreduce_hook,
                "fp16": default_hooks.fp16_compress_hook,
                "bf16": default_hooks.bf16_compress_hook}[name]
        model.register_comm_hook(None, hook)


@torch.no_grad()
def accuracy(module, val_set, device):
    """Validation accuracy of ``module`` on the whole validation set (no collective)."""
    loader = data.TensorLoader(val_set, data.VAL_BATCH_SIZE, SequentialSampler(val_set), device)
    _, correct, samples = train_ddp.evaluate(module, loader).tolist()
    module.train()
    return correct / samples


def compare(rank, world_size, device, dataset="digits", steps=STEPS, batch_size=BATCH_SIZE,
            lr=LR):
    """Every hook of ``HOOKS`` this environment runs (``runnable_hooks``) on the default
    group's ranks (a collective). Returns ``{name: {"bytes_per_step": [...], "val_acc",
    "max_difference"}, "moved", "steps", "gradient_bytes", "skipped"}`` ("skipped": why a
    hook was left out, or None); ``max_difference`` is from the ``allreduce`` run's parameters,
    ``moved`` how far that run's parameters went from the start (the scale of both)."""
    train_set, val_set, info = data.load(dataset)
    batches = replay.rank_batches(train_set, rank, world_size, batch_size, steps, device)
    torch.manual_seed(0)
    start = models.build("cnn", info).to(device)
    out = {}
    hooks, out["skipped"] = runnable_hooks()
    finals = {}
    for name in hooks:
        model = train_ddp.wrap(copy.deepcopy(start), device)
        register(model, name)
        optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        sent = []
        for x, y in batches:
            optimizer.zero_grad(set_to_none=True)
            with recorded_all_reduces(lambda t: t.numel() * t.element_size()) as calls:
                F.cross_entropy(model(x), y).backward()  # the hook runs in here
            optimizer.step()
            sent.append(sum(calls))
        finals[name] = [p.detach().clone() for p in model.module.parameters()]
        out[name] = {"bytes_per_step": sent, "val_acc": accuracy(model.module, val_set, device),
                     "max_difference": replay.max_difference(finals[name], finals["allreduce"])}
    out["moved"] = replay.max_difference(finals["allreduce"], list(start.parameters()))
    out["steps"], out["batch_size"], out["lr"] = steps, batch_size, lr
    out["gradient_bytes"] = sum(p.numel() * p.element_size() for p in start.parameters())
    return out


def table(result):
    """One line per hook: bytes all-reduced in the last step, accuracy, distance."""
    plain = result["allreduce"]["bytes_per_step"][-1]
    return runlog.format_table(
        [{"hook": name, "kb": result[name]["bytes_per_step"][-1] / 2**10,
          "share": result[name]["bytes_per_step"][-1] / plain, "acc": result[name]["val_acc"],
          "diff": result[name]["max_difference"]} for name in HOOKS if name in result],
        {"hook": ("hook", ""), "kb": ("KiB a step", ",.1f"), "share": ("of plain", ".1%"),
         "acc": (f"val acc, {result['steps']} steps", ".3f"),
         "diff": ("max |param - plain's|", ".1e")})
