"""What the bench measures, and for how long: the same ``Plan`` on every rank.

The plan names the steps to time (``StepConfig``), the world sizes, the all-reduce message
sizes and the scaling windows; ``make_plan`` derives it from the command's flags.
"""
import os
from dataclasses import dataclass

import torch

from workshop_lib import data, hardware, models, optim, profile
from workshop_lib.errors import CourseError

KB, MB = 2**10, 2**20
# The settings train.py uses by default; speed does not depend on them, only fairness.
# Variants of a scaling run: the course's DDP (train_ddp.wrap; no DDP at one process), the
# same model stepped under no_sync (no gradient all-reduce), DDP with its defaults, and
# the no_sync step followed by an all-reduce of one float (what synchronising the ranks
# once per step costs, whatever the bytes) or of one buffer as large as the gradients.
COURSE, NO_SYNC, BUFFER_SYNC = "course", "no_sync", "buffer_sync"
SYNC, FLAT = "sync", "flat"


@dataclass(frozen=True)
class Trial:
    """A change to the course's DDP step tried at the course's batch, against it."""

    name: str
    what: str              # the change, in words, for the table
    ddp: tuple = ()        # DDP options changed from train_ddp.wrap's, as (name, value)
    pinned: bool = False   # each rank's threads on a core of their own
    accumulate: int = 1    # micro-batches per optimizer step (one all-reduce per step)
    gloo_threads: int = 0  # a gloo group of its own on the loopback device, this many threads


# What item by item might cut DDP's exposed cost at the course's batch. DDP puts the
# course CNN's 0.36 MB of gradients in one bucket (its first bucket holds 1 MB): the
# all-reduce starts after the whole backward; smaller buckets start earlier, each one a
# synchronisation of its own.
TRIALS = (
    Trial("grad_view", "gradient_as_bucket_view=True (gradients are views of the "
          "buckets: no copy back)", ddp=(("gradient_as_bucket_view", True),)),
    Trial("static_graph", "static_graph=True (the same parameters used every step)",
          ddp=(("static_graph", True),)),
    Trial("accumulate_4", "--accumulate 4 (one all-reduce per 4 micro-batches; per "
          "micro-batch)", accumulate=4),
)
# On a CPU only: the bucket size suits the course CNN (DDP then makes 2 buckets, 301 KB
# and 76 KB; on GPUs the course's Wide ResNet would get a hundred), and pinning and gloo
# are CPU matters.
CPU_TRIALS = (
    Trial("small_buckets", "bucket_cap_mb=0.1 (2 buckets for the course CNN: the first "
          "all-reduce overlaps the rest of backward)", ddp=(("bucket_cap_mb", 0.1),)),
    Trial("pinned", "each rank's threads pinned to a core of their own "
          "(os.sched_setaffinity)", pinned=True),
    Trial("gloo_lo_1_thread", "a gloo group on the loopback device (GLOO_SOCKET_IFNAME=lo) "
          "with 1 worker thread instead of 2", gloo_threads=1),
)


@dataclass(frozen=True)
class StepConfig:
    """A training step to time: a model and a per-process batch size."""

    name: str
    model: str
    batch_size: int
    width: int = 0  # SmallCNN channels; 0 keeps the width the course trains

    def build(self, info, grad_checkpointing=False):
        torch.manual_seed(0)
        if self.model == "cnn" and self.width:
            model = models.SmallCNN(info.in_channels, info.num_classes, self.width)
            model.grad_checkpointing = grad_checkpointing
            return model
        return models.build(self.model, info, grad_checkpointing)

    def optimizer(self, model):
        """SGD as train.py builds it by default."""
        return optim.build("sgd", model.parameters(), optim.LR, optim.MOMENTUM,
                           optim.WEIGHT_DECAY)

    @property
    def label(self):
        return f"{self.model} w{self.width}" if self.width else self.model


@dataclass(frozen=True)
class Plan:
    """What to measure, and how long: identical on every rank."""

    device_type: str
    world_size: int
    world_sizes: tuple
    dataset: str
    data_dir: str
    epoch_samples: int       # samples per epoch where a window is whole epochs; 0: all
    configs: tuple
    rounds: int
    window_s: float          # the length of one timed window
    warmup_steps: int
    allreduce_sizes: tuple   # bytes
    allreduce_budget_s: float
    allreduce_min_reps: int
    loader_workers: int
    timeout_s: float
    trials: tuple = ()       # Trial s timed at the course's step, N processes
    precision_configs: tuple = ()  # names of the configs timed in fp32/bf16/fp16/checkpointed
    inside_ddp_steps: int = 20     # steps per window of notebook 07's wrappers (0: not timed)


