"""nbgrader settings for the course's JupyterLab. `make setup` installs this file into the
environment (.venv/etc/jupyter/), where nbgrader finds it wherever it runs.

nbgrader otherwise reads only the nbgrader_config.py of the folder it runs in. `make lab`
and `make instructor` run JupyterLab from the repository root, where there is none, so
without this file the instructor's formgrader would take the whole repository for a course
folder (and create a gradebook.db there), and a learner's *Validate* button would run the
assessment with nbgrader's default limit of 30 s per cell, which the graded torchrun launch
always exceeds.

So, wherever the folder nbgrader runs in has no nbgrader_config.py of its own: the course
folder is the repository's assessment/ (or the folder $WORKSHOP_ASSESSMENT_DIR names), and
that folder's nbgrader_config.py applies. In a course folder (assessment/, where the
instructor runs nbgrader's commands) this file changes nothing.
"""
import importlib.util
import os
from pathlib import Path

c = get_config()  # noqa: F821 - nbgrader defines get_config when it loads this file


def course_folder():
    if os.environ.get("WORKSHOP_ASSESSMENT_DIR"):
        return Path(os.environ["WORKSHOP_ASSESSMENT_DIR"]).resolve()
    # workshop_lib is installed in development mode (pip install -e): it lives in the
    # repository, next to assessment/. find_spec locates it without importing it.
    spec = importlib.util.find_spec("workshop_lib")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).resolve().parent.parent / "assessment"


if not Path("nbgrader_config.py").is_file():
    course = course_folder()
    if course is not None and (course / "nbgrader_config.py").is_file():
        c.CourseDirectory.root = str(course)
        load_subconfig(str(course / "nbgrader_config.py"))  # noqa: F821 - as get_config
