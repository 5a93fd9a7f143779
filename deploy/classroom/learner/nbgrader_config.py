"""nbgrader for a learner in the class: the class's exchange and course (class.json, which
`classroom.py init` writes beside this folder). nbgrader names the learner by their Unix
account.
"""
import json
from pathlib import Path

c = get_config()  # noqa: F821 - nbgrader defines get_config when it loads this file

_class = json.loads((Path(__file__).resolve().parent.parent / "class.json").read_text())
c.Exchange.root = _class["exchange"]
c.CourseDirectory.course_id = _class["course_id"]
