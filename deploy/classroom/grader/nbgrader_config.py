"""nbgrader for the formgrader, the grader account's server (the hub names this folder in
JUPYTER_CONFIG_PATH): the grader's copy of the course's assessment/ is the course folder,
with its own nbgrader_config.py (the course id, the time limits and the grading guards),
and the class's exchange.
"""
import json
import sys
from pathlib import Path

c = get_config()  # noqa: F821 - nbgrader defines get_config when it loads this file

_class = json.loads((Path(__file__).resolve().parent.parent / "class.json").read_text())
c.CourseDirectory.root = _class["course_folder"]
c.Exchange.root = _class["exchange"]
# nbgrader also reads the nbgrader_config.py of the folder it runs in; the formgrader runs
# in the course folder, but a grader's command may not.
_course_config = Path(_class["course_folder"]) / "nbgrader_config.py"
if Path("nbgrader_config.py").resolve() != _course_config:
    load_subconfig(str(_course_config))  # noqa: F821 - as get_config
# Collect takes only submissions that belong to the learner they name (classroom_collect.py,
# beside this file).
sys.path.insert(0, str(Path(__file__).resolve().parent))
c.ExchangeFactory.collect = "classroom_collect.OwnedCollect"
