"""A learner's JupyterLab, as the hub starts it (as the learner, in their home): the class's
limits set on this process (so on every kernel, terminal and launch under it), a private
runtime folder for the kernels' sockets, the course's files that the home lacks copied in,
never over the learner's own, then JupyterHub's single-user server. `classroom.py init`
installs it as course/jupyterhub-learner, next to the files (course/files/), run by the class
environment's Python with -s (no packages from the learner's ~/.local).
"""
import json
import os
import resource
import shutil
import sys
import tempfile
from pathlib import Path

FILES = Path(__file__).resolve().parent / "files"
# RLIMIT_DATA rather than RLIMIT_AS: CUDA reserves far more address space than it uses.
LIMITS = {"data_bytes": resource.RLIMIT_DATA, "nproc": resource.RLIMIT_NPROC,
          "fsize_bytes": resource.RLIMIT_FSIZE}


def copy_missing(home):
    """Copy what ``home`` lacks; return the paths copied, relative to it."""
    copied = []
    for source in sorted(FILES.rglob("*")):
        target = home / source.relative_to(FILES)
        if source.is_file() and not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
            copied.append(target.relative_to(home))
    return copied


def set_limits(limits):
    """Soft and hard limits both: the learner's code cannot raise them again. 0: no limit
    from the class (the system's stays)."""
    for name, value in limits.items():
        if value and name in LIMITS:
            resource.setrlimit(LIMITS[name], (value, value))


def private_runtime_folder():
    """A new 0700 folder under /tmp, made with a name nobody could have taken first: the
    kernels' ipc sockets go there (a socket path must stay under 107 bytes, which a folder
    in a home may not), and only this learner can reach them."""
    folder = tempfile.mkdtemp(prefix="jupyter-")
    os.environ["JUPYTER_RUNTIME_DIR"] = folder
    return folder


if __name__ == "__main__":
    set_limits(json.loads(os.environ.get("CLASSROOM_LIMITS") or "{}"))
    runtime = private_runtime_folder()
    copied = copy_missing(Path.home())
    print(f"{Path.home()}: {len(copied)} course file(s) copied; runtime folder {runtime}",
          file=sys.stderr)
    from jupyterhub.singleuser import main

    try:
        sys.exit(main())
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
