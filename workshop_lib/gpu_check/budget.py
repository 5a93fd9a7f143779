"""``make gpu-check``'s budget: each step's seconds on 4 A100s under the GPU profile
(Fashion-MNIST downloaded, ``wrn-16-4``, ``EPOCHS`` epochs at batch 128: the profile's own
sizes, read from ``profile.SIZES``), estimated, with the basis of each estimate.

ESTIMATED, NOT MEASURED: no GPU has run the course yet. Each notebook's estimate is a
reading of the runs it makes under that profile (listed with it below), priced with
these figures:

- ``EPOCH_S``: one epoch of Fashion-MNIST (60,000 images) for ``wrn-16-4`` on one A100:
  1.80 GFLOP per image for forward and backward (counted with
  ``torch.utils.flop_counter`` on the CPU), 108 TFLOP an epoch, at an assumed 30 TFLOP/s
  sustained (a fifth of the A100's 156 TFLOP/s TF32 peak), plus evaluation;
- ``LAUNCH_S``: starting one process or torchrun launch: ``import torch`` took 7-10 s
  per process on the 2-core CI machine (NOTES.md), plus a CUDA context and NCCL's set-up
  (assumed);
- ``SMALL_RUN_S``: the training in a digits-sized run (the exercises' checks) on a GPU;
- ``KERNEL_S``: a notebook's kernel start, imports and plots.

A sweep of one-device runs goes out in waves of ``GPUS`` runs (one per GPU); a DDP launch
divides its epochs over ``GPUS`` ranks. When the check runs, the report prints each
step's measured seconds next to these: the measured figures replace this table.
"""
import math
from dataclasses import dataclass

from workshop_lib.plans import FAILURE_EPOCHS
from workshop_lib.profile import SIZES

TARGET_S = 15 * 60  # the course's budget for its notebooks on 4 A100-class GPUs
GPUS = 4
EPOCHS = SIZES[("cuda", "fashion-mnist")].epochs  # a standard run of the GPU profile
EPOCH_S = 4.0
LAUNCH_S = 15.0
SMALL_RUN_S = 5.0
KERNEL_S = 10.0
LIMIT_FACTOR, MIN_LIMIT_S = 3, 300  # a step's time limit: 3x its estimate, at least 5 min
# Notebook 04's waits: its hang's --dist-timeout, and its debugging jobs' (gloo, 2 ranks)
HANG_TIMEOUT_S, DEBUG_TIMEOUT_S = 15, 20


@dataclass(frozen=True)
class Estimate:
    seconds: float
    basis: str

    @property
    def limit_s(self):
        return max(MIN_LIMIT_S, LIMIT_FACTOR * self.seconds)


def wave(runs, epochs):
    """One-device runs, ``GPUS`` at a time."""
    return math.ceil(runs / GPUS) * (LAUNCH_S + epochs * EPOCH_S)


def ddp(epochs, variants=1):
    """One launch of ``GPUS`` ranks training ``variants`` runs of ``epochs`` one by one."""
    return LAUNCH_S + variants * epochs * EPOCH_S / GPUS


def small(launches=1, waits_s=0.0):
    """Launches of digits-sized jobs (exercise checks, fault demos), and their timeouts."""
    return launches * (LAUNCH_S + SMALL_RUN_S) + waits_s


NOTEBOOKS = {
    "00_welcome": Estimate(KERNEL_S + ddp(3),
                           "one DDP launch of 3 epochs"),
    "01_sgd_and_batch_size": Estimate(
        KERNEL_S + wave(6, EPOCHS),
        f"the batch sweep: 6 one-device runs (batch 128..2048, and 2048 linear), {EPOCHS} epochs"),
    "02_from_one_gpu_to_many": Estimate(
        KERNEL_S + small(3) + wave(3, EPOCHS) + ddp(EPOCHS, variants=3) + 90,
        "conversion run, its check and the from-scratch check (digits launches); 3 "
        f"one-device seeds of {EPOCHS} epochs; one launch training 3 seeds x {EPOCHS} epochs "
        "on 4 ranks; "
        "bench --quick (90 s, assumed)"),
    "03_keeping_accuracy_at_scale": Estimate(
        KERNEL_S + wave(5, EPOCHS) * 2 + small(1) + wave(1, EPOCHS),
        f"two sweeps of 5 one-device runs, {EPOCHS} epochs (base and hot rate); equivalence; the "
        "challenge's reference run"),
    "04_when_things_go_wrong": Estimate(
        KERNEL_S + 3 * ddp(FAILURE_EPOCHS) + LAUNCH_S + ddp(FAILURE_EPOCHS) + HANG_TIMEOUT_S
        + small(3, waits_s=DEBUG_TIMEOUT_S * 2) + small(2, waits_s=DEBUG_TIMEOUT_S),
        f"the crash, the restart (2 launches) and the uninterrupted run, {FAILURE_EPOCHS} "
        f"epochs each on {GPUS} ranks; the hang ({HANG_TIMEOUT_S} s timeout); the debug job "
        f"(its {DEBUG_TIMEOUT_S} s timeout), the DETAIL mismatch ({DEBUG_TIMEOUT_S} s) and "
        f"the debugging check (digits on 2 CPU ranks); the second hang: rank 0 evaluating "
        f"through the wrapper ({DEBUG_TIMEOUT_S} s timeout) and its fix's check"),
    "05_worked_example": Estimate(
        KERNEL_S + wave(3, 3) + wave(4, 3) + 20 + small(4),
        "precision sweep (3 runs x 3 epochs), remedies sweep (4 runs x 3 epochs), the "
        "largest-batch search (20 s), the fit-in-memory check, equivalence, DataParallel "
        "against DDP, the trace"),
    "06_beyond_one_machine": Estimate(
        KERNEL_S + 20 + ddp(EPOCHS, variants=2) + small(2, waits_s=8) + ddp(EPOCHS)
        + 1.5 * ddp(EPOCHS) + LAUNCH_S,
        "8 shards written (20 s); one launch training memory and shards runs "
        f"({EPOCHS} epochs each); the uneven/join demos (8 s timeout); two nodes; the "
        "elastic run (1.5 runs and a restart)"),
    "07_inside_ddp": Estimate(
        KERNEL_S + LAUNCH_S + 60 + small(3),
        "the experiments launch (5 rounds per variant, 60 s assumed) and the 3 checks"),
}
GPU_TESTS = Estimate(small(8), "tests/test_gpu.py: 8 tests, each a digits-sized job")
BENCH = Estimate(120.0, "bench --quick on the GPUs (assumed)")


def notebook_total():
    return sum(e.seconds for e in NOTEBOOKS.values())


def verdict_lines(measured=None):
    """The notebooks against ``TARGET_S``: the estimate, and the measured total when given
    (``{notebook: seconds}``); where the target is not met, which notebooks weigh most."""
    estimated = notebook_total()
    lines = [f"Notebooks, estimated: {estimated / 60:.1f} min against the course's target of "
             f"{TARGET_S / 60:.0f} min on {GPUS} A100-class GPUs (estimated from a reading of "
             f"each notebook's runs, not measured: see workshop_lib/gpu_check/budget.py)."]
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
            lines.append(f"By the estimate the target is NOT met, by "
                         f"{(estimated - TARGET_S) / 60:.1f} min.")
    if (sum(measured.values()) if measured else estimated) > TARGET_S:
        lines.append("Heaviest: " + ", ".join(f"{n} {s / 60:.1f} min" for n, s in largest)
                     + "; the GPU profile's sizes (profile.SIZES) set them.")
    return lines
