"""The class kit's ground: where it lives, its one error, running a command, the class's
settings and accounts on record, and its helper modules (``kit_module``). Every command of
``classroom.py`` builds on these; they import nothing else of the kit.
"""
import importlib
import json
import pwd
import re
import stat
import subprocess
import sys
from pathlib import Path

KIT = Path(__file__).resolve().parent
REPO = KIT.parents[1]
COURSE_ID = "ddp-workshop"  # assessment/nbgrader_config.py's CourseDirectory.course_id
ASSIGNMENT_DIR = "ddp_refactor"  # learners fetch it from the exchange: not in their home
SIZE_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
LOOPBACK = ("127.0.0.1", "localhost", "::1")


class KitError(Exception):
    """A one-line reason why the command cannot go on, and what to do."""


def run(*command, **kwargs):
    result = subprocess.run([str(part) for part in command], capture_output=True, text=True,
                            **kwargs)
    if result.returncode != 0:
        said = (result.stderr or result.stdout).strip().splitlines() or ["(no output)"]
        raise KitError(f"{' '.join(map(str, command))} failed: {said[-1]}")
    return result.stdout


def settings_path(state):
    return state / "class.json"


def load_settings(state):
    path = settings_path(state)
    if not path.exists():
        raise KitError(f"{state} has no class settings yet: run `classroom.py --state {state} "
                       f"init` first")
    return json.loads(path.read_text())


def env_python(state):
    return state / "env" / "bin" / "python"


def kit_module(name):
    """One of the kit's modules beside this file (limits.py, disks.py, ...)."""
    sys.path.insert(0, str(KIT))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


def disks():
    """The kit's disks.py (the homes' filesystems)."""
    return kit_module("disks")


def user_exists(name):
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def recorded_accounts(state):
    path = state / "accounts.txt"
    return path.read_text().split() if path.exists() else []


def record_account(state, name):
    accounts = recorded_accounts(state)
    if name not in accounts:
        (state / "accounts.txt").write_text("\n".join([*accounts, name]) + "\n")


def load_learners(state):
    path = state / "learners.txt"
    return path.read_text().split() if path.exists() else []


def secrets_folder(state):
    folder = state / "secrets"
    folder.mkdir(exist_ok=True)
    folder.chmod(0o700)
    return folder


def parse_size(text):
    """``"8G"`` -> bytes; ``"0"`` -> 0 (no limit)."""
    found = re.fullmatch(r"(\d+)([KMGT]?)", text.strip().upper())
    if not found:
        raise KitError(f"{text!r} is not a size: a number with K, M, G or T, e.g. 8G")
    return int(found[1]) * SIZE_UNITS.get(found[2], 1)


def closed_folders(path):
    """``path`` and the folders above it that other accounts cannot pass through."""
    return [folder for folder in (path, *path.parents)
            if folder.exists() and not folder.stat().st_mode & stat.S_IXOTH]


def ensure_reachable(state):
    """Every account reaches the class folder (its environment, the exchange, its home)."""
    closed = closed_folders(state.parent)
    if closed:
        raise KitError(f"{closed[0]} is closed to other accounts (mode "
                       f"{stat.S_IMODE(closed[0].stat().st_mode):o}), so learners could not "
                       f"reach {state}: choose a class folder every account can reach, e.g. "
                       f"/srv/ddp-workshop")


def write_slurm_limit(state, settings):
    """Under SLURM, the class's job_submit.lua for these learners (slurm_gpus.py)."""
    if settings["spawner"] == "slurm":
        kit_module("slurm_gpus").write(state, load_learners(state),
                                       settings["slurm"]["gpus_per_learner"])
