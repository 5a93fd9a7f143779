"""``make gpu-check``'s budget: each step's seconds on 4 A100s under the GPU profile
(Fashion-MNIST downloaded, ``wrn-16-4`` at batch 128: the profile's own sizes, read from
``profile.SIZES``), estimated, with the basis of each estimate.

ESTIMATED, NOT ALL MEASURED: no GPU has run the course yet. Each notebook's estimate prices
its plan (``workshop_lib.plans``: every process its cells start, in order, with the runs and
epochs each trains, made from the GPU profile of a 4-A100 machine and the values of the
notebook's parameters cell). What a GPU does not change is measured, on the 2-core CI
machine with nothing else running, the notebooks executed in the CPU profile
(``BENCHMARKS.md``, "The GPU budget's measured figures"); what only a GPU can tell is
assumed, and said to be:

- ``EPOCH_S``: one epoch of Fashion-MNIST (60,000 images) for ``wrn-16-4`` on one A100:
  1.80 GFLOP per image for forward and backward (counted with
  ``torch.utils.flop_counter`` on the CPU), 108 TFLOP an epoch, at an assumed 30 TFLOP/s
  sustained (a fifth of the A100's 156 TFLOP/s TF32 peak), plus evaluation;
- ``START_S`` (measured): a course launch up to its first step (torchrun, ``import torch``
  and the library in each process, the dataset): a one-epoch digits job of one process
  took 6.9 s in all, 0.4 s of it the epoch and its evaluation, when loading digits still
  imported scikit-learn (1.1 s; ``data`` now reads the file itself in 0.07 s). On a GPU
  server's many cores a launch's processes import side by side, as one process does here.
  ``FASHION_MNIST_LOAD_S`` (measured): reading and standardising Fashion-MNIST's 70,000
  images, 0.45 s (digits: 0.07 s). ``CUDA_SET_UP_S`` (assumed): what a launch on GPUs
  adds, a CUDA context, cuDNN's and cuBLAS's handles and NCCL's communicator.
  ``LAUNCH_S`` is their sum; ``CPU_LAUNCH_S`` (a check's gloo job, a digits demo,
  ``CUDA_VISIBLE_DEVICES=""``) is ``START_S``;
- ``SMALL_RUN_S`` (measured): the work of a job of its own small size (an exercise's check,
  a small demo): those jobs took 7.9-10.6 s in all, start included;
- ``IN_KERNEL_S``: a measurement in the notebook's kernel, by name: measured where it runs
  the same on every profile (05's exercise check trains digits on the CPU), else assumed
  (the largest-batch search, DataParallel, the noise scale, the input feed);
  ``ASSUMED_S``: the bench and notebook 07's experiments on GPUs;
- ``WAITS_S``: the timeouts a notebook waits out on purpose (its hangs), read from its
  cells (a test holds them to the notebooks). Only the waits that happen count: under
  ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` 04's mismatch is named at once (that cell took 5.5 s
  in all, its 20 s timeout never reached), and 04's two stuck debugging jobs are stopped
  once their stacks are dumped (its hang, section 2, shows a hang ending at its timeout);
  06's elastic survivors wait out their collective timeout under NCCL (gloo sees the lost
  node's sockets close: 32 s in all on the CPU);
- ``KERNEL_S``: a notebook's kernel start, imports and plots (measured 5-8 s on the CPU:
  an executed notebook's time less its launching cells; the GPU profile's plots have more
  points).

A sweep of one-device runs starts once and trains ``GPUS`` runs at a time (one per GPU);
a DDP launch divides each run's epochs over its ranks; a restart starts the workers again.
When the check runs, the report prints each step's measured seconds next to these: the
measured figures replace this table.

THE TARGET IS NOT MET BY THIS ESTIMATE (``verdict_lines`` says by how much, and how much of
it is training the Wide ResNet); the rest is the course's structure, which the lessons are
made of: every process a notebook starts (each torchrun launch, sweep, exercise check and
failure demo pays a start), the timeouts notebooks 04 and 06 wait out to show a hang, the
kernels, the bench and notebook 07's measurements. Notebook by notebook, what the GPU profile
could shrink and why it does not:

- 01 and 03: each sweep of 5 or 6 one-device runs takes two waves on 4 GPUs, where 4 runs
  would take one; but each variant is a comparison the notebook judges (same rate, linear,
  warmup, square root, LARS, early stop), the cells are the CPU profile's too, and 03's
  challenge refuses exactly these runs (``labs.keeping_accuracy_at_scale``);
- the profile's 6 epochs (01, 02, 03, 06): 4 would save about a minute, and every sweep's
  largest batch would still get its 100 steps; but 03's warmup variants warm up for 3
  epochs on every profile: half of a 6-epoch run, three quarters of a 4-epoch one, which
  leaves too little after warmup to judge the rules by;
- 00, 04 and 05 train for seconds on 4 GPUs (3 epochs, split over 4 ranks, or 3-epoch
  sweeps of at most 4 runs: one wave); 04 is its launches and hangs, the lesson itself;
- 02's 3 seeds per arm are what its same-accuracy comparison averages over; its bench is
  the quick one, every section (the bench's tests read the run notebook 02 makes);
- 06 and 07 are launches, timeouts and measurements, not training.

Reaching 15 min would take removing lessons (a variant, a failure demo, a check's job),
or a GPU machine's measured figures in place of the assumed ones.
"""
import ast
import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

