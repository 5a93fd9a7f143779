"""Notebook 02, "Make it a DDP job": the learner converts a single-device script.

The learner's ``%%writefile`` cell starts as ``files/conversion_stub.py``: a small CNN on
the course's digits, written with a ``Trainer`` class (a different script from the
assessment's, so that solving one does not solve the other). The check runs it the way
the assessment grades: the assessment's own engine (``ddp_checks`` and ``ddp_recorder``,
from ``assessment/release``) launches it under torchrun, records what each rank did, and
judges each requirement from that: disjoint shards that cover the data, reshuffled each
epoch; gradients averaged (each rank's parameters after the first steps equal one
process's replay on the global batch); only rank 0 prints and writes; the checkpoint
loads into the plain model; the logged metrics are the global ones; it learns. (The
learning-rate rule is notebook 03's subject, so it is not judged here.) The job runs on the
notebook's processes and device: its profile's ``nproc`` and ``ddp_device``, which
``notebook.setup`` exports as ``NPROC`` and ``DDP_DEVICE``.
"""
import contextlib
import importlib.util
import io
import os
import tempfile
from pathlib import Path

from workshop_lib.labs import Exercise, Verdict, register

FILES = Path(__file__).resolve().parent / "files"
ENGINE = Path(__file__).resolve().parents[2] / "assessment" / "release" / "ddp_refactor"
DATA_MODULE_ENV = "DDP_RECORDER_DATA_MODULE"  # which module's load_data() the recorder watches
JUDGED = ("runs_and_reaches_target_accuracy", "shards_disjoint_and_cover",
          "shards_reshuffled_each_epoch", "gradients_averaged_over_ranks",
          "rank0_only_logs_and_writes", "checkpoint_loads_into_plain_model",
          "validation_metrics_are_global")
# The check's run (the engine's Config). A small batch per process keeps enough optimizer
# steps at 8 ranks (4 epochs: 92 steps) for the reference, which keeps --lr unscaled, and
# for the linear and square-root rules alike: tests/test_assessment_sizing.py simulates
# them on 1, 2, 4 and 8 ranks over seeds and prints the margins. No speed-up run: the
# exercise is the conversion, the speed-up the assessment's.
RUN = {"epochs": 4, "batch_size": 8, "lr": 0.02, "seed": 0, "target_accuracy": 0.85,
       "time_limit_s": 180, "measure_speedup": False}


def engine():
    """The assessment's kernel-side checks (ddp_checks.py of the release)."""
    spec = importlib.util.spec_from_file_location("lab_ddp_checks", ENGINE / "ddp_checks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def layout(nproc=None, device=None):
    """``(processes, on_gpu)`` of the check's job: ``nproc`` and ``device`` ("cuda" or
    "cpu") where given, else the notebook's profile (``NPROC`` and ``DDP_DEVICE``, exported
    by ``notebook.setup``), else the course's choice for this machine."""
    nproc = nproc or os.environ.get("NPROC")
    device = device or os.environ.get("DDP_DEVICE")
    if not nproc or not device:
        from workshop_lib import profile

        chosen = profile.get_profile("auto", launches=profile.PROCESSES)
        nproc, device = nproc or chosen.nproc, device or chosen.ddp_device
    return int(nproc), device == "cuda"


def check(path, nproc=None, device=None):
    path = Path(path).resolve()
    if not path.is_file():
        return Verdict(False, f"{path.name} does not exist: run the %%writefile cell first")
    checks = engine()
    checks.RUN_DIR = Path(tempfile.mkdtemp(prefix="lab-conversion-"))
    os.environ[DATA_MODULE_ENV] = "workshop_lib.labs.conversion_data"  # the recorder's
    processes, on_gpu = layout(nproc, device)
    with contextlib.redirect_stdout(io.StringIO()):
        run = checks.launch(str(path), checks.Config(**RUN), processes, on_gpu)
    results = {}
    for grade_id in JUDGED:
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                getattr(checks, f"check_{grade_id}")(run)
            results[grade_id] = None
        except checks.RequirementNotMet as reason:
            results[grade_id] = str(reason)
    for grade_id, reason in results.items():
        print(f"  {'PASS' if reason is None else 'NOT YET'}  {grade_id}"
              + ("" if reason is None else f": {reason}"))
    missed = [grade_id for grade_id, reason in results.items() if reason is not None]
    if missed:
        return Verdict(False, f"{len(missed)} of {len(JUDGED)} requirements not met yet, "
                              f"first {missed[0]}: {results[missed[0]]}", {"results": results})
    return Verdict(True, f"all {len(JUDGED)} requirements met: your script is a correct DDP "
                         f"job ({checks.where(run.nproc, run.on_gpu)}, {run.elapsed_s:.0f} s)",
                   {"results": results})


def copy(name, path=None):
    path = Path(path) if path else Path(tempfile.mkdtemp(prefix="lab-")) / "my_train_ddp.py"
    path.write_text((FILES / name).read_text())
    return path


register(Exercise("conversion", "02_from_one_gpu_to_many", "make a single-device script DDP",
                  check=check, stub=lambda path=None: copy("conversion_stub.py", path),
                  solution=lambda path=None: copy("conversion_solution.py", path),
                  stub_reason="requirements not met yet"))
