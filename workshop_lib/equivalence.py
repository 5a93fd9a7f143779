"""Is N processes x batch b the same as one process with batch N x b? Do k micro-batches
give one k-times larger batch's step? (notebooks 03 and 05)

DDP averages the gradients of the ranks' batches, which is the gradient of the global
batch, so the same steps follow, with one exception: BatchNorm. A BatchNorm layer
normalises with the statistics of the batch it sees, and under DDP each rank sees only
its own b samples. So a model with BatchNorm trains differently on N ranks than on one
process with the global batch, unless its layers are SyncBatchNorm, which computes the
statistics over all ranks (CUDA only). Measured here, in one torchrun launch: K steps of
DDP on each rank's batch against K steps of one process (rank 0) on the ranks' batches put
together, for the course CNN without BatchNorm, with it, and (on GPUs) with SyncBatchNorm.
And gradient accumulation as the training scripts do it (``--accumulate``): k micro-batches
with ``no_sync()`` for all but the last, against one step on their union, counting the
gradient all-reduces each way, on the CNN without BatchNorm (``ACCUMULATION_MODEL``): with
BatchNorm each micro-batch is normalised with its own statistics, so the two differ.

    torchrun --standalone --nproc-per-node=2 -m workshop_lib.equivalence --out eq.json
"""
import contextlib
import copy
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler

from workshop_lib import cli, data, distributed, hardware, models
from workshop_lib.errors import CourseError, exit_cleanly_on_course_error, record_errors

STEPS, LR = 10, 0.05
# BatchNorm normalises each micro-batch by itself: accumulation equals the larger batch only
# without it, so that is the model its comparison runs (and says it ran).
ACCUMULATION_MODEL = "bn_free"


def make_model(info, variant, device):
    """The course CNN (narrow): "bn_free", "batchnorm", or "sync_batchnorm"."""
    return twins(info, variant, device)[0]


def twins(info, variant, device):
    """The model DDP trains, and its twin for the single process: the same weights, with
    plain BatchNorm where the first has SyncBatchNorm. The twin is copied before the
    conversion, because there is no way back: PyTorch has ``convert_sync_batchnorm`` and
    no reverse (none in torch 2.14), and a SyncBatchNorm layer in a process group whose
    inputs are not on a GPU raises in forward."""
    torch.manual_seed(0)
    model = models.SmallCNN(info.in_channels, info.num_classes, width=16,
                            batch_norm=variant != "bn_free")
    single = copy.deepcopy(model)
    if variant == "sync_batchnorm":
        # convert_sync_batchnorm reuses the BatchNorm layers' parameters and buffers, so
        # the twin above must be a copy, not the same modules.
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return model.to(device), single.to(device)


def batches(train_set, rank, world_size, batch_size, device):
    """This rank's batches, and (for the single process) every rank's, step by step."""
    x, y = train_set.tensors
    per_rank = []
    for r in range(world_size):
        order = list(DistributedSampler(train_set, world_size, r, seed=0))
        per_rank.append([torch.tensor(order[s * batch_size:(s + 1) * batch_size])
                         for s in range(STEPS)])
    mine = [(x[i].to(device), y[i].to(device)) for i in per_rank[rank]]
    union = [(x[torch.cat(step)].to(device), y[torch.cat(step)].to(device))
             for step in zip(*per_rank, strict=True)]
    return mine, union


def train(model, steps):
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    for x, y in steps:
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    return model


def compare(variant, info, mine, union, device):
    """Largest parameter difference after STEPS steps, DDP against one process, as a
    tensor on the device (rank 0; zero on the others)."""
    model, single = twins(info, variant, device)
    distributed_model = train(DDP(model, device_ids=[device] if device.type == "cuda"
                                  else None), mine).module
    difference = torch.zeros((), device=device)
    if dist.get_rank() == 0:
        single = train(single, union)
        difference = largest_difference(distributed_model.parameters(), single.parameters())
    return difference


def largest_difference(parameters, others):
    """The largest absolute difference between two models' parameters, on the device."""
    return torch.stack([(a - b).abs().max()
                        for a, b in zip(parameters, others, strict=True)]).max()