@dataclass(frozen=True)
class Window:
    """One timed window of the scaling section: ``config``'s model stepped by the first
    ``world_size`` ranks at ``batch_size`` per rank, as ``variant`` says, with the change
    that trial ``trial_name`` makes (none by default)."""

    config: StepConfig
    world_size: int
    batch_size: int
    variant: str = COURSE
    trial_name: str = ""

    @property
    def key(self):
        return run_key(self.config.name, self.world_size, self.batch_size, self.variant,
                       self.trial_name)

    @property
    def trial(self):
        return next((t for t in (*TRIALS, *CPU_TRIALS) if t.name == self.trial_name), None)

    @property
    def model_variant(self):
        """Whose model this window steps: DDP's defaults and the trials that change DDP's
        options have their own; every other window steps the course's DDP model."""
        trial = self.trial
        if trial and (trial.ddp or trial.gloo_threads):
            return trial.name
        return BUFFER_SYNC if self.variant == BUFFER_SYNC else COURSE

    @property
    def run(self):
        """The key of the model it steps."""
        return run_key(self.config.name, self.world_size, self.batch_size, self.model_variant)


def run_key(config_name, world_size, batch_size, variant=COURSE, trial_name=""):
    key = f"{config_name}/{world_size}x{batch_size}/{variant}"
    return f"{key}+{trial_name}" if trial_name else key


