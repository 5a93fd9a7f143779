"""What each notebook launches, decided from its workshop profile without running anything.

A notebook's cells take every shape-dependent number from here: how many processes, on
which device and backend, how many shards, which batches and epochs, on which step a
fault fires. Each function takes the notebook's ``Profile`` (``profile.get_profile``,
which reads the ``Machine``) and returns a plan whose ``launches`` list every run or
job the notebook starts. A test builds the profiles of machines it is not running on
(no GPU, 1, 2, 4, 6 and 8 GPUs, each also with ``profile="cpu"``) and checks every plan:
no GPU under the CPU profile, no more ranks than GPUs, shards for every rank, enough
steps at the largest batch (``tests/test_machine_plans.py``).
"""
import math
from dataclasses import dataclass, field

from workshop_lib import data, faults, hardware
from workshop_lib.errors import CourseError


@dataclass(frozen=True)
class Launch:
    """One run or job a notebook starts.

    ``processes`` in all, over ``nodes`` torchrun agents, each computing on ``device``
    ("cpu" or "cuda"; on "cuda" one GPU per process); ``backend``: its process group's,
    None for a single process without one. ``batch_size`` (per process) and ``steps``
    (optimizer steps in the whole run) are those of its largest-batch run, where it
    trains, else None.
    """

    name: str
    device: str
    processes: int = 1
    nodes: int = 1
    backend: str | None = None
    batch_size: int | None = None
    steps: int | None = None


def _ddp(name, p, **sizes):
    """A torchrun launch of the profile's shape: ``p.nproc`` processes on ``p.ddp_device``."""
    return Launch(name, p.ddp_device, p.nproc, backend=p.backend, **sizes)


def _train_size(p):
    return data.DATASETS[p.dataset].train_size


def _steps(p, epochs, global_batch):
    """Optimizer steps of a run of ``epochs`` over the profile's dataset at ``global_batch``
    (a DistributedSampler pads the last batch, a single process keeps it: both round up)."""
    return epochs * math.ceil(_train_size(p) / global_batch)


# Notebook 00

WELCOME_EPOCHS = 3  # the first run's epochs (its cell's --epochs 3)


def welcome(p):
    """Notebook 00's first DDP run (its cell launches it with the profile's $NPROC and
    $DEVICE)."""
    steps = WELCOME_EPOCHS * data.steps_per_epoch(_train_size(p), p.nproc, p.batch_size)
    return [_ddp("first_run", p, batch_size=p.batch_size, steps=steps)]


# Notebook 01


@dataclass(frozen=True)
class BatchSizeSweep:
    batches: list       # the sweep's batch sizes, doubling from the profile's
    epochs: int         # of every run: the largest batch gets MIN_SWEEP_STEPS steps
    launches: list = field(default_factory=list)

    @property
    def largest(self):
        return self.batches[-1]


def batch_size_sweep(p, batch_scale, epochs=None):
    """Notebook 01's sweep: one device, batch ``p.batch_size`` doubling to ``batch_scale``
    times it, with ``epochs`` (None: ``p.sweep_epochs``)."""
    if batch_scale < 1 or batch_scale & (batch_scale - 1):
        raise CourseError(f"batch_scale is a power of two (the sweep doubles the batch), got "
                          f"{batch_scale}")
    batches = [p.batch_size * 2**i for i in range(int(math.log2(batch_scale)) + 1)]
    epochs = epochs or p.sweep_epochs(batch_scale)
    return BatchSizeSweep(batches, epochs, [Launch(
        "batch_size", p.device, batch_size=batches[-1], steps=_steps(p, epochs, batches[-1]))])


# Notebook 02


def one_to_many(p):
    """Notebook 02's runs (its cells launch them with the profile's $DEVICE and $NPROC):
    one device against ``p.nproc`` processes at the linearly scaled rate, the bench, and
    the learner's conversion (``conversion_check``)."""
    steps = _steps(p, p.epochs, p.batch_size * p.nproc)
    launches = [Launch("one_device", p.device, batch_size=p.batch_size,
                       steps=_steps(p, p.epochs, p.batch_size)),
                _ddp("scaled", p, batch_size=p.batch_size, steps=steps),
                conversion_check(p)]
    if p.nproc > 1:
        launches.append(_ddp("bench", p))
    return launches


def conversion_check(p):
    """The launch of notebook 02's conversion check (the learner's script under torchrun,
    judged by the assessment's engine) on the profile's shape. Its sizes (epochs, batch,
    target) are the engine's, set in ``labs/from_one_gpu_to_many.py``: where they come to depend on
    the profile, return them here as ``batch_size`` and ``steps``, and the plan test
    checks them with the rest."""
    return _ddp("conversion_check", p)


# Notebook 03


@dataclass(frozen=True)
class AccuracyAtScale:
    small: int          # the small global batch (the profile's reference batch)
    large: int          # batch_scale times it
    epochs: int         # of every sweep run and of the challenge
    hot_factor: float   # section 2's base rate, this many times the profile's
    hot_lr: float
    launches: list = field(default_factory=list)


def accuracy_at_scale(p, batch_scale, epochs=None, hot_factor=None):
    """Notebook 03's sweeps (one device), its BatchNorm launch and its challenge."""
    small, large = p.lr_ref_batch, p.lr_ref_batch * batch_scale
    epochs = epochs or p.sweep_epochs(batch_scale)
    hot_factor = hot_factor or p.hot_factor
    at_large = {"batch_size": large, "steps": _steps(p, epochs, large)}
    launches = [Launch("base_lr", p.device, **at_large), Launch("hot_lr", p.device, **at_large),
                Launch("challenge", p.device, **at_large)]
    if p.nproc > 1:
        launches.append(_ddp("equivalence", p))
    return AccuracyAtScale(small, large, epochs, hot_factor, hot_factor * p.lr, launches)