def accumulation(info, mine, device, micro_batches=4):
    """One optimizer step over ``micro_batches`` micro-batches with the training script's
    own loop (``no_sync`` for all but the last) against one step on their union: the
    parameters' largest difference, and the gradient all-reduces each way took."""
    from workshop_lib import train, train_ddp
    from workshop_lib.precision import PLAIN

    x = torch.cat([xb for xb, _ in mine[:micro_batches]])
    y = torch.cat([yb for _, yb in mine[:micro_batches]])
    results, calls = {}, {}
    # The DDP script's loop (no_sync), the single-device script's loop run on the DDP
    # model (an all-reduce after every micro-batch), and one batch of them all.
    loops = (("accumulated", train_ddp.train_epoch, len(x) // micro_batches),
             ("accumulated_without_no_sync", train.train_epoch, len(x) // micro_batches),
             ("one_batch", train_ddp.train_epoch, len(x)))
    for name, train_epoch, batch in loops:
        model = train_ddp.wrap(make_model(info, ACCUMULATION_MODEL, device), device)
        calls[name] = []
        model.register_comm_hook(None, lambda state, bucket, seen=calls[name]: (
            seen.append(1), default_hooks.allreduce_hook(state, bucket))[1])
        optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
        loader = data.TensorLoader(torch.utils.data.TensorDataset(x, y), batch,
                                   range(len(x)), device)
        train_epoch(model, loader, optimizer, torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: 1.0), PLAIN, micro_batches if batch < len(x) else 1,
            progress=False)
        results[name] = list(model.module.parameters())
    difference = torch.stack([largest_difference(results[name], results["one_batch"])
                              for name in results]).max()
    return {"micro_batches": micro_batches, "model": ACCUMULATION_MODEL,
            "max_abs_difference": difference,
            "all_reduces": {name: len(seen) for name, seen in calls.items()}}


@contextlib.contextmanager
def full_float32():
    """TF32 off for matmuls and cuDNN convolutions, and cuDNN's deterministic algorithms
    without autotuning, as they were afterwards: where a verdict says "the same", the
    mechanism, not the GPU's arithmetic, decides it.

    With TF32 a GPU rounds the inputs of float32 matmuls and convolutions to 10 mantissa
    bits, and cuDNN may pick different algorithms for a rank's batch of b and the single
    process's N x b (or for one run and the next, when it autotunes): differences of about
    1e-3 that say nothing about DDP, against the comparisons' 1e-5. (No effect on the CPU.)"""
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    saved = matmul.allow_tf32, cudnn.allow_tf32, cudnn.deterministic, cudnn.benchmark
    matmul.allow_tf32 = cudnn.allow_tf32 = cudnn.benchmark = False
    cudnn.deterministic = True
    try:
        yield
    finally:
        matmul.allow_tf32, cudnn.allow_tf32, cudnn.deterministic, cudnn.benchmark = saved


@full_float32()
def measure(batch_size, device):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    train_set, _, info = data.load("digits")
    mine, union = batches(train_set, rank, world_size, batch_size, device)
    variants = ["bn_free", "batchnorm"] + (["sync_batchnorm"] if device.type == "cuda" else [])
    differences = {v: compare(v, info, mine, union, device) for v in variants}
    accumulated = accumulation(info, mine, device)
    # The numbers leave the device here, once, after all the work on it.
    return {"world_size": world_size, "batch_size": batch_size, "steps": STEPS,
            "device": str(device),
            "tf32": torch.backends.cuda.matmul.allow_tf32 or torch.backends.cudnn.allow_tf32,
            "max_abs_difference": {v: d.item() for v, d in differences.items()},
            "accumulation": {**accumulated,
                             "max_abs_difference": accumulated["max_abs_difference"].item()}}


@record_errors
@exit_cleanly_on_course_error
def main(argv=None):
    parser = cli.ArgumentParser(prog="torchrun ... -m workshop_lib.equivalence",
                                description=__doc__)
    parser.add_argument("--batch-size", type=int, default=16, help="per process")
    parser.add_argument("--device", default="auto", type=hardware.device_flag)
    parser.add_argument("--out", help="write the result as JSON to this file (rank 0)")
    args = parser.parse_args(argv)
    if "LOCAL_RANK" not in os.environ:
        raise CourseError("equivalence runs under torchrun: torchrun --standalone "
                          "--nproc-per-node=2 -m workshop_lib.equivalence")
    local_rank, local_world_size = int(os.environ["LOCAL_RANK"]), \
        int(os.environ["LOCAL_WORLD_SIZE"])
    device = hardware.pick_device(args.device, local_rank, local_world_size)
    hardware.configure_cpu_threads(device)
    with distributed.process_group(hardware.backend_for(device), device=device):
        result = measure(args.batch_size, device)
        if dist.get_rank() == 0:
            print(json.dumps(result, indent=1))
            if args.out:
                with open(args.out, "w") as f:
                    json.dump(result, f)


if __name__ == "__main__":
    main()
