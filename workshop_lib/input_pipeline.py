"""Is a training job input-bound? The course's training step fed three ways, on one device.

A ``DataLoader`` over a dataset in host memory with ``num_workers=0`` (its default) does
all its input work in the training process, between steps: it indexes the dataset sample
by sample, collates the samples into a batch (pinning it when the device is a GPU), and
the step copies it to the device. The course's ``TensorLoader`` copied the dataset to the
device once, so a batch is one indexing operation there. The remedy the DataLoader offers
itself, ``REMEDY_WORKERS`` persistent worker processes building batches beside the step
(pinned for a GPU), is measured as the third feed. The same model and optimizer
take the same number of steps from each, timed in alternating rounds by the bench's own
loop (``bench.solo.interleaved_epochs``, through ``Stopwatch``); what the DataLoader path
loses against the resident one is the time the step spent waiting for its input.
"""
import itertools
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, RandomSampler

from workshop_lib import data, hardware, models, optim, stopwatch
from workshop_lib.bench.solo import interleaved_epochs
from workshop_lib.train import train_step  # the step learners run, timed as it is

STEPS = 16   # steps per timed call: a few seconds for the whole measurement on the CPU profile
ROUNDS = 5   # alternating rounds; the median of each side's is reported
REMEDY_WORKERS = 2  # the remedy's worker processes: the DataLoader's first lever


@dataclass(frozen=True)
class _FixedWork:
    """``interleaved_epochs``' plan: one call per round (no time window to fill)."""
    rounds: int
    window_s: float = 0.0


def host_data_loader(dataset, batch_size, device, seed=0):
    """The plain DataLoader: the samples in host memory, loaded in this process
    (``num_workers=0``), pinned for a fast copy only when the copy goes to a GPU."""
    return DataLoader(dataset, batch_size, shuffle=True, drop_last=True, num_workers=0,
                      pin_memory=torch.device(device).type == "cuda",
                      generator=torch.Generator().manual_seed(seed))


def worker_data_loader(dataset, batch_size, device, seed=0, workers=REMEDY_WORKERS):
    """The DataLoader with its remedies: ``workers`` processes build batches while the step
    runs, kept from one epoch to the next (``persistent_workers``), pinned for a GPU."""
    return DataLoader(dataset, batch_size, shuffle=True, drop_last=True, num_workers=workers,
                      persistent_workers=True,
                      pin_memory=torch.device(device).type == "cuda",
                      generator=torch.Generator().manual_seed(seed))


def measure(model_name, dataset_name, batch_size, device, lr=0.01, steps=STEPS,
            rounds=ROUNDS):
    """samples/s of ``train_step`` fed by ``host_data_loader`` and by the device-resident
    ``TensorLoader``, the same ``steps`` steps (full batches) per round."""
    device = hardware.pick_device(device)
    train_set, _, info = data.load(dataset_name)
    torch.manual_seed(0)
    model = models.build(model_name, info).to(device)
    optimizer = optim.build("sgd", model.parameters(), lr, optim.MOMENTUM, optim.WEIGHT_DECAY)
    return {"model": model_name, "dataset": dataset_name,
            **feeds(model, optimizer, train_set, batch_size, device, steps, rounds)}


def feeds(model, optimizer, train_set, batch_size, device, steps=STEPS, rounds=ROUNDS):
    """``measure`` for a model and optimizer already on ``device`` (a ``torch.device``)."""
    loaders = {
        "resident": data.TensorLoader(
            train_set, batch_size,
            RandomSampler(train_set, generator=torch.Generator().manual_seed(0)), device,
            drop_last=True),
        "data_loader": host_data_loader(train_set, batch_size, device),
        "workers": worker_data_loader(train_set, batch_size, device),
    }

    def feed(loader):
        # One stream of batches across the rounds, epoch after epoch: each epoch's own
        # start (a new order, a new iterator) counts once per epoch, as in training.
        stream = itertools.chain.from_iterable(itertools.repeat(loader))

        def some_steps():
            for x, y in itertools.islice(stream, steps):
                # No-ops for the resident batches; from pinned memory, asynchronous copies.
                train_step(model, optimizer, x.to(device, non_blocking=True),
                           y.to(device, non_blocking=True))
        return some_steps

    model.train()
    timings = interleaved_epochs(_FixedWork(rounds), device,
                                 {name: feed(loader) for name, loader in loaders.items()},
                                 samples_per_epoch=steps * batch_size)
    rates = {name: t["samples"] / stopwatch.summary(t["seconds"])["median"]
             for name, t in timings.items()}
    return {"device": str(device), "batch_size": batch_size, "steps": steps, "rounds": rounds,
            "pin_memory": loaders["data_loader"].pin_memory, "num_workers": 0,
            "remedy_workers": loaders["workers"].num_workers,
            "samples_per_s": rates, "timings": timings}
