"""samples/s against the batch per device: the knee past which a larger batch stops paying.

A training step has a cost that does not grow with its batch (the host's Python, the
optimizer's pass over every parameter, and on a GPU the launch of each of a few hundred
kernels) and one that does (the arithmetic). While the fixed part sets the pace, doubling
the batch costs little more time and nearly doubles samples/s: on a GPU the device finishes
each kernel before the host has issued the next and sits idle between them (a
*launch-bound* step; the trace of ``python -m workshop_lib.trace`` counts that idle time).
Past the knee the arithmetic sets the pace: a doubled batch takes about twice as long, and
samples/s stays where it is. The knee is the smallest batch per device that trains about
as fast per sample as any larger one: on a GPU, the batch that fills it.

``measure`` times the course's own ``train_step`` at each batch with the batches already
on the device (so no input pipeline stands in the way), in interleaved rounds (one slow
moment of the machine does not fall on one batch alone), through ``Stopwatch``; each
batch's figure is the median of its rounds. On a GPU a batch that does not fit ends the
curve there, and the result says so.
"""
import torch

from workshop_lib import data, hardware, models, optim, stopwatch
from workshop_lib.precision import PLAIN
from workshop_lib.stopwatch import Stopwatch
from workshop_lib.train import train_step  # the step learners run, timed as it is

STEPS = 8    # timed steps per batch and round
ROUNDS = 3   # interleaved rounds; each batch's median is kept
WARMUP = 2   # untimed steps per batch first: cuDNN picks its kernels, the allocator grows
DOUBLINGS = 3  # the curve spans the profile's batch halved and doubled this many times


def batches_around(batch_size, doublings=DOUBLINGS):
    """The batches per device to measure: ``batch_size`` halved ``doublings`` times, then
    doubled as often (the smallest at least 1)."""
    smallest = max(1, batch_size // 2**doublings)
    return [smallest * 2**i for i in range(2 * doublings + 1)]


def measure(model_name, dataset_name, device, batches, lr=0.01, channels_last=False,
            steps=STEPS, rounds=ROUNDS):
    """samples/s and the step's milliseconds of ``train_step`` at each of ``batches`` (per
    device), the same model and optimizer throughout; ``{"samples_per_s": {batch: rate},
    "step_ms": {batch: ms}, "out_of_memory_at": batch or None, ...}``."""
    device = hardware.pick_device(device)
    train_set, _, info = data.load(dataset_name)
    layout = hardware.memory_format(device, channels_last)  # as the training scripts' own
    torch.manual_seed(0)
    model = models.build(model_name, info).to(device, memory_format=layout)
    optimizer = optim.build("sgd", model.parameters(), lr, optim.MOMENTUM, optim.WEIGHT_DECAY)
    return {"model": model_name, "dataset": dataset_name,
            "channels_last": layout == torch.channels_last,
            **curve(model, optimizer, train_set, device, batches, layout, steps, rounds)}


def curve(model, optimizer, train_set, device, batches, layout=torch.contiguous_format,
          steps=STEPS, rounds=ROUNDS, precision=PLAIN):
    """``measure`` for a model and optimizer already on ``device`` (a ``torch.device``), the
    images in ``layout``, the step in ``precision``."""
    model.train()
    images, labels = train_set.tensors
    generator = torch.Generator().manual_seed(0)

    def batches_of(batch):  # cut outside the clock, already on the device
        picks = torch.randint(len(labels), (steps, batch), generator=generator)
        return [(images[p].to(device).contiguous(memory_format=layout), labels[p].to(device))
                for p in picks]

    def run(work):
        for x, y in work:
            train_step(model, optimizer, x, y, precision)

    work, out_of_memory_at = {}, None
    for batch in sorted(batches):
        try:
            work[batch] = batches_of(batch)
            run(work[batch][:WARMUP])
            hardware.synchronize(device)
        except torch.OutOfMemoryError:  # the curve ends at the largest batch that fits
            work.pop(batch, None)
            optimizer.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            out_of_memory_at = batch
            break
    seconds = {batch: [] for batch in work}
    order = list(work)
    for r in range(rounds):
        for batch in order[r % len(order):] + order[:r % len(order)]:
            with Stopwatch(device) as watch:
                run(work[batch])
            seconds[batch].append(watch.seconds)
    median = {batch: stopwatch.summary(s)["median"] for batch, s in seconds.items()}
    return {"device": str(device), "steps": steps, "rounds": rounds,
            "out_of_memory_at": out_of_memory_at,
            "samples_per_s": {batch: batch * steps / s for batch, s in median.items()},
            "step_ms": {batch: 1000 * s / steps for batch, s in median.items()}}
