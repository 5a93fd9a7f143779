"""What each notebook launches, decided from its workshop profile without running anything.

A notebook's cells take every shape-dependent number from here: how many processes, on
which device and backend, how many shards, which batches and epochs, on which step a
fault fires. Each function takes the notebook's ``Profile`` (``profile.get_profile``,
which reads the ``Machine``) and returns a plan whose ``launches`` list every process the
notebook starts, in the order its cells start them (a torchrun launch, a sweep, an
exercise check's job), and the heavy work its own kernel does: how many runs each trains
and for how many epochs. A test builds the profiles of machines it is not running on
(no GPU, 1, 2, 4, 6 and 8 GPUs, each also with ``profile="cpu"``) and checks every plan:
no GPU under the CPU profile, no more ranks than GPUs, shards for every rank, enough
steps at the largest batch (``tests/test_machine_plans.py``). ``make gpu-check``'s budget
prices the GPU profile's plans (``gpu_check/budget.py``), and a test holds each plan to
its notebook's cells: the same launches in the same order, the same number of runs in
each sweep (``tests/test_gpu_check.py``).
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
    trains, else None. ``runs``: the training runs it makes (a sweep's variants), each of
    ``epochs`` epochs of the profile's model on the profile's dataset; ``epochs`` None: a
    job of its own small size (an exercise's check, a demo on digits). ``rounds``: the
    times torchrun starts its workers (a restart after a failure adds one). ``in_kernel``:
    work the notebook's own kernel does, no process started.
    """

    name: str
    device: str
    processes: int = 1
    nodes: int = 1
    backend: str | None = None
    batch_size: int | None = None
    steps: int | None = None
    runs: int = 1
    epochs: int | None = None
    rounds: int = 1
    in_kernel: bool = False


def _cpu_job(name, processes=2, backend="gloo"):
    """A job on the CPU, whatever the machine (an exercise's check, a debugging job)."""
    return Launch(name, "cpu", processes, backend=backend)


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
    return [_ddp("first_run", p, batch_size=p.batch_size, steps=steps, epochs=WELCOME_EPOCHS)]


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
    # One run per batch, and the largest batch again at the linearly scaled rate.
    return BatchSizeSweep(batches, epochs, [Launch(
        "batch_size", p.device, batch_size=batches[-1], steps=_steps(p, epochs, batches[-1]),
        runs=len(batches) + 1, epochs=epochs)])


# Notebook 02


def one_to_many(p, seeds):
    """Notebook 02's runs (its cells launch them with the profile's $DEVICE and $NPROC):
    the learner's conversion and its check (``conversion_check``), ``seeds`` runs on one
    device against as many on ``p.nproc`` processes at the linearly scaled rate, the
    bench, and the from-scratch wrapper's check (two CPU processes)."""
    steps = _steps(p, p.epochs, p.batch_size * p.nproc)
    launches = [_ddp("my_ddp", p), conversion_check(p),
                Launch("one_device", p.device, batch_size=p.batch_size,
                       steps=_steps(p, p.epochs, p.batch_size), runs=seeds, epochs=p.epochs),
                _ddp("scaled", p, batch_size=p.batch_size, steps=steps, runs=seeds,
                     epochs=p.epochs)]
    if p.nproc > 1:
        launches.append(_ddp("bench", p))
    return launches + [_cpu_job("from_scratch_check")]


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
    warmup_epochs: float  # the warmup runs' (warmup_epochs(epochs))
    launches: list = field(default_factory=list)


# The runs of notebook 03's sweep cells (section 1, at the base rate; section 2, hot), and
# of the challenge's reference answer (the check trains the answer's runs).
# Section 1 has no warmup run (no verdict there needs one: section 2's does); section 2
# trains the square-root run on 3 seeds, the spread its rescue verdicts must clear.
BASE_LR_RUNS, HOT_LR_RUNS, CHALLENGE_RUNS = 4, 10, 3  # the answer on 3 seeds
# Warmup takes at most this share of a run: Goyal et al. warm up for 5 of 90 epochs; a
# warmup half as long as the run would judge the ramp, not the rate it reaches.
WARMUP_SHARE = 0.1


def warmup_epochs(epochs):
    """Notebook 03's warmup for a run of ``epochs``: WARMUP_SHARE of it, in tenths of an
    epoch (``--warmup-epochs`` takes fractions; the steps are rounded from it)."""
    return math.floor(round(10 * WARMUP_SHARE * epochs, 6)) / 10


