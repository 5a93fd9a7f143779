"""The workshop profile: sizes for the notebooks, picked from the hardware.

Both hardware cases are first-class. ``gpu``: NCCL, one process per GPU, the workshop
dataset and a Wide ResNet. ``cpu``: gloo, two processes sharing the cores, the offline
dataset and the small CNN, sized so each notebook runs in a few minutes on two cores
while still showing every effect it teaches. Notebooks take ``profile`` as a papermill
parameter (``auto`` by default) and read every size from here.
"""
from dataclasses import dataclass

import torch

from workshop_lib import data, hardware

PROFILES = ("auto", "gpu", "cpu")


@dataclass(frozen=True)
class Profile:
    name: str
    nproc: int                # processes per machine for torchrun
    backend: str
    dataset: str
    model: str
    epochs: int               # epochs of a standard training run
    batch_size: int           # per-process batch of a standard run
    lr: float                 # learning rate tuned at ``lr_ref_batch``
    lr_ref_batch: int

    def describe(self):
        return (f"profile {self.name}: {self.nproc} process(es), {self.backend}, "
                f"dataset {self.dataset}, model {self.model}, {self.epochs} epochs, "
                f"batch {self.batch_size} per process")


def get_profile(name="auto", dataset="auto", nproc="auto", data_dir=data.DEFAULT_DATA_DIR):
    """The profile ``name`` (auto: gpu if a GPU is visible), with overrides."""
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; choose one of {PROFILES}")
    if name == "auto":
        name = "gpu" if torch.cuda.is_available() else "cpu"
    dataset = data.resolve_name(dataset, data_dir)
    if name == "gpu":
        profile = Profile("gpu", torch.cuda.device_count(), "nccl", dataset, "wrn-16-4",
                          epochs=10, batch_size=128, lr=0.05, lr_ref_batch=128)
    else:
        profile = Profile("cpu", hardware.CPU_PROCESSES, "gloo", dataset, "cnn",
                          epochs=6, batch_size=32, lr=0.05, lr_ref_batch=32)
    if nproc != "auto":
        profile = Profile(**{**profile.__dict__, "nproc": int(nproc)})
    return profile
