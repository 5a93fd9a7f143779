"""Train a model data-parallel: one process per GPU (or per CPU share), launched by torchrun.

This is train.py plus the steps DistributedDataParallel needs, and nothing else;
`diff train.py train_ddp.py` shows them (notebook 02 goes through them one by one).

    torchrun --standalone --nproc-per-node=2 -m workshop_lib.train_ddp --epochs 10
    torchrun --standalone --nproc-per-node=gpu -m workshop_lib.train_ddp --model wrn-16-10
"""
import contextlib
import math
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler
from tqdm import tqdm

from workshop_lib import (
    checkpoint,
    cli,
    data,
    ddp_compat,
    distributed,
    faults,
    hardware,
    memory,
    metrics,
    models,
    optim,
    runlog,
    scaling,
    shards,
)
from workshop_lib.errors import CourseError, exit_cleanly_on_course_error, record_errors
from workshop_lib.precision import PLAIN, Precision
from workshop_lib.stopwatch import Stopwatch


def load_train_objs(args, device):
    train_set, val_set, info = data.load(args.dataset, args.data_dir, args.data_format)
    torch.manual_seed(args.seed)
    model = models.build(args.model, info, args.grad_checkpointing)
    model = model.to(device, memory_format=memory_format(args, device))
    return train_set, val_set, info, model


def memory_format(args, device):
    """channels_last where asked (the layout Tensor Cores' convolutions read fastest), and on
    a CPU that reads it fastest too (oneDNN's): hardware.memory_format."""
    return hardware.memory_format(device, args.channels_last)


def wrap(model, device, process_group=None):
    """DDP broadcasts rank 0's parameters now, then all-reduces gradients in backward().

    ``process_group``: the ranks that train this model (default: all). The bench wraps its
    smaller worlds' models here too, so that it times the DDP set-up this script uses.
    """
    # forward_sync_buffers=False: no re-broadcast of BatchNorm buffers before every forward
    # (training uses batch statistics; fit() syncs the buffers before evaluating). Measured
    # 1.15x faster steps on 2 CPU ranks (python -m workshop_lib.bench, BENCHMARKS.md).
    # ddp_compat names it as the installed torch does (broadcast_buffers before 2.13).
    return DDP(model, device_ids=[device] if device.type == "cuda" else None,
               process_group=process_group, **ddp_compat.buffer_sync(False))


def prepare_dataloaders(args, train_set, val_set, device, rank, world_size):
    # Each rank draws a disjoint 1/world_size of a permutation that all ranks agree on.
    if args.data_format == "shards":  # record shards, read rank by rank (notebook 06)
        return shards.loaders(train_set, val_set, args, device, rank, world_size,
                              data.VAL_BATCH_SIZE)
    train_sampler = DistributedSampler(train_set, world_size, rank, shuffle=True, seed=args.seed)
    # Validation shards without DistributedSampler's padding, so the counts are exact.
    val_sampler = data.ShardSampler(val_set, rank, world_size)
    train_loader = data.TensorLoader(train_set, args.batch_size, train_sampler, device,
                                     memory_format=memory_format(args, device))
    val_loader = data.TensorLoader(val_set, data.VAL_BATCH_SIZE, val_sampler, device,
                                   memory_format=memory_format(args, device))
    return train_sampler, train_loader, val_loader


def backward(model, x, y, precision, accumulate=1):
    """Forward and backward of one (micro-)batch, gradients added to .grad. Returns its
    mean loss, on the device."""
    with precision.autocast():
        loss = F.cross_entropy(model(x), y)
    # Each of `accumulate` micro-batches adds its share: together, the mean over all.
    precision.backward(loss / accumulate)
    return loss.detach()


def train_step(model, optimizer, x, y, precision=PLAIN):
    """One optimizer step on the batch (x, y). Returns its mean loss, on the device."""
    loss = backward(model, x, y, precision)
    precision.step(optimizer)
    optimizer.zero_grad(set_to_none=True)
    return loss