from workshop_lib import hardware, plans, profile

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
TARGET_S = 15 * 60  # the course's budget for its notebooks on 4 A100-class GPUs
GPUS = 4
EPOCH_S = 4.0
START_S = 5.4  # measured (the docstring)
FASHION_MNIST_LOAD_S = 0.5  # measured: what a launch on the GPU profile's dataset adds
CUDA_SET_UP_S = 4.0  # assumed
LAUNCH_S = START_S + FASHION_MNIST_LOAD_S + CUDA_SET_UP_S
CPU_LAUNCH_S = START_S
SMALL_RUN_S = 4.0  # measured: the small jobs' 7.9-10.6 s in all, less START_S
# In the kernel: measured where the work is the same on every profile, else assumed.
IN_KERNEL_S = {"fit_in_memory_check": 5.5}
ASSUMED_IN_KERNEL_S = 20.0
KERNEL_S = 10.0
ASSUMED_S = {"bench": 90.0, "experiments": 60.0}  # bench --quick; 5 rounds per variant
LIMIT_FACTOR, MIN_LIMIT_S = 3, 300  # a step's time limit: 3x its estimate, at least 5 min
# The timeouts the notebooks wait out: 04's hang (--dist-timeout); 06's uneven hang, and
# its elastic job's survivors (their collective timeout, then the rendezvous's last call
# for the second round). 04's debugging jobs (gloo, 2 ranks) have a timeout of their own
# that none waits out: DETAIL names the mismatch at once, and the two stuck jobs are
# stopped once their stacks are dumped.
HANG_TIMEOUT_S, DEBUG_TIMEOUT_S = 15, 20
UNEVEN_TIMEOUT_S, ELASTIC_TIMEOUT_S, ELASTIC_LAST_CALL_S = 8, 15, 10
WAITS_S = {"hang": HANG_TIMEOUT_S, "uneven_hang": UNEVEN_TIMEOUT_S,
           "elastic": ELASTIC_TIMEOUT_S + ELASTIC_LAST_CALL_S}
# The machine the target is for: 4 A100s, Fashion-MNIST downloaded.
A100S = hardware.Machine(gpus=GPUS, gpu_names=("NVIDIA A100-SXM4-80GB",) * GPUS,
                         gpu_memory_gib=(79.2,) * GPUS, listed_gpus=GPUS, cpu_cores=64)


@dataclass(frozen=True)
class Estimate:
    seconds: float
    basis: str
    training_s: float = 0.0  # of ``seconds``: training the profile's model (EPOCH_S)

    @property
    def limit_s(self):
        return max(MIN_LIMIT_S, LIMIT_FACTOR * self.seconds)


def gpu_profiles(machine=A100S):
    """(one-device profile, DDP-launch profile) of ``machine`` under profile "gpu", with
    Fashion-MNIST as where it is downloaded (the sizes do not need the files)."""
    def get(launches):
        chosen = profile.get_profile("gpu", "auto", machine=machine, launches=launches)
        sizes = profile.SIZES[(chosen.device, "fashion-mnist")]
        return dataclasses.replace(chosen, dataset="fashion-mnist", notes=(),
                                   **dataclasses.asdict(sizes))
    return get(profile.ONE_DEVICE), get(profile.PROCESSES)


def parameters(notebook, folder=NOTEBOOK_DIR):
    """The values of a notebook's parameters cell (the cell papermill tags)."""
    cells = json.loads((Path(folder) / f"{notebook}.ipynb").read_text())["cells"]
    (source,) = ["".join(c["source"]) for c in cells
                 if "parameters" in c.get("metadata", {}).get("tags", [])]
    return {target.id: ast.literal_eval(node.value) for node in ast.parse(source).body
            if isinstance(node, ast.Assign) for target in node.targets}


