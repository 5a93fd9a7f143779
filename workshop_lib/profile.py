"""The workshop profile: where each kind of run goes, and its sizes, from the machine.

Every notebook starts with ``P = notebook.setup(profile, dataset, nproc, runs_dir)``,
and every size it uses comes from ``P``. The choices, from ``hardware.Machine``:

- **one-device runs** (the sweeps of notebooks 01 and 03) use a GPU where PyTorch sees one
  (profile ``gpu``), else the CPU (profile ``cpu``);
- **DDP launches** (notebooks 00, 02, 04) run one process per GPU with NCCL on a machine
  with two or more GPUs, and two processes sharing the CPU with gloo everywhere else: on
  one GPU too, because NCCL cannot run two ranks on one GPU;
- ``profile="cpu"`` puts every run on the CPU, GPUs or not;
- **sizes follow the dataset and the device actually used**: a Wide ResNet for
  Fashion-MNIST on GPUs, the small CNN otherwise; ``dataset="auto"`` takes Fashion-MNIST
  when it is downloaded and the runs go to a GPU, the offline digits otherwise.

``notes`` says, in sentences, every choice that differs from what a learner might expect.
"""
import math
from dataclasses import dataclass

from workshop_lib import data, hardware
from workshop_lib.errors import CourseError

PROFILES = ("auto", "gpu", "cpu")
ONE_DEVICE, PROCESSES = "one device", "processes"  # what a notebook's runs are


@dataclass(frozen=True)
class Sizes:
    model: str
    epochs: int        # epochs of a standard training run
    batch_size: int    # per-process batch of a standard run
    lr: float          # learning rate tuned at ``lr_ref_batch``
    lr_ref_batch: int
    hot_factor: float  # notebook 03's too-hot base rate, this many times ``lr``


# Sizes by (device type, dataset). Digits are the same on any device: the dataset, not the
# hardware, decides how large a batch can be (1,438 training images). The digits' rate,
# 0.01 at batch 32, reaches 99% at batch 32 (as 0.05 does), and is one at which the
# batch-size effects of notebooks 01 and 03 show once the largest batch gets 100 steps:
# measured at 34 epochs, batch 512 ends at 0.961 with it against 0.994 for batch 32,
# where at 0.05 both end at 0.99 and only the training loss shows the larger batch's
# fewer steps.
#
# hot_factor: notebook 03's section 2 starts from a base rate this many times ``lr``: still
# fine at the small batch, so that the linear rule's k-times rate is what breaks at the
# large one. Every profile's hot rate is 0.2 at the reference batch. Digits: 20x its 0.01,
# measured in the CPU profile (notebook 03, seed 0, 34 epochs): 0.2 at batch 32 ends at
# 0.997 (0.01: 0.994), scaled linearly to 3.2 at batch 512 at 0.978, 1.9 pp below, and
# warmup wins back 86% of that. Fashion-MNIST: 4x its 0.05, chosen by reading, not yet
# measured on GPUs: Wide ResNets train at 0.1 at batch 128 (Zagoruyko and
# Komodakis 2016), so 0.2 is hot but stable there, and its linear scaling to batch 2048,
# 3.2, is four times the per-sample rate for which Goyal et al. needed warmup (0.1 per
# 256). Digits' 20x would start the Wide ResNet at 1.0 with momentum 0.9, likely too hot for
# its small batch already. Notebook 03's findings judge it (hot_small, linear_breaks).
#
# The GPU profile's epochs (6): a standard Wide ResNet run, and a sweep gets more where its
# largest batch needs them for MIN_SWEEP_STEPS. ``make gpu-check``'s budget prices every
# notebook's plan with these sizes on 4 A100s (gpu_check/budget.py); training is about a
# fifth of its estimate. Notebook 03's warmup variants warm up for a tenth of their run
# (plans.WARMUP_SHARE): 0.6 of the GPU profile's 6 epochs, 3.4 of the CPU profile's 34.
MIN_SWEEP_STEPS = 100  # optimizer steps the largest batch of a sweep gets at least
SIZES = {
    ("cpu", "digits"): Sizes("cnn", epochs=6, batch_size=32, lr=0.01, lr_ref_batch=32,
                             hot_factor=20),
    ("cuda", "digits"): Sizes("cnn", epochs=6, batch_size=32, lr=0.01, lr_ref_batch=32,
                              hot_factor=20),
    ("cpu", "fashion-mnist"): Sizes("cnn", epochs=3, batch_size=64, lr=0.05, lr_ref_batch=64,
                                    hot_factor=4),
    ("cuda", "fashion-mnist"): Sizes("wrn-16-4", epochs=6, batch_size=128, lr=0.05,
                                     lr_ref_batch=128, hot_factor=4),
}