def accuracy_at_scale(p, batch_scale, epochs=None, hot_factor=None):
    """Notebook 03's sweeps (one device), the gradient noise scale (in the kernel), its
    BatchNorm launch and its challenge."""
    small, large = p.lr_ref_batch, p.lr_ref_batch * batch_scale
    epochs = epochs or p.sweep_epochs(batch_scale)
    hot_factor = hot_factor or p.hot_factor
    at_large = {"batch_size": large, "steps": _steps(p, epochs, large), "epochs": epochs}
    launches = [Launch("base_lr", p.device, runs=BASE_LR_RUNS, **at_large),
                Launch("hot_lr", p.device, runs=HOT_LR_RUNS, **at_large),
                Launch("noise_scale", p.device, in_kernel=True)]
    if p.nproc > 1:
        launches.append(_ddp("equivalence", p))
    launches.append(Launch("challenge", p.device, runs=CHALLENGE_RUNS, **at_large))
    return AccuracyAtScale(small, large, epochs, hot_factor, hot_factor * p.lr,
                           warmup_epochs(epochs), launches)


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
    """Notebook 04's jobs: a crash, a hang (two ranks or more), the lab's buggy jobs, the
    mismatch under DETAIL and the exercises' checks (always two CPU processes: they are
    written for gloo), a restart and the same job uninterrupted (to compare bit for
    bit; on GPUs once more, for the spread of two plain runs)."""
    steps = data.steps_per_epoch(_train_size(p), p.nproc, p.batch_size)
    total = FAILURE_EPOCHS * steps
    run = {"batch_size": p.batch_size, "steps": total, "epochs": FAILURE_EPOCHS}
    launches = [_ddp("crash", p, **run)]
    if p.nproc > 1:
        launches.append(_ddp("hang", p, **run))
    launches += [_cpu_job("debug_job", DEBUG_JOB_PROCESSES),
                 _cpu_job("detail_mismatch", DEBUG_JOB_PROCESSES),
                 _cpu_job("debugging_check", DEBUG_JOB_PROCESSES),
                 _ddp("restart", p, rounds=2, **run), _ddp("uninterrupted", p, **run)]
    if p.ddp_device == "cuda":  # GPUs round differently run to run: the same job again
        launches.append(_ddp("uninterrupted_again", p, **run))
    launches += [_cpu_job("debug_eval_job", DEBUG_JOB_PROCESSES),
                 _cpu_job("eval_debugging_check", DEBUG_JOB_PROCESSES)]
    return Failures(steps, p.nproc - 1, FAILURE_EPOCHS, launches)


# Notebook 05


@dataclass(frozen=True)
class WorkedExample:
    big_batch: int         # the out-of-memory remedies' global batch
    dataparallel_gpus: int  # GPUs of DataParallel against DDP; 0: skipped
    dataparallel_skip: str | None  # why it is skipped
    launches: list = field(default_factory=list)


REMEDY_SCALE = 4  # the remedies' global batch, this many times the profile's
PRECISION_RUNS, REMEDY_RUNS = 3, 4  # the runs of the precision and remedies sweep cells


def worked_example(p, epochs):
    """Notebook 05's runs: precision and remedies on one device, the largest batch (GPU
    only) and the exercise's check in the kernel, DDP launches of the profile's shape,
    DataParallel on the profile's GPUs, the knee's curve and the input feed's measurements."""
    big = REMEDY_SCALE * p.batch_size
    launches = [Launch("precision", p.device, batch_size=p.batch_size,
                       steps=_steps(p, epochs, p.batch_size), runs=PRECISION_RUNS,
                       epochs=epochs),
                Launch("remedies", p.device, batch_size=big, steps=_steps(p, epochs, big),
                       runs=REMEDY_RUNS, epochs=epochs),
                # The exercise's check trains digits on the CPU, in the kernel.
                Launch("fit_in_memory_check", "cpu", in_kernel=True),
                _ddp("equivalence", p)]
    if p.device == "cuda":  # the search needs a GPU's memory limit (on a CPU: skipped)
        launches.insert(2, Launch("largest_batch", p.device, in_kernel=True))
    if p.ddp_device != "cuda":
        gpus, skip = 0, (f"DataParallel against DDP needs two GPUs or more, and this "
                         f"profile's DDP launches run on the CPU ({p.nproc} processes, "
                         f"profile {p.name}).")
    elif p.nproc < 2:
        gpus, skip = 0, "DataParallel against DDP needs two GPUs or more; nproc is 1."
    else:
        gpus, skip = p.nproc, None
        launches.append(Launch("dataparallel", "cuda", gpus, backend="nccl",
                               batch_size=p.batch_size, in_kernel=True))
    launches += [_ddp("trace", p), Launch("knee", p.device, in_kernel=True),
                 Launch("input_feed", p.device, in_kernel=True)]
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