def price(launch):
    """(seconds, of which training, what they are) of one launch of a plan on ``GPUS``
    A100s."""
    if launch.in_kernel:
        start, said = 0.0, "in the kernel"
    else:
        each = LAUNCH_S if launch.device == "cuda" else CPU_LAUNCH_S
        start = launch.rounds * each
        said = (f"{launch.rounds} starts" if launch.rounds > 1 else "1 start") + (
            f" of {launch.processes} processes" if launch.processes > 1 else "") + (
            " on the CPU" if launch.device == "cpu" else "")
    training = 0.0
    if launch.name in ASSUMED_S:
        work, what = ASSUMED_S[launch.name], "assumed"
    elif launch.in_kernel:
        work = IN_KERNEL_S.get(launch.name, ASSUMED_IN_KERNEL_S)
        what = "measured" if launch.name in IN_KERNEL_S else "assumed"
    elif launch.epochs is None:
        work, what = SMALL_RUN_S, "a small job"
    elif launch.processes == 1:
        waves = math.ceil(launch.runs / GPUS)
        work = training = waves * launch.epochs * EPOCH_S
        what = (f"{launch.runs} runs x {launch.epochs} epochs, {waves} wave(s) of one run "
                f"per GPU")
    else:
        work = training = launch.runs * launch.epochs * EPOCH_S / launch.processes
        what = f"{launch.runs} run(s) x {launch.epochs} epochs on {launch.processes} ranks"
    wait = WAITS_S.get(launch.name, 0)
    seconds = start + work + wait
    waited = f", a {wait} s timeout" if wait else ""
    return seconds, training, f"{launch.name} {seconds:.0f} s ({said}, {what}{waited})"


def estimate(launches):
    """A notebook's Estimate: its kernel and the price of each of its plan's launches."""
    priced = [price(launch) for launch in launches]
    return Estimate(KERNEL_S + sum(s for s, _, _ in priced),
                    f"kernel {KERNEL_S:.0f} s; " + "; ".join(w for _, _, w in priced),
                    sum(t for _, t, _ in priced))


def planned(machine=A100S, folder=NOTEBOOK_DIR):
    """Each notebook's Estimate, from its plan under ``machine``'s GPU profile and its
    parameters cell; none where a notebook is missing or its parameters are not plain
    values (the check then runs with its default limits, and the budget's test fails)."""
    one, ddp = gpu_profiles(machine)
    try:
        chosen = plans.every_notebook(one, ddp, lambda name: parameters(name, folder))
    except (OSError, ValueError, KeyError):
        return {}
    return {name: estimate(plans.launches_of(plan)) for name, (_, plan) in chosen.items()}


NOTEBOOKS = {
    **planned(),
    "08_looking_back": Estimate(KERNEL_S, "no launch: the kernel reads the records and "
                                          "checks the self-check's answers"),
}
GPU_TESTS = Estimate(8 * (LAUNCH_S + SMALL_RUN_S),
                     "tests/test_gpu.py: 8 tests, each a digits-sized job")
BENCH = Estimate(120.0, "bench --quick on the GPUs (assumed)")


def notebook_total():
    return sum(e.seconds for e in NOTEBOOKS.values())


def verdict_lines(measured=None):
    """The notebooks against ``TARGET_S``: the estimate, and the measured total when given
    (``{notebook: seconds}``); where the target is not met, which notebooks weigh most."""
    estimated = notebook_total()
    lines = [f"Notebooks, estimated: {estimated / 60:.1f} min against the course's target of "
             f"{TARGET_S / 60:.0f} min on {GPUS} A100-class GPUs (estimated from each "
             f"notebook's runs, not measured on GPUs: start-ups and small jobs measured on a "
             f"CPU, the GPUs' work assumed; see workshop_lib/gpu_check/budget.py)."]
    if measured:
        total = sum(measured.values())
        lines.append(f"Notebooks, measured here: {total / 60:.1f} min for {len(measured)} "
                     f"notebook(s), against the same target"
                     + (" (met)." if total <= TARGET_S else
                        f" (NOT met, by {(total - TARGET_S) / 60:.1f} min)."))
        largest = sorted(measured.items(), key=lambda item: -item[1])[:3]
    else:
        largest = sorted(((n, e.seconds) for n, e in NOTEBOOKS.items()), key=lambda i: -i[1])[:3]
        if estimated > TARGET_S:
            training = sum(e.training_s for e in NOTEBOOKS.values())
            lines.append(f"By the estimate the target is NOT met, by "
                         f"{(estimated - TARGET_S) / 60:.1f} min: training the GPU "
                         f"profile's model is {training / 60:.1f} min of it; the other "
                         f"{(estimated - training) / 60:.1f} min (process starts, the hangs' "
                         f"timeouts, kernels, measurements) no size changes.")
    if (sum(measured.values()) if measured else estimated) > TARGET_S:
        lines.append("Heaviest: " + ", ".join(f"{n} {s / 60:.1f} min" for n, s in largest)
                     + "; what each is made of: its basis in "
                       "workshop_lib/gpu_check/budget.py's NOTEBOOKS.")
    return lines