@dataclass(frozen=True)
class Profile:
    name: str          # "gpu" or "cpu": where one-device runs go
    launches: str      # ONE_DEVICE or PROCESSES: the runs the sizes below are for
    device: str        # --device of those runs
    nproc: int         # processes of a DDP launch (torchrun --nproc-per-node)
    ddp_device: str    # --device of a DDP launch
    backend: str       # the backend of a DDP launch
    dataset: str
    model: str
    epochs: int
    batch_size: int
    lr: float
    lr_ref_batch: int
    hot_factor: float
    notes: tuple = ()

    def sweep_epochs(self, batch_scale):
        """Epochs of a batch-size sweep up to ``batch_scale`` x the reference batch: the
        profile's epochs, or more, so that the largest batch gets MIN_SWEEP_STEPS steps."""
        largest = self.lr_ref_batch * batch_scale
        steps_per_epoch = math.ceil(data.DATASETS[self.dataset].train_size / largest)
        return max(self.epochs, math.ceil(MIN_SWEEP_STEPS / steps_per_epoch))

    def describe(self):
        where = "GPUs, NCCL" if self.ddp_device == "cuda" else "the CPU, gloo"
        lines = [f"profile {self.name}: one-device runs on {self.one_device_name}; DDP "
                 f"launches: {self.nproc} process(es) on {where}",
                 f"{self.launches} runs here: dataset {self.dataset}, model {self.model}, "
                 f"{self.epochs} epochs, batch {self.batch_size} per process, lr {self.lr} "
                 f"at batch {self.lr_ref_batch}, --device {self.device}"]
        return "\n".join(lines + [f"note: {note}" for note in self.notes])

    @property
    def one_device_name(self):
        return "a GPU" if self.name == "gpu" else "the CPU"


def get_profile(name="auto", dataset="auto", nproc="auto", launches=ONE_DEVICE,
                machine=None, data_dir=data.DEFAULT_DATA_DIR):
    """The profile for this machine (or ``machine``), with the notebook's overrides.

    ``launches``: ONE_DEVICE for a notebook about one device's runs, PROCESSES for one
    about DDP launches; the sizes are those of that kind of run.
    """
    if name not in PROFILES:
        raise CourseError(f"unknown profile {name!r}; choose one of {', '.join(PROFILES)}")
    if launches not in (ONE_DEVICE, PROCESSES):
        raise ValueError(f"launches is {ONE_DEVICE!r} or {PROCESSES!r}, got {launches!r}")
    machine = machine or hardware.detect()
    notes = [problem for problem in (machine.unserved_gpus_problem(),
                                     machine.unusable_gpus_problem()) if problem]
    if name == "auto":
        name = "gpu" if machine.gpus else "cpu"
    if name == "gpu" and not machine.gpus:
        raise CourseError("profile 'gpu' needs a GPU that PyTorch can use, and this machine "
                          "has none; use profile 'cpu' or 'auto' (`make doctor` says why)")

    if nproc == "auto":
        nproc = machine.ddp_nproc if name == "gpu" else hardware.CPU_PROCESSES
    nproc = int(nproc)
    if nproc < 1:
        raise CourseError(f"nproc must be at least 1, got {nproc}")
    ddp_device = "cuda" if name == "gpu" and nproc <= machine.gpus else "cpu"
    if name == "gpu" and ddp_device == "cpu":
        notes.append(f"{nproc} processes but {machine.gpus} GPU(s): the DDP launches run "
                     f"{nproc} processes on the CPU with gloo (NCCL cannot run two ranks "
                     f"on one GPU); the one-device runs use the GPU")
    if nproc == 1:
        notes.append("nproc is 1: DDP launches run one process, so the comparisons between "
                     "processes are skipped and say so")

    device = ("cuda" if name == "gpu" else "cpu") if launches == ONE_DEVICE else ddp_device
    dataset = choose_dataset(dataset, device, data_dir, notes)
    sizes = SIZES[(device, dataset)]
    return Profile(name=name, launches=launches, device=device, nproc=nproc,
                   ddp_device=ddp_device, backend=hardware.backend_for(ddp_device),
                   dataset=dataset, **sizes.__dict__, notes=tuple(notes))


def choose_dataset(dataset, device, data_dir, notes):
    """The dataset for runs on ``device``; appends the reason to ``notes`` where it matters."""
    fashion_here = data.is_available("fashion-mnist", data_dir)
    if dataset == "auto":
        if fashion_here and device == "cpu":
            notes.append("Fashion-MNIST is downloaded, but these runs go to the CPU: the "
                         "offline digits keep each notebook to minutes (dataset="
                         "'fashion-mnist' trains on it anyway)")
        return "fashion-mnist" if fashion_here and device == "cuda" else "digits"
    dataset = data.resolve_name(dataset, data_dir)
    if not data.is_available(dataset, data_dir):
        raise CourseError(f"dataset {dataset!r} is not downloaded; run `python -m "
                          f"workshop_lib.data download {dataset}` or use dataset='auto'")
    return dataset