def scaling_windows(plan):
    """Every window the scaling section times, in the order of the first round.

    Each config at each world size, at its batch (weak scaling) and at the batch that
    keeps the global batch of N processes (strong scaling); at N processes also the
    weak-scaling run under no_sync, with one all-reduce of one float and of the
    gradients' bytes after it, and wrapped with DDP's defaults; and the course's step
    with each of the plan's trials, as DDP, under no_sync and with the one-float
    all-reduce (so that each trial gets its own split of the exposed communication).
    """
    n, windows = plan.world_size, []
    for config in plan.configs:
        for w in plan.world_sizes:
            for batch in sorted({config.batch_size, config.batch_size * n // w}):
                windows.append(Window(config, w, batch))
        if n > 1:
            windows += [Window(config, n, config.batch_size, variant)
                        for variant in (NO_SYNC, SYNC, FLAT, BUFFER_SYNC)]
        if n > 1 and config == plan.configs[0]:
            windows += [Window(config, n, config.batch_size, variant, t.name)
                        for t in plan.trials for variant in (COURSE, NO_SYNC, SYNC)]
    return windows


def trials_for(device_type, world_size, cores):
    """The trials a machine can run: pinning needs Linux and a core per rank; a gloo group
    of one's own, the CPU."""
    if device_type != "cpu":
        return TRIALS
    runnable = [t for t in CPU_TRIALS if not t.pinned or (
        hasattr(os, "sched_setaffinity") and cores >= world_size)]
    return (*TRIALS, *runnable)


def model_facts(config, info):
    """Parameters and gradient bytes of ``config``'s model (built on no device: no memory)."""
    with torch.device("meta"):
        model = config.build(info)
    return {"parameters": models.count_parameters(model),
            "gradient_bytes": sum(p.numel() * p.element_size() for p in model.parameters()
                                  if p.requires_grad)}


def default_configs(device_type, model=None, batch_sizes=None, width=None, quick=False):
    """The course's own step (the profile's model and batch) and a step sized to scale
    (one per entry of ``batch_sizes`` when several are given, to compare them in one run).

    On a CPU the course's step (SmallCNN, batch 32 per process) takes ~8 ms, and DDP adds
    ~5 ms of synchronisation to it, so it scales poorly. The second step keeps the model
    and takes batch 512 per process: measured over 32..512 (BENCHMARKS.md), weak-scaling
    efficiency on 2 one-thread processes rose from ~0.56 at batch 32 to 0.82-0.87 at 256
    and 0.85-0.94 at 512, the issue's 0.85 target.
    On GPUs the second step is the original workshop's model, Wide ResNet 16-10 (17M
    parameters) at batch 128, whose 68 MB of gradients make communication matter.
    """
    course = profile.get_profile("gpu" if device_type == "cuda" else "cpu")
    if device_type == "cuda":
        model, default_batch = model or "wrn-16-10", 128
    else:
        # --quick only checks that everything runs: a 4x cheaper step is enough for that.
        model, default_batch = model or "cnn", 128 if quick else 512
    batch_sizes = batch_sizes or [default_batch]
    tuned = [StepConfig("scaling" if len(batch_sizes) == 1 else f"scaling-{b}", model, b,
                        width or 0) for b in batch_sizes]
    return (StepConfig("course", course.model, course.batch_size), *tuned)


def allreduce_sizes(largest_gradient_bytes, quick):
    """1 KB, 4 KB, 16 KB, ... up to 256 MB (4 MB with --quick), and on to the first size at
    or above the largest gradients, so that the floor is read off a measured size.

    A 256 MB gloo all-reduce takes under a second on 2 cores, so a CPU can afford the
    whole range; Wide ResNet 16-10's 68 MB of gradients take the quick sweep to 256 MB.
    """
    top = max(4 * MB if quick else 256 * MB, largest_gradient_bytes)
    sizes = [KB]
    while sizes[-1] < top:
        sizes.append(sizes[-1] * 4)
    return tuple(sizes)


def default_nproc(device):
    """On GPUs one process per GPU, also on one GPU (the bench's figures then come from one
    process: the step, its loop, precision, the data path); on the CPU
    ``hardware.CPU_PROCESSES``."""
    return max(1, hardware.detect().gpus) if device.type == "cuda" else hardware.CPU_PROCESSES


def check_world_size(world_size, device):
    if world_size < 1:
        raise CourseError(f"--nproc must be at least 1, got {world_size}")
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    if device.type == "cuda" and world_size > gpus:
        raise CourseError(f"{world_size} processes but {gpus} GPU(s) visible; the bench runs "
                          f"one process per GPU: pass --nproc {gpus} or --device cpu")


def make_plan(args, device):
    world_size = args.nproc if args.nproc is not None else default_nproc(device)
    check_world_size(world_size, device)
    # Powers of two up to N, and N itself: 1, 2, 4, 8 on eight GPUs, 1, 2 on a CPU.
    world_sizes = sorted({w for w in (2**k for k in range(8)) if w <= world_size} | {world_size})
    if device.type == "cuda":
        dataset = data.resolve_name(args.dataset, args.data_dir)
    else:
        # A CPU bench must finish in minutes: the offline dataset unless told otherwise.
        dataset = "digits" if args.dataset == "auto" else data.resolve_name(args.dataset)
    configs = default_configs(device.type, args.model, args.batch_size, args.width, args.quick)
    largest_gradient = max(model_facts(c, data.DATASETS[dataset])["gradient_bytes"]
                           for c in configs)
    return Plan(
        device_type=device.type, world_size=world_size, world_sizes=tuple(world_sizes),
        dataset=dataset, data_dir=str(args.data_dir),
        # Quick: short epochs, since a loop-overhead or data-path window is whole epochs.
        epoch_samples=512 if args.quick else 0,
        configs=configs,
        rounds=args.rounds if args.rounds is not None else 3 if args.quick else 7,
        window_s=0.05 if args.quick else 0.4,
        warmup_steps=2 if args.quick else 5,
        allreduce_sizes=allreduce_sizes(largest_gradient, args.quick),
        allreduce_budget_s=0.05 if args.quick else 0.5,
        allreduce_min_reps=3 if args.quick else 5,
        inside_ddp_steps=5 if args.quick else 20,
        loader_workers=args.loader_workers if args.loader_workers is not None
        else min(4, hardware.cpu_cores()),
        timeout_s=args.timeout,
        trials=trials_for(device.type, world_size, hardware.cpu_cores()) if world_size > 1
        else (),
        # On a CPU the course's step only: fp16 is emulated there, ~20x slower than fp32,
        # and at batch 512 one fp16 step takes seconds.
        precision_configs=tuple(c.name for c in configs) if device.type == "cuda"
        else (configs[0].name,),
    )
