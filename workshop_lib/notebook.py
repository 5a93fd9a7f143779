"""Set-up every notebook runs first, so ``%%bash`` cells find this environment's tools."""
import os
import sys
from pathlib import Path

from workshop_lib import profile as profiles


def setup(profile="auto", dataset="auto", nproc="auto", runs_dir="runs"):
    """Prepare the kernel for launching the course scripts; return the workshop profile.

    - Put this Python's ``bin`` folder first on PATH: ``%%bash torchrun ...`` then runs the
      torchrun of the environment the notebook runs in, even if it was never activated.
    - ``PYTHONUNBUFFERED=1``: launched scripts' output appears line by line, not at the end.
    - Export the profile's sizes, so ``%%bash`` cells can say ``--nproc-per-node=$NPROC``:
      NPROC, DATASET, MODEL, EPOCHS, BATCH_SIZE, LR, LR_REF_BATCH, and RUNS (``runs_dir``,
      where this notebook's runs write their records).
    """
    bin_dir = str(Path(sys.executable).parent)
    if os.environ.get("PATH", "").split(os.pathsep)[0] != bin_dir:
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    os.environ["PYTHONUNBUFFERED"] = "1"
    # Each training process sets its own thread count (hardware.configure_cpu_threads);
    # with OMP_NUM_THREADS set, torchrun skips its multi-line warning that it set it.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    chosen = profiles.get_profile(profile, dataset, nproc)
    Path(runs_dir).mkdir(parents=True, exist_ok=True)
    os.environ.update(
        NPROC=str(chosen.nproc), DATASET=chosen.dataset, MODEL=chosen.model,
        EPOCHS=str(chosen.epochs), BATCH_SIZE=str(chosen.batch_size), LR=str(chosen.lr),
        LR_REF_BATCH=str(chosen.lr_ref_batch), RUNS=str(Path(runs_dir).resolve()),
    )
    print(chosen.describe())
    return chosen
