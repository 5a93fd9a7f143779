"""Set-up every notebook runs first, so ``%%bash`` cells find this environment's tools, and
the learner sees where they stand."""
import os
import shutil
import sys
from pathlib import Path

from workshop_lib import labs, progress
from workshop_lib import profile as profiles

# JupyterLab tells each kernel the path of the notebook it runs (jupyter_server's sessions;
# ipykernel shows it as __session__).
SESSION_ENV = "JPY_SESSION_NAME"


def setup(profile="auto", dataset="auto", nproc="auto", runs_dir="runs",
          launches=profiles.ONE_DEVICE):
    """Prepare the kernel for launching the course scripts; return the workshop profile.

    - Put this Python's ``bin`` folder first on PATH: ``%%bash torchrun ...`` then runs the
      torchrun of the environment the notebook runs in, even if it was never activated.
    - ``PYTHONUNBUFFERED=1``: launched scripts' output appears line by line, not at the end.
    - Export the profile, so ``%%bash`` cells can say ``--nproc-per-node=$NPROC``: DEVICE,
      DATASET, MODEL, EPOCHS, BATCH_SIZE, LR, LR_REF_BATCH (the sizes of this notebook's
      kind of run, ``launches``), NPROC and DDP_DEVICE (a DDP launch's shape), and RUNS
      (``runs_dir``, where this notebook's runs write their records).
    - Print the learner's progress line (``learner_progress``).
    """
    bin_dir = str(Path(sys.executable).parent)
    if os.environ.get("PATH", "").split(os.pathsep)[0] != bin_dir:
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    os.environ["PYTHONUNBUFFERED"] = "1"
    # Each training process sets its own thread count (hardware.configure_cpu_threads);
    # with OMP_NUM_THREADS set, torchrun skips its multi-line warning that it set it.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    chosen = profiles.get_profile(profile, dataset, nproc, launches)
    Path(runs_dir).mkdir(parents=True, exist_ok=True)
    os.environ.update(
        DEVICE=chosen.device, NPROC=str(chosen.nproc), DDP_DEVICE=chosen.ddp_device,
        DATASET=chosen.dataset, MODEL=chosen.model, EPOCHS=str(chosen.epochs),
        BATCH_SIZE=str(chosen.batch_size), LR=str(chosen.lr),
        LR_REF_BATCH=str(chosen.lr_ref_batch), RUNS=str(Path(runs_dir).resolve()),
    )
    print(chosen.describe())
    try:
        print(learner_progress())
    except Exception as error:  # noqa: BLE001 - a record file we cannot read must not stop the day
        print(f"(your progress could not be read: {progress.first_line(error)})")
    return chosen


def learner_progress():
    """The learner's progress line (workshop_lib.progress), with this notebook's part where
    the kernel knows its notebook: a copy (``02_from_one_gpu_to_many-Copy1``) counts as the
    notebook of its number."""
    catalogue = labs.catalogue()
    stem = Path(os.environ.get(SESSION_ENV, "")).stem
    here = stem if stem in catalogue.values() else next(
        (notebook for notebook in catalogue.values()
         if stem[:2].isdigit() and notebook[:3] == stem[:3]), None)
    return progress.progress_line(here, catalogue)


def fresh(folder):
    """``folder``, emptied: a run that writes there starts clean when a notebook is run again
    (an old checkpoint there would otherwise look like one to resume from)."""
    shutil.rmtree(folder, ignore_errors=True)
    return str(folder)


def export(**values):
    """Put a notebook's own values in the environment for its ``%%bash`` cells (and say
    which): ``notebook.export(SWEEP_EPOCHS=34)`` makes ``$SWEEP_EPOCHS`` available."""
    os.environ.update({name: str(value) for name, value in values.items()})
    print(" ".join(f"{name}={value}" for name, value in values.items()))