# Notebook 04


@dataclass(frozen=True)
class Failures:
    steps_per_epoch: int  # of each rank
    last_rank: int        # the rank the faults hit: it exists whatever the process count
    epochs: int
    launches: list = field(default_factory=list)

    def fault(self, kind, epoch):
        """``--inject-fault`` for ``kind`` half-way through ``epoch`` on the last rank."""
        return f"{kind}@{self.last_rank}:{faults.step_in_epoch(epoch, self.steps_per_epoch)}"


FAILURE_EPOCHS = 3  # each run of notebook 04
DEBUG_JOB_PROCESSES = 2  # the debugging lab's script: gloo on the CPU, on any machine


def failures(p):
    """Notebook 04's jobs: a crash, a hang (two ranks or more), a restart and the same job
    uninterrupted (to compare bit for bit), and the lab's buggy job (always two CPU
    processes: it is written for gloo)."""
    steps = data.steps_per_epoch(_train_size(p), p.nproc, p.batch_size)
    total = FAILURE_EPOCHS * steps
    launches = [_ddp("crash", p, batch_size=p.batch_size, steps=total),
                _ddp("restart", p, batch_size=p.batch_size, steps=total),
                _ddp("uninterrupted", p, batch_size=p.batch_size, steps=total),
                Launch("debug_job", "cpu", DEBUG_JOB_PROCESSES, backend="gloo")]
    if p.nproc > 1:
        launches.append(_ddp("hang", p, batch_size=p.batch_size, steps=total))
    return Failures(steps, p.nproc - 1, FAILURE_EPOCHS, launches)


# Notebook 05


@dataclass(frozen=True)
class WorkedExample:
    big_batch: int         # the out-of-memory remedies' global batch
    dataparallel_gpus: int  # GPUs of DataParallel against DDP; 0: skipped
    dataparallel_skip: str | None  # why it is skipped
    launches: list = field(default_factory=list)


REMEDY_SCALE = 4  # the remedies' global batch, this many times the profile's


def worked_example(p, epochs):
    """Notebook 05's runs: precision and remedies on one device, the largest batch (GPU
    only), DDP launches of the profile's shape, DataParallel on the profile's GPUs."""
    big = REMEDY_SCALE * p.batch_size
    launches = [Launch("precision", p.device, batch_size=p.batch_size,
                       steps=_steps(p, epochs, p.batch_size)),
                Launch("remedies", p.device, batch_size=big, steps=_steps(p, epochs, big)),
                _ddp("equivalence", p), _ddp("trace", p)]
    if p.device == "cuda":
        launches.append(Launch("largest_batch", p.device))
    if p.ddp_device != "cuda":
        gpus, skip = 0, (f"DataParallel against DDP needs two GPUs or more, and this "
                         f"profile's DDP launches run on the CPU ({p.nproc} processes, "
                         f"profile {p.name}).")
    elif p.nproc < 2:
        gpus, skip = 0, "DataParallel against DDP needs two GPUs or more; nproc is 1."
    else:
        gpus, skip = p.nproc, None
        launches.append(Launch("dataparallel", "cuda", gpus, backend="nccl",
                               batch_size=p.batch_size))
    return WorkedExample(big, gpus, skip, launches)


# Notebook 06


@dataclass(frozen=True)
class Beyond:
    num_shards: int     # section 1: shards of the dataset, at least one per rank
    uneven_shards: int  # section 2: shards that no number of ranks divides evenly
    node_nproc: int     # processes per node of the two-node and elastic jobs
    launches: list = field(default_factory=list)


SHARDS_PER_RANK = 4  # section 1's default: more shards than ranks, as the notebook advises
NODES = 2


def uneven_shard_count(ranks):
    """Shards that ``ranks`` ranks (two or more) cannot share evenly: one rank reads three
    where the others read two (five on two ranks)."""
    return 2 * ranks + 1


def beyond(p, num_shards=None):
    """Notebook 06's shards, data prepared once per node (gloo), the uneven-shards demo
    (gloo on the CPU, ``shards.main``), and the two-node and elastic jobs on the profile's
    DDP device: ``p.nproc // 2`` processes on each of two nodes (one each on two or
    three)."""
    num_shards = num_shards or SHARDS_PER_RANK * p.nproc
    if num_shards < p.nproc:
        raise CourseError(f"num_shards is {num_shards}, fewer than the {p.nproc} ranks: "
                          f"every rank needs a shard; use num_shards=None "
                          f"({SHARDS_PER_RANK} per rank)")
    node_nproc = max(1, p.nproc // NODES)
    training = {"batch_size": p.batch_size, "steps": _steps(p, p.epochs, p.batch_size * p.nproc)}
    # Preparing data once per node: local rank 0 writes, the others wait (gloo: a barrier
    # and no tensors, whatever the device).
    launches = [_ddp("memory_vs_shards", p, **training),
                Launch("prepare_once", "cpu", p.nproc, backend="gloo")]
    if p.nproc > 1:
        nodes_backend = hardware.backend_for(p.ddp_device)
        launches += [
            Launch("uneven_shards", "cpu", p.nproc, backend="gloo"),
            *(Launch(name, p.ddp_device, NODES * node_nproc, NODES, nodes_backend,
                     p.batch_size, _steps(p, p.epochs, p.batch_size * NODES * node_nproc))
              for name in ("two_nodes", "elastic"))]
    return Beyond(num_shards, uneven_shard_count(p.nproc), node_nproc, launches)


# Notebook 07


def inside_ddp(p):
    """Notebook 07's measurement launch (two ranks or more; its cell launches it with the
    profile's $NPROC and $DDP_DEVICE)."""
    return [_ddp("experiments", p)] if p.nproc > 1 else []

