"""What the check's commands run with: this Python, the project on PYTHONPATH, one GPU for
the smoke, and stand-ins for the packages a bare GPU image lacks (standins/README.md)."""
import importlib
import importlib.util
import os
import platform
import shutil
import sys
from pathlib import Path

import torch

from workshop_lib import hardware
from workshop_lib.gpu_check.library import REPO

STANDINS = Path(__file__).resolve().parent / "standins"
# Imported by the GPU steps' code (data.load("digits"), the training scripts' loops), and
# missing from an image that holds torch alone. Module to try -> stand-in package.
REPLACEABLE = {"sklearn.datasets": "sklearn", "tqdm": "tqdm"}
# Reported; steps skip without them. numpy and pytest are imported to tell (a module that
# is there but fails to import is missing), papermill and nbformat (slow to import, and
# for make gpu-check only) found.
IMPORTED, FOUND = ("numpy", "pytest"), ("papermill", "nbformat")
MIN_TORCH = (2, 11)


def importable(module):
    """Whether ``module`` imports here (a broken install counts as missing)."""
    try:
        importlib.import_module(module)
    except Exception:
        return False
    return True


def has_module(name):
    return importlib.util.find_spec(name) is not None


def missing_replaceable(force=False):
    """The stand-in packages this machine needs (all of them with ``force``)."""
    return sorted({package for module, package in REPLACEABLE.items()
                   if force or not importable(module)})


def install_standins(packages, folder):
    """Copy the stand-ins for ``packages`` into ``folder`` (only those: a stand-in must
    never hide a real package that works); return the folder, or None for none."""
    if not packages:
        return None
    shutil.rmtree(folder, ignore_errors=True)
    for package in packages:
        shutil.copytree(STANDINS / package, Path(folder) / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return Path(folder)


def first_gpu():
    """The first GPU CUDA_VISIBLE_DEVICES names (or "0"): the smoke's one GPU."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return visible or "0"


def command_env(standins=None, one_gpu=False, extra_path=(), no_gpu=False):
    """The environment of the check's commands (``no_gpu``: they see none, as in a CPU
    rehearsal, where a command that picks the GPU by itself must pick the CPU)."""
    env = dict(os.environ)
    path = [str(p) for p in (*([standins] if standins else []), REPO, *extra_path)]
    if env.get("PYTHONPATH"):
        path.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(path)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")  # torchrun otherwise warns that it set it
    if one_gpu:
        env["CUDA_VISIBLE_DEVICES"] = first_gpu()
    if no_gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    # This Python's bin folder first: the tests and notebooks find its torchrun.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def torch_version():
    release = torch.__version__.split("+")[0].split(".")
    try:
        return int(release[0]), int(release[1])
    except (IndexError, ValueError):
        return None


def describe(standins_used, one_gpu, rehearsal=False):
    """The machine lines of the report: software, GPUs as PyTorch counts them (the
    ``cuda-info`` step adds their names, without a CUDA context here), packages."""
    cuda = torch.cuda.is_available()
    lines = [f"Python {platform.python_version()} on {platform.platform()}",
             f"torch {torch.__version__}, built for CUDA {torch.version.cuda or 'none'}; "
             f"torch.cuda.is_available(): {cuda}"
             + (f", {torch.cuda.device_count()} GPU(s), {hardware.usable_gpus()} usable"
                if cuda else "")]
    if rehearsal:
        lines.append("CPU REHEARSAL (--cpu-rehearsal): the steps that can run on the CPU "
                     "ran there; nothing on a GPU was checked")
    version = torch_version()
    if version is not None and version < MIN_TORCH:
        lines.append(f"warning: torch {torch.__version__} is older than the "
                     f"{'.'.join(map(str, MIN_TORCH))} this check is written for")
    if one_gpu and cuda and not rehearsal:
        lines.append(f"the smoke's commands see one GPU: CUDA_VISIBLE_DEVICES={first_gpu()}")
    present = [name for name in IMPORTED if importable(name)] + \
        [name for name in FOUND if has_module(name)]
    absent = [name for name in (*IMPORTED, *FOUND) if name not in present]
    lines.append(f"optional packages present: {', '.join(present) or 'none'}; absent: "
                 f"{', '.join(absent) or 'none'}")
    if standins_used:
        lines.append(f"stand-ins used (workshop_lib/gpu_check/standins): "
                     f"{', '.join(standins_used)}"
                     + ("; digits are SYNTHETIC, so accuracies are not the course's"
                        if "sklearn" in standins_used else ""))
    else:
        lines.append("stand-ins used: none (scikit-learn's real digits, real tqdm)")
    return lines