def train_epoch(model, loader, optimizer, scheduler, precision, accumulate, progress):
    """One pass over the loader, one optimizer step per `accumulate` batches. Returns
    [sum of losses, samples] as a tensor on the device, and the bytes the first batch
    saved for backward."""
    model.train()
    loss_sum, samples = torch.zeros((), device=next(model.parameters()).device), 0
    saved = memory.SavedForBackward(model)  # what the first batch keeps for backward
    # On stdout: a notebook shows stderr as an error band, and this is no error.
    batches = tqdm(loader, disable=not progress, leave=False, mininterval=1, unit="batch",
                   file=sys.stdout)
    for i, (x, y) in enumerate(batches):
        last = (i + 1) % accumulate == 0 or i + 1 == len(loader)  # the group's last batch
        # Only the group's last backward all-reduces the summed gradients: no_sync()
        # skips the all-reduce in the others, one all-reduce per optimizer step.
        sync = contextlib.nullcontext() if last else model.no_sync()
        with saved.counting(i == 0), sync:
            loss = backward(model, x, y, precision, accumulate)
        if last:
            stepped = precision.step(optimizer)  # False: fp16 skipped an overflowed step
            optimizer.zero_grad(set_to_none=True)
            if stepped:
                scheduler.step()
        # Sum on the device, count on the host: loss.item() or building a tensor from a
        # Python number here would make every step wait for the GPU (a host-device sync).
        loss_sum += loss * len(y)
        samples += len(y)
    return torch.stack([loss_sum, torch.tensor(float(samples), device=loss_sum.device)]), \
        saved.bytes


@torch.no_grad()
def evaluate(model, loader):
    """Returns [sum of losses, correct predictions, samples] as a tensor on the device."""
    model.eval()
    sums, samples = torch.zeros(2, device=next(model.parameters()).device), 0
    for x, y in loader:
        logits = model(x)
        sums += torch.stack([F.cross_entropy(logits, y, reduction="sum"),
                             (logits.argmax(dim=1) == y).sum()])
        samples += len(y)
    return torch.cat([sums, torch.tensor([float(samples)], device=sums.device)])


def fit(args, device, rank, world_size):
    is_rank0 = rank == 0  # the one process that writes files and prints the table
    threads = hardware.configure_cpu_threads(device)

    train_set, val_set, info, model = load_train_objs(args, device)
    model = wrap(model, device)
    train_sampler, train_loader, val_loader = prepare_dataloaders(
        args, train_set, val_set, device, rank, world_size)

    # An optimizer step takes `accumulate` batches: the learning-rate rules see all of them.
    global_batch_size = args.batch_size * args.accumulate * world_size
    steps_per_epoch = math.ceil(len(train_loader) / args.accumulate)
    lr = scaling.scaled_lr(args.lr, args.lr_scaling, global_batch_size, args.lr_ref_batch)
    warmup_steps = round(args.warmup_epochs * steps_per_epoch)
    warmup_from = scaling.warmup_start(args.warmup_from, args.lr, lr)
    optimizer = optim.build(args.optimizer, model.parameters(), lr, args.momentum,
                            args.weight_decay)
    precision = Precision(args.amp, device)
    total_steps = args.epochs * steps_per_epoch
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: scaling.lr_factor(step, warmup_steps, total_steps, args.schedule,
                                                  warmup_from))
    start_epoch = 1
    # After an elastic restart (torchrun --max-restarts), continue from this job's last
    # checkpoint; one that an earlier run left in --out is not this job's to load.
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    job = distributed.job_id()
    if args.resume or (restarted and checkpoint.from_job(args.out / "checkpoint.pt", job,
                                                         say=is_rank0)):
        start_epoch = 1 + checkpoint.resume(args.out / "checkpoint.pt", model.module, optimizer,
                                            scheduler, precision)
    train_loader = faults.inject(train_loader, args.inject_fault, rank, world_size,
                                 args.epochs, steps_done=(start_epoch - 1) * len(train_loader))

    # One write per line (end="" with the newline inside), so that lines from processes
    # sharing a terminal never run into each other.
    print(f"[rank {rank}/{world_size}] {device} samples={len(train_sampler)} "
          f"steps={steps_per_epoch} threads={threads}\n", end="", flush=True)
    log = runlog.RunLog(args.out, enabled=is_rank0, append=start_epoch > 1)
    log.start("train_ddp", args, dataset=info.name, model=args.model,
              parameters=models.count_parameters(model), device=str(device),
              backend=dist.get_backend(), world_size=world_size, batch_size=args.batch_size,
              global_batch_size=global_batch_size, steps_per_epoch=steps_per_epoch, lr=lr,
              warmup_steps=warmup_steps, accumulate=args.accumulate, amp=args.amp,
              threads_per_process=threads, start_epoch=start_epoch,
              channels_last=memory_format(args, device) == torch.channels_last,
              nodes=int(os.environ.get("GROUP_WORLD_SIZE", 1)))  # torchrun agents in the job

    start = time.perf_counter()
    stop = metrics.TargetAccuracy(args.target_accuracy, args.patience)
    stop_reason, record = f"{args.epochs} epochs done", None
    for epoch in range(start_epoch, args.epochs + 1):
        lr_now = optimizer.param_groups[0]["lr"]
        # A new permutation each epoch; without this every epoch repeats epoch 0's order.
        train_sampler.set_epoch(epoch)
        memory.reset_peak(device)
        with Stopwatch(device) as epoch_clock:  # training only: evaluation is not timed
            train_sums, saved_bytes = train_epoch(model, train_loader, optimizer, scheduler,
                                                  precision, args.accumulate,
                                                  args.progress and is_rank0)
        epoch_s = epoch_clock.seconds
        peak_mib = memory.peak_mib(device)  # training's own: evaluation's batches are larger
        # BatchNorm running statistics are buffers each rank updates from its own batches:
        # give every rank rank 0's, so all evaluate (and rank 0 saves) the same model.
        for buffer in model.module.buffers():
            dist.broadcast(buffer, src=0)
        val_sums = evaluate(model.module, val_loader)
        # Sum the per-rank sums: every rank now holds the global metrics.
        dist.all_reduce(train_sums)
        dist.all_reduce(val_sums)

        record = metrics.epoch_record(epoch, train_sums, val_sums, lr_now, world_size,
                                      global_batch_size, epoch_s, time.perf_counter() - start,
                                      saved_activation_bytes=saved_bytes,
                                      peak_memory_mib=peak_mib)
        log.epoch(record)
        if is_rank0:  # the unwrapped model's state loads without DDP
            checkpoint.save_atomic(
                checkpoint.training_state(model.module, optimizer, scheduler, epoch, job,
                                          precision),
                args.out / "checkpoint.pt")
        if stop.reached(record["val_acc"]):
            stop_reason = stop.reason()
            break

    log.end(stop_reason, record, time.perf_counter() - start)


