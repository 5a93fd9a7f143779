"""``make gpu-check``'s budget: each step's seconds on 4 A100-class GPUs under the GPU
profile (Fashion-MNIST downloaded, ``wrn-16-4`` at batch 128: the profile's own sizes, read
from ``profile.SIZES``), estimated from each notebook's plan and priced with figures
measured on one GPU.

Each notebook's estimate prices its plan (``workshop_lib.plans``: every process its cells
start, in order, with the runs and epochs each trains, made from the GPU profile of a
4-A100 machine and the values of the notebook's parameters cell). The GPU's figures were
measured on one NVIDIA H200 with torch 2.11 (2026-12-04; BENCHMARKS.md, "The course on one
GPU"); the profile's step there is launch-bound (the host, not the GPU, sets its pace), so
an A100's are about the same. What a GPU does not change is measured on the 2-core CI
machine, the notebooks executed in the CPU profile:

- ``EPOCH_S`` (measured): one epoch of the plain script, one GPU: 4.7 s (5.8 s the first,
  with cuDNN's autotuning); ``DDP_EPOCH_S`` (measured): one epoch of ``train_ddp`` on one
  NCCL rank, 7.3 s: DDP's own host work each step (its hooks, the buckets, launching the
  all-reduce) is what the difference is, and a DDP launch divides it over its ranks with
  the steps;
- ``LAUNCH_S`` (measured): a GPU launch up to its first step: a one-epoch, one-rank NCCL
  launch took 27.9 s in all, 7.3 of it the epoch (a bare process that imports torch,
  initialises NCCL and all-reduces once: 6.9 s); ``CPU_LAUNCH_S`` (a check's gloo job, a
  digits demo, ``CUDA_VISIBLE_DEVICES=""``) is ``START_S``, measured on the CPU: a one-epoch
  digits job of one process took 6.9 s, 0.4 s of it the epoch and its evaluation;
- ``SWEEP_RUN_S`` (measured): what each run of a sweep pays besides its epochs (the data
  on the GPU, the model, evaluation, the record): a 2-epoch plain run took 24.6 s in all,
  10.5 s of it its epochs and 6.9 s a process's start, so 7 s; a sweep's runs go one per GPU,
  in waves;
- ``SMALL_RUN_S`` (measured on the CPU): the work of a job of its own small size (an
  exercise's check, a small demo): those jobs took 7.9-10.6 s in all, start included;
- ``IN_KERNEL_S``: a measurement in the notebook's kernel, by name: measured where it runs
  the same on every profile (05's exercise check trains digits on the CPU);
  ``PRICED_IN_KERNEL_S``: priced from the H200's figures (05's largest-batch search: the
  smoke's four searches took 19 s, 05 runs two; the knee: 26 steps at each of seven
  batches, 7 ms a step up to batch 128 and 8.8, 16 and 32 ms at 256, 512 and 1,024 from
  the samples/s measured there, 2.2 s, with cuDNN's choice of kernels for each shape and
  the data, 7 s; the input feed: three feeds of 96 steps at about 8 ms, and two workers'
  start, 6 s); else assumed (DataParallel, the noise scale);
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

The target, ``TARGET_S``, is this estimate with a little room: 25 minutes for the
notebooks on 4 A100-class GPUs, every lesson kept. Most of it is the course's structure,
which the lessons are made of (every process a notebook starts pays a start, the timeouts
04 and 06 wait out to show a hang, the kernels, the bench and 07's measurements), not
training the model. Each notebook's estimate must also fit its session's GPU minutes on the
day (``day.SESSIONS``' ``gpu_run``); a test holds both. When the check runs, the report
prints each step's measured seconds next to these: the measured figures replace this
table.
"""
import ast
import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

from workshop_lib import hardware, plans, profile

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
TARGET_S = 25 * 60  # the course's budget for its notebooks on 4 A100-class GPUs
GPUS = 4
# Measured (the docstring): one GPU (H200, torch 2.11) for the GPU's figures, the 2-core
# CI machine for the CPU's.
EPOCH_S = 5.0  # the plain script's epoch: 4.7 s, 5.8 s the first
DDP_EPOCH_S = 7.3  # train_ddp's epoch on one NCCL rank
LAUNCH_S = 20.0  # a GPU launch to its first step: 27.9 s in all less its 7.3 s epoch
SWEEP_RUN_S = 7.0  # a sweep's run besides its epochs: 24.6 s - 10.5 s of epochs - 6.9 s
START_S = 5.4  # a CPU launch to its first step
CPU_LAUNCH_S = START_S
SMALL_RUN_S = 4.0  # the small jobs' 7.9-10.6 s in all, less START_S
# In the kernel: measured where the work is the same on every profile, else assumed.
IN_KERNEL_S = {"fit_in_memory_check": 5.5}
PRICED_IN_KERNEL_S = {"largest_batch": 10.0, "knee": 7.0, "input_feed": 6.0}
ASSUMED_IN_KERNEL_S = 20.0
KERNEL_S = 10.0
# bench --quick; 07's experiments: their timing trains wrn-16-4 at batch 128, 9 variants x 6
# windows of 10 steps, 540 steps at about 20 ms (the H200's 17.8 ms step, DDP's host work)
ASSUMED_S = {"bench": 90.0, "experiments": 60.0}
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
        if launch.name in IN_KERNEL_S:
            work, what = IN_KERNEL_S[launch.name], "measured"
        elif launch.name in PRICED_IN_KERNEL_S:
            work, what = PRICED_IN_KERNEL_S[launch.name], "priced from one GPU's figures"
        else:
            work, what = ASSUMED_IN_KERNEL_S, "assumed"
    elif launch.epochs is None:
        work, what = SMALL_RUN_S, "a small job"
    elif launch.processes == 1:
        waves = math.ceil(launch.runs / GPUS)
        training = waves * launch.epochs * EPOCH_S
        work = training + waves * SWEEP_RUN_S
        what = (f"{launch.runs} runs x {launch.epochs} epochs, {waves} wave(s) of one run "
                f"per GPU, each {SWEEP_RUN_S:.0f} s of set-up")
    else:
        work = training = launch.runs * launch.epochs * DDP_EPOCH_S / launch.processes
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
             f"notebook's runs, priced with one GPU's measured start, epoch and per-run "
             f"figures; see workshop_lib/gpu_check/budget.py)."]
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