def beyond(p, num_shards=None, elastic=True):
    """Notebook 06's shards (written by one process), data prepared once per node (gloo),
    the uneven-shards demo (its own shards; gloo on the CPU, ``shards.main``: the cure and
    the hang), and the two-node and (``elastic``) elastic jobs on the profile's DDP device:
    ``p.nproc // 2`` processes on each of two nodes (one each on two or three)."""
    num_shards = num_shards or SHARDS_PER_RANK * p.nproc
    if num_shards < p.nproc:
        raise CourseError(f"num_shards is {num_shards}, fewer than the {p.nproc} ranks: "
                          f"every rank needs a shard; use num_shards=None "
                          f"({SHARDS_PER_RANK} per rank)")
    node_nproc = max(1, p.nproc // NODES)
    training = {"batch_size": p.batch_size, "steps": _steps(p, p.epochs, p.batch_size * p.nproc),
                "epochs": p.epochs}
    # Preparing data once per node: local rank 0 writes, the others wait (gloo: a barrier
    # and no tensors, whatever the device).
    launches = [_cpu_job("shards", 1, backend=None),
                _ddp("memory_vs_shards", p, runs=2, **training),
                _cpu_job("prepare_once", p.nproc),
                _cpu_job("uneven_shards_written", 1, backend=None)]
    if p.nproc > 1:
        nodes_backend = hardware.backend_for(p.ddp_device)
        nodes_training = {"batch_size": p.batch_size, "epochs": p.epochs,
                          "steps": _steps(p, p.epochs, p.batch_size * NODES * node_nproc)}
        launches += [_cpu_job("uneven_shards", p.nproc), _cpu_job("uneven_hang", p.nproc),
                     Launch("two_nodes", p.ddp_device, NODES * node_nproc, NODES,
                            nodes_backend, **nodes_training)]
        if elastic:  # a node removed mid-run: the survivors' agent starts a second round
            launches.append(Launch("elastic", p.ddp_device, NODES * node_nproc, NODES,
                                   nodes_backend, rounds=2, **nodes_training))
    return Beyond(num_shards, uneven_shard_count(p.nproc), node_nproc, launches)


# Notebook 07


def inside_ddp(p):
    """Notebook 07's measurement launch (two ranks or more; its cell launches it with the
    profile's $NPROC and $DDP_DEVICE), and its three exercises' checks (two CPU processes
    each)."""
    return [*([_ddp("experiments", p)] if p.nproc > 1 else []),
            *(_cpu_job(f"{stage}_check") for stage in ("overlap", "buckets", "zero1"))]



# Every notebook


def every_notebook(one, ddp, parameters):
    """Each notebook's plan, made as its cells make it: ``one`` and ``ddp`` are the profiles
    of its one-device runs and of its DDP launches, ``parameters(notebook)`` the values of
    its parameters cell ({name: value}). Returns {notebook: (the profile it sets up, its
    plan)}."""
    p01, p02, p03 = (parameters(name) for name in (
        "01_sgd_and_batch_size", "02_from_one_gpu_to_many", "03_keeping_accuracy_at_scale"))
    p05, p06 = parameters("05_worked_example"), parameters("06_beyond_one_machine")
    return {
        "00_welcome": (ddp, welcome(ddp)),
        "01_sgd_and_batch_size": (one, batch_size_sweep(one, p01["batch_scale"],
                                                        p01["sweep_epochs"])),
        "02_from_one_gpu_to_many": (ddp, one_to_many(ddp, p02["seeds"])),
        "03_keeping_accuracy_at_scale": (one, accuracy_at_scale(
            one, p03["batch_scale"], p03["sweep_epochs"], p03["hot_factor"])),
        "04_when_things_go_wrong": (ddp, failures(ddp)),
        "05_worked_example": (one, worked_example(one, p05["epochs"])),
        "06_beyond_one_machine": (ddp, beyond(ddp, p06["num_shards"], p06["elastic"])),
        "07_inside_ddp": (ddp, inside_ddp(ddp)),
    }


def launches_of(plan):
    """A plan's launches, whether the plan is a list of them or holds one."""
    return plan if isinstance(plan, list) else plan.launches
