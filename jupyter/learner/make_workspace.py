"""The learner's workspace that `make lab` serves: copies of the day's notebooks and of the
assessment as learners receive it, and nothing else of the repository.

    python jupyter/learner/make_workspace.py WORKSPACE

WORKSPACE/notebooks/ gets notebooks/*.ipynb, WORKSPACE/deploy/ the cluster files of
deploy/ (notebook 06 reads them, and a learner adapts them to their cluster) and
WORKSPACE/ddp_refactor/ the files of assessment/release/ddp_refactor/ (none of the files its
notebook writes when it runs).
A file is copied only when the workspace does not have it yet, so a learner's work is never
overwritten: delete a copy to get the repository's version again. The notebooks run from
there as from notebooks/: they import workshop_lib (installed in development mode) and
write their runs under their own folder.
"""
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ASSIGNMENT = REPO / "assessment" / "release" / "ddp_refactor"
# Written by the assessment notebook when it runs (assessment/nbgrader_config.py ignores
# them too): a learner's own, never the repository's.
WRITTEN_BY_THE_NOTEBOOK = {"train_digits.py", "train_digits_ddp.py"}


def learner_files():
    """``{path in the workspace: path in the repository}``."""
    files = {Path("notebooks") / p.name: p for p in sorted((REPO / "notebooks").glob("*.ipynb"))}
    files.update({p.relative_to(REPO): p for p in sorted((REPO / "deploy").rglob("*"))
                  if p.is_file() and "__pycache__" not in p.parts})
    files.update({Path("ddp_refactor") / p.name: p for p in sorted(ASSIGNMENT.iterdir())
                  if p.is_file() and p.name not in WRITTEN_BY_THE_NOTEBOOK})
    return files


def make_workspace(workspace):
    """Copy what the workspace lacks; return the paths copied, relative to it."""
    copied = []
    for relative, original in learner_files().items():
        target = Path(workspace) / relative
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(original, target)
            copied.append(relative)
    return copied


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python jupyter/learner/make_workspace.py WORKSPACE")
    copied = make_workspace(sys.argv[1])
    print(f"{sys.argv[1]}: {len(copied)} file(s) copied"
          + (f" ({', '.join(map(str, copied))})" if copied else ", the learner's files kept"))
