"""nbgrader's settings for the assessment. nbgrader reads this file from the folder it
runs in: run every nbgrader command (or `make ...`) from this folder."""
import importlib.util
import sys
from pathlib import Path

from nbgrader.converters import Autograde
from nbgrader.preprocessors import (
    CheckCellMetadata,
    ClearOutput,
    DeduplicateIds,
    Execute,
    OverwriteCells,
    OverwriteKernelspec,
)

c = get_config()  # noqa: F821 - nbgrader defines get_config when it loads this file

c.CourseDirectory.course_id = "ddp-workshop"

# Files the notebook writes when it runs, next to it: in source/ when the instructor
# validates it (train_digits_ddp.py is then the solution!), in a learner's folder when
# they work. Never copy them into release/, nor from a submission into autograded/
# (where the notebook writes them afresh).
c.CourseDirectory.ignore = [
    ".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback",
    "train_digits.py", "train_digits_ddp.py", "runs", "grading_run",
]

# Each launch of a learner's script is stopped after ddp_checks.Config.time_limit_s
# (300 s); the first test cell launches it twice (the graded run, then one process for the
# speed-up), so a cell may take twice that plus start-up, and no cell more than this.
c.Execute.timeout = 720


def _load_autograde_guard():
    """autograde_guard.py, next to this file, loaded by its path: nothing is added to
    sys.path of the process that reads this configuration (a JupyterLab server too)."""
    path = Path(__file__).resolve().with_name("autograde_guard.py")
    spec = importlib.util.spec_from_file_location("ddp_workshop_autograde_guard", path)
    module = sys.modules.get(spec.name)
    if module is None:
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return module


# Grade the assignment's own cells and files only, with the instructor's grading files
# (autograde_guard.py says why): nbgrader's sanitize step, with the three guards between its
# DeduplicateIds and OverwriteCells.
_guard = _load_autograde_guard()
c.Autograde.sanitize_preprocessors = [
    ClearOutput, DeduplicateIds, OverwriteKernelspec,
    _guard.KeepAssignmentCellsOnly, _guard.KeepAssignmentFilesOnly,
    _guard.UseInstructorGradingFiles,
    OverwriteCells, CheckCellMetadata,
]
# The grading kernel on private Unix sockets, not on TCP ports another account can read.
c.Autograde.autograde_preprocessors = [
    _guard.ExecuteOverPrivateSockets if preprocessor is Execute else preprocessor
    for preprocessor in Autograde.class_traits()["autograde_preprocessors"].default()]

# The cell in which learners write their script: always graded as the file it writes.
c.KeepAssignmentCellsOnly.script_cell = "ddp_script"
c.KeepAssignmentCellsOnly.script_first_line = "%%writefile train_digits_ddp.py"

# The formgrader shows each submission on the class's origin (the hub's, in the class):
# markdown and outputs are sanitized there (no script, no event handler), so that a page it
# renders cannot act with the instructor's login. Learners' own cells are dropped before
# grading anyway (KeepAssignmentCellsOnly); this holds whatever reaches a rendered page.
c.HTMLExporter.sanitize_html = True