def torchrun_env():
    """The rank layout torchrun gives each process in its environment."""
    if "RANK" not in os.environ:
        raise CourseError("train_ddp runs under torchrun: torchrun --standalone "
                          "--nproc-per-node=2 -m workshop_lib.train_ddp [flags]")
    return (int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]),
            int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_WORLD_SIZE"]))


def parse_args(argv=None):
    parser = cli.ArgumentParser(prog="torchrun ... -m workshop_lib.train_ddp", description=__doc__)
    cli.add_common_args(parser, default_out="runs/train_ddp")
    parser.add_argument("--dist-timeout", type=float, default=300,
                        help="seconds a collective may wait for the other ranks before "
                             "failing (default: %(default)s)")
    args = parser.parse_args(argv)
    cli.check_args(args)
    return args


@record_errors  # a crashing rank's error goes to torchrun's error file and summary
@exit_cleanly_on_course_error
def main(argv=None):
    args = parse_args(argv)
    rank, local_rank, world_size, local_world_size = torchrun_env()
    device = hardware.pick_device(args.device, local_rank, local_world_size)
    if rank == 0:
        cli.prepare_out_dir(args.out)
    if device.type == "cuda":  # this rank's GPU becomes its current one, which NCCL uses
        torch.cuda.set_device(device)
    dist.init_process_group(hardware.backend_for(device),
                            timeout=timedelta(seconds=args.dist_timeout),
                            device_id=device if device.type == "cuda" else None)
    try:
        fit(args, device, rank, world_size)
    except BaseException as error:
        # No teardown on the error path: the other ranks wait in a collective for this one,
        # and NCCL's destroy, or even its abort, can wait for them, so the error would
        # never reach torchrun. Report the error and end this process at once: torchrun
        # sees it exit and stops the others (with gloo their collectives may fail sooner,
        # on the closed connections; with NCCL they wait until then). See distributed.py.
        distributed.exit_at_once(error)
    dist.destroy_process_group()  # every rank finished: leave the group together


if __name__ == "__main__":
    main()
