"""The course's Jupyter settings (jupyter/): installed into the environment by `make setup`,
and what nbgrader makes of them in and out of a course folder; the learner's JupyterLab
(jupyter/learner/, `make lab`): its workspace and the nbgrader parts it turns off. The
browser tests (test_browser.py) check their effect in JupyterLab itself."""
import importlib.util
import json
import os
import re
import shlex
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
    shipped = sorted(p.name for p in (REPO / "jupyter").iterdir() if p.is_file())
    assert shipped == sorted(INSTALLED_AS)
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_in_a_course_folder_nbgrader_keeps_its_own_settings(tmp_path):
    """Where nbgrader runs in a course folder (the instructor's commands in assessment/, or a
    copy of it), the environment's settings must not redirect it to the repository's."""
    (tmp_path / "nbgrader_config.py").write_text("c.Execute.timeout = 77\n")
    config = nbgrader_config_in(tmp_path)
    assert config["root"] is None  # nbgrader's default: the folder it runs in
    assert config["timeout"] == 77


# -- the learner's JupyterLab (make lab) -------------------------------------------------

LEARNER = REPO / "jupyter" / "learner"
NBGRADER_LAB_EXTENSION = Path(sys.prefix) / "share/jupyter/labextensions/@jupyter/nbgrader"
NBGRADER_SERVER_EXTENSIONS = Path(sys.prefix) / "etc/jupyter/jupyter_server_config.d/nbgrader.json"


def make_lab_command(**variables):
    dry_run = subprocess.run(
        ["make", "--no-print-directory", "-n", "-s", "lab", f"VENV={sys.prefix}",
         *(f"{name}={value}" for name, value in variables.items())],
        cwd=REPO, capture_output=True, text=True, check=True).stdout
    return next(line for line in dry_run.replace("\\\n", " ").splitlines()
                if "/jupyter lab " in line)


def test_learner_lab_turns_off_nbgrader_parts_for_instructors_only():
    """The panels (page config) and the server extensions `make lab` turns off are real
    nbgrader names, every one nbgrader has except the Validate button's."""
    plugins = set(re.findall(r'"(@jupyter/nbgrader:[a-z-]+)"', "".join(
        path.read_text(errors="replace")
        for path in (NBGRADER_LAB_EXTENSION / "static").glob("*.js"))))
    disabled = json.loads((LEARNER / "labconfig" / "page_config.json").read_text())[
        "disabledExtensions"]
    assert set(disabled) == plugins - {"@jupyter/nbgrader:validate-assignment"}
    assert all(disabled.values())

    enabled = json.loads(NBGRADER_SERVER_EXTENSIONS.read_text())["ServerApp"][
        "jpserver_extensions"]
    command = make_lab_command(WORKSPACE="/tmp/ws")
    off = set(re.findall(r"--ServerApp\.jpserver_extensions=([\w.]+)=False", command))
    assert set(off) == set(enabled) - {"nbgrader.server_extensions.validate_assignment"}
    assert f'JUPYTER_CONFIG_PATH="{LEARNER}"' in command
    assert "--ServerApp.root_dir=/tmp/ws" in shlex.split(command)


def test_learner_workspace_holds_copies_and_never_overwrites(tmp_path):
    """Notebooks and the assessment's release, copied when missing; a learner's edit
    survives the next `make lab`."""
    spec = importlib.util.spec_from_file_location("make_workspace", LEARNER / "make_workspace.py")
    make_workspace = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_workspace)
    workspace = tmp_path / "workspace"
    make_workspace.make_workspace(workspace)
    notebooks = sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb"))
    assert sorted(p.name for p in (workspace / "notebooks").iterdir()) == notebooks
    release = REPO / "assessment" / "release" / "ddp_refactor"
    assert sorted(p.name for p in (workspace / "ddp_refactor").iterdir()) == sorted(
        p.name for p in release.iterdir() if p.is_file()
        and p.name not in ("train_digits.py", "train_digits_ddp.py"))
    assert (workspace / "deploy" / "train_ddp.sbatch").read_bytes() == (
        REPO / "deploy" / "train_ddp.sbatch").read_bytes(), "notebook 06 reads deploy/"
    assert (workspace / "deploy" / "schemas" / "trainjob.schema.json").is_file()
    assert sorted(p.name for p in workspace.iterdir()) == ["ddp_refactor", "deploy", "notebooks"]
    edited = workspace / "ddp_refactor" / "ddp_refactor.ipynb"
    edited.write_text("a learner's work")
    (workspace / "notebooks" / notebooks[0]).unlink()
    copied = make_workspace.make_workspace(workspace)
    assert copied == [Path("notebooks") / notebooks[0]]
    assert edited.read_text() == "a learner's work"
    assert (workspace / "notebooks" / notebooks[0]).read_bytes() == (
        REPO / "notebooks" / notebooks[0]).read_bytes()


@pytest.mark.slow
def test_validate_in_the_learners_lab_uses_the_course_time_limits(tmp_path):
    """nbgrader's Validate handler reads its settings from the server's folder (the
    repository, where `make lab` runs) and the Jupyter config path, the learner's folder
    included: the course's time limit applies, not nbgrader's 30 s per cell."""
    env = {key: value for key, value in os.environ.items()
           if key != "WORKSHOP_ASSESSMENT_DIR"}
    env.update(JUPYTER_CONFIG_DIR=str(tmp_path / "user"), JUPYTER_CONFIG_PATH=str(LEARNER))
    result = subprocess.run([sys.executable, "-c", LOAD_NBGRADER_CONFIG], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120, check=True)
    config = json.loads(result.stdout.splitlines()[-1])
    assert config["timeout"] == course_timeout(REPO / "assessment") > 30
