"""The course's Jupyter settings (jupyter/): installed into the environment by `make setup`,
and what nbgrader makes of them in and out of a course folder. The browser tests
(test_browser.py) check their effect in JupyterLab itself."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from traitlets.config.loader import PyFileConfigLoader

from conftest import REPO

# Each shipped file and where `make setup` puts it, relative to the environment's prefix.
INSTALLED_AS = {
    "overrides.json5": "share/jupyter/lab/settings/overrides.d/ddp-workshop.json5",
    "jupyter_server_config.py": "etc/jupyter/jupyter_server_config.py",
    "nbgrader_config.py": "etc/jupyter/nbgrader_config.py",
}
# How nbgrader's Validate button and formgrader load their settings in the server.
LOAD_NBGRADER_CONFIG = """
import json, os
from jupyter_core.paths import jupyter_config_path
from nbgrader.apps import NbGrader
app = NbGrader()
app.config_file_paths.append([os.getcwd(), *jupyter_config_path()])
app.load_config_file()
print(json.dumps({"root": app.config.CourseDirectory.get("root"),
                  "timeout": app.config.Execute.get("timeout")}))
"""


def test_every_shipped_setting_is_installed_into_the_environment():
    assert sorted(p.name for p in (REPO / "jupyter").iterdir()) == sorted(INSTALLED_AS)
    for name, installed in INSTALLED_AS.items():
        path = Path(sys.prefix) / installed
        assert path.exists(), f"{path} missing: run `make setup`"
        assert path.read_bytes() == (REPO / "jupyter" / name).read_bytes(), (
            f"{path} differs from jupyter/{name}: run `make setup`")


def nbgrader_config_in(folder, assessment_dir=None):
    env = {key: value for key, value in os.environ.items()
           if key != "WORKSHOP_ASSESSMENT_DIR"}
    # An empty user config folder: only the environment's settings (and the folder's own).
    env["JUPYTER_CONFIG_DIR"] = str(folder / ".jupyter-user")
    if assessment_dir:
        env["WORKSHOP_ASSESSMENT_DIR"] = str(assessment_dir)
    result = subprocess.run([sys.executable, "-c", LOAD_NBGRADER_CONFIG], cwd=folder, env=env,
                            capture_output=True, text=True, timeout=120, check=True)
    return json.loads(result.stdout.splitlines()[-1])


def course_timeout(course):
    config = PyFileConfigLoader("nbgrader_config.py", path=str(course)).load_config()
    return config.Execute.timeout


@pytest.mark.parametrize("chosen", [None, "copy"])
def test_outside_a_course_folder_nbgrader_uses_the_assessment(tmp_path, chosen):
    """JupyterLab runs from the repository root: its formgrader and Validate button must
    use assessment/ (or the folder WORKSHOP_ASSESSMENT_DIR names) and its time limits."""
    course = REPO / "assessment"
    if chosen:
        course = tmp_path / "course"
        course.mkdir()
        (course / "nbgrader_config.py").write_text("c.Execute.timeout = 123\n")
    server_folder = tmp_path / "server"
    server_folder.mkdir()
    config = nbgrader_config_in(server_folder, assessment_dir=course if chosen else None)
    assert config["root"] == str(course.resolve())
    assert config["timeout"] == course_timeout(course)
    # nbgrader's default (30 s per cell) is shorter than the graded torchrun launch.
    assert config["timeout"] > 30


def test_in_a_course_folder_nbgrader_keeps_its_own_settings(tmp_path):
    """Where nbgrader runs in a course folder (the instructor's commands in assessment/, or a
    copy of it), the environment's settings must not redirect it to the repository's."""
    (tmp_path / "nbgrader_config.py").write_text("c.Execute.timeout = 77\n")
    config = nbgrader_config_in(tmp_path)
    assert config["root"] is None  # nbgrader's default: the folder it runs in
    assert config["timeout"] == 77
