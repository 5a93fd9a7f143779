"""Set-up every notebook runs first, so ``%%bash`` cells find this environment's tools."""
import os
import sys
from pathlib import Path

from workshop_lib import profile as profiles


def setup(profile="auto", dataset="auto", nproc="auto"):
    """Prepare the kernel for launching the course scripts; return the workshop profile.

    - Put this Python's ``bin`` folder first on PATH: ``%%bash torchrun ...`` then runs the
      torchrun of the environment the notebook runs in, even if it was never activated.
    - ``PYTHONUNBUFFERED=1``: launched scripts' output appears line by line, not at the end.
    """
    bin_dir = str(Path(sys.executable).parent)
    if os.environ.get("PATH", "").split(os.pathsep)[0] != bin_dir:
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    os.environ["PYTHONUNBUFFERED"] = "1"
    chosen = profiles.get_profile(profile, dataset, nproc)
    print(chosen.describe())
    return chosen
