"""Train a model on one device: the CPU or one GPU.

train_ddp.py is this same script made data-parallel; `diff train.py train_ddp.py` shows
only the lines DistributedDataParallel needs (notebook 02 goes through them one by one).

    python -m workshop_lib.train --epochs 10 --batch-size 64
    python -m workshop_lib.train --dataset fashion-mnist --model wrn-16-4 --device cuda
"""
import math
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.data import RandomSampler, SequentialSampler
from tqdm import tqdm

from workshop_lib import (
    checkpoint,
    cli,
    data,
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
from workshop_lib.errors import exit_cleanly_on_course_error
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


def prepare_dataloaders(args, train_set, val_set, device):
    if args.data_format == "shards":  # record shards, read rank by rank (notebook 06)
        return shards.loaders(train_set, val_set, args, device, rank=0, world_size=1,
                              val_batch_size=data.VAL_BATCH_SIZE)
    train_sampler = RandomSampler(train_set, generator=torch.Generator().manual_seed(args.seed))
    val_sampler = SequentialSampler(val_set)
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
        with saved.counting(i == 0):
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


def fit(args, device):
    threads = hardware.configure_cpu_threads(device)

    train_set, val_set, info, model = load_train_objs(args, device)
    train_sampler, train_loader, val_loader = prepare_dataloaders(args, train_set, val_set, device)

    world_size = 1
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
    if args.resume:
        start_epoch = 1 + checkpoint.resume(args.out / "checkpoint.pt", model, optimizer,
                                            scheduler, precision)
    train_loader = faults.inject(train_loader, args.inject_fault, 0, world_size,
                                 args.epochs, steps_done=(start_epoch - 1) * len(train_loader))

    # One write per line (end="" with the newline inside), so that lines from processes
    # sharing a terminal never run into each other.
    print(f"[{device}] samples={len(train_sampler)} steps={steps_per_epoch} "
          f"threads={threads}\n", end="", flush=True)
    log = runlog.RunLog(args.out, append=start_epoch > 1)
    log.start("train", args, dataset=info.name, model=args.model,
              parameters=models.count_parameters(model), device=str(device),
              backend=None, world_size=world_size, batch_size=args.batch_size,
              global_batch_size=global_batch_size, steps_per_epoch=steps_per_epoch, lr=lr,
              warmup_steps=warmup_steps, accumulate=args.accumulate, amp=args.amp,
              threads_per_process=threads, start_epoch=start_epoch,
              channels_last=memory_format(args, device) == torch.channels_last)

    start = time.perf_counter()
    stop = metrics.TargetAccuracy(args.target_accuracy, args.patience)
    stop_reason, record = f"{args.epochs} epochs done", None
    for epoch in range(start_epoch, args.epochs + 1):
        lr_now = optimizer.param_groups[0]["lr"]
        # The same permutation for the same (seed, epoch): a resumed run sees the same data.
        train_sampler.generator.manual_seed(args.seed + epoch)
        memory.reset_peak(device)
        with Stopwatch(device) as epoch_clock:  # training only: evaluation is not timed
            train_sums, saved_bytes = train_epoch(model, train_loader, optimizer, scheduler,
                                                  precision, args.accumulate, args.progress)
        epoch_s = epoch_clock.seconds
        peak_mib = memory.peak_mib(device)  # training's own: evaluation's batches are larger
        val_sums = evaluate(model, val_loader)

        record = metrics.epoch_record(epoch, train_sums, val_sums, lr_now, world_size,
                                      global_batch_size, epoch_s, time.perf_counter() - start,
                                      saved_activation_bytes=saved_bytes,
                                      peak_memory_mib=peak_mib)
        log.epoch(record)
        checkpoint.save_atomic(checkpoint.training_state(model, optimizer, scheduler, epoch,
                                                          None, precision),
                               args.out / "checkpoint.pt")
        if stop.reached(record["val_acc"]):
            stop_reason = stop.reason()
            break

    log.end(stop_reason, record, time.perf_counter() - start)


def parse_args(argv=None):
    parser = cli.ArgumentParser(prog="python -m workshop_lib.train", description=__doc__)
    cli.add_common_args(parser, default_out="runs/train")
    args = parser.parse_args(argv)
    cli.check_args(args)
    return args


@exit_cleanly_on_course_error
def main(argv=None):
    args = parse_args(argv)
    device = hardware.pick_device(args.device)
    cli.prepare_out_dir(args.out)
    fit(args, device)


if __name__ == "__main__":
    main()
