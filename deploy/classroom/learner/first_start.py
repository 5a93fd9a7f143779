"""A learner's JupyterLab, as the hub starts it (as the learner, in their home): first the
course's files that the home lacks are copied in, never over the learner's own, then
JupyterHub's single-user server. `classroom.py init` installs it as course/jupyterhub-learner,
next to the files (course/files/), with the class environment's Python.
"""
import shutil
import sys
from pathlib import Path

FILES = Path(__file__).resolve().parent / "files"


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


if __name__ == "__main__":
    copied = copy_missing(Path.home())
    print(f"{Path.home()}: {len(copied)} course file(s) copied", file=sys.stderr)
    from jupyterhub.singleuser import main

    sys.exit(main())
