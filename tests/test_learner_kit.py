"""The learner kit (`make learner-kit`, jupyter/learner/make_kit.py): what learners' machines
and images get holds nothing of the assessment's solution, graded run or graded
submissions, and the course works from it alone.

What counts as the solution is read from the instructor's files at test time
(assessment/source/, tests/assessment_submissions/), never from the kit.
"""
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from traitlets.config.loader import PyFileConfigLoader

from conftest import REPO, notebook_text_outputs, stderr_outputs
from workshop_lib import profile

SOURCE = REPO / "assessment" / "source" / "ddp_refactor"
SUBMISSIONS = REPO / "tests" / "assessment_submissions"
SOLUTION = ("### BEGIN SOLUTION", "### END SOLUTION")
HIDDEN = ("### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")


def load_make_kit():
    spec = importlib.util.spec_from_file_location("make_kit",
                                                  REPO / "jupyter" / "learner" / "make_kit.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_kit = load_make_kit()


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    kit = tmp_path_factory.mktemp("learner") / "kit"
    make_kit.make_kit(kit)
    return kit


# -- reading files as text ----------------------------------------------------------------

def text_of(path):
    """A file's text (a notebook's: its cells' sources), or None for a binary file."""
    if path.suffix == ".ipynb":
        return "\n".join(cell.source for cell in nbformat.read(path, as_version=4).cells)
    try:
        return path.read_text()
    except UnicodeDecodeError:
        return None


def normalized(text):
    """Lines stripped, blank ones dropped, joined: indentation and spacing do not hide a copy."""
    return "\n".join(line.strip() for line in text.splitlines() if line.strip())


def holds(text, lines):
    """Whether ``text`` has ``lines`` (normalized) as consecutive whole lines."""
    return f"\n{normalized(lines)}\n" in f"\n{normalized(text)}\n"


def regions(text, markers):
    """The texts between nbgrader's begin and end markers."""
    begin, end = markers
    found, current = [], None
    for line in text.splitlines():
        if line.strip().startswith(begin):
            current = []
        elif line.strip().startswith(end):
            found.append("\n".join(current))
            current = None
        elif current is not None:
            current.append(line)
    return found


def instructor_texts():
    """Every text file of the assessment's source (its notebook's cells included)."""
    return {path: text_of(path) for path in sorted(SOURCE.iterdir()) if path.is_file()}


def kit_texts(kit):
    return {path: text for path in sorted(kit.rglob("*")) if path.is_file()
            for text in [text_of(path)] if text is not None}


def solution_script():
    """The assessment's script cell as the solution has it, markers removed."""
    notebook = nbformat.read(SOURCE / "ddp_refactor.ipynb", as_version=4)
    cell = next(cell for cell in notebook.cells
                if cell.metadata.get("nbgrader", {}).get("grade_id") == "ddp_script")
    return "\n".join(line for line in cell.source.splitlines()
                     if not line.strip().startswith(SOLUTION))


# -- the rule -----------------------------------------------------------------------------

def test_the_rule_leaves_out_the_instructors_paths_and_keeps_the_release():
    """Paths an instructor's checkout has, tracked or made by nbgrader."""
    left_out = [
        "assessment/source/ddp_refactor/ddp_refactor.ipynb", "assessment/gradebook.db",
        "assessment/submitted/alice/ddp_refactor/ddp_refactor.ipynb",
        "assessment/autograded/alice/ddp_refactor/ddp_refactor.ipynb",
        "assessment/feedback/alice/ddp_refactor/ddp_refactor.html", "assessment/grades.csv",
        "assessment/nbgrader_config.py", "assessment/autograde_guard.py",
        "assessment/export_grades.py", "assessment/README.md", "assessment/Makefile",
        "assessment/release_old/ddp_refactor/ddp_refactor.ipynb",
        "tests/assessment_submissions/alt_style.py", "tests/conftest.py", ".ci/run",
        "jupyter/learner/make_kit.py",
    ]
    kept = [
        "assessment/release/ddp_refactor/ddp_refactor.ipynb",
        "assessment/release/ddp_refactor/ddp_checks.py",
        "assessment/release/ddp_refactor/ddp_checks_gradients.py",
        "assessment/release/ddp_refactor/ddp_recorder_replay.py", "notebooks/00_welcome.ipynb",
        "workshop_lib/labs/files/conversion_solution.py", "workshop_lib/train_ddp.py",
        "jupyter/learner/make_workspace.py", "jupyter/nbgrader_config.py", "Makefile",
        "pyproject.toml", "README.md", "deploy/train_ddp.sbatch", "notebooks/tests.ipynb",
    ]
    assert [path for path in left_out if make_kit.in_kit(path)] == []
    assert [path for path in kept if not make_kit.in_kit(path)] == []


def git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_the_kit_is_the_tracked_files_less_the_rule_whatever_the_repository_holds(tmp_path):
    """A repository the builder has never seen: its new notebook is in the kit without any
    list to update, what is not tracked (a gradebook, submissions, a workspace) is not,
    and the kit's nbgrader settings are the instructor's Validate ones only."""
    repo = tmp_path / "repo"
    files = {
        "notebooks/08_new.ipynb": "{}", "workshop_lib/new.py": "",
        "assessment/release/a/a.ipynb": "{}", "assessment/source/a/a.ipynb": "{}",
        "assessment/nbgrader_config.py": "c.Execute.timeout = 99\n"
                                         "c.Autograde.exclude_overwriting = {'a': ['x.py']}\n",
        "tests/test_new.py": "", ".ci/run": "",
    }
    for path, text in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    git(repo, "init", "-q")
    git(repo, "add", ".")
    for untracked in ["assessment/gradebook.db", "assessment/submitted/bo/a/a.ipynb",
                      "workspace/notebooks/08_new.ipynb", "notebooks/scratch.py"]:
        (repo / untracked).parent.mkdir(parents=True, exist_ok=True)
        (repo / untracked).write_text("not tracked")

    made = make_kit.make_kit(tmp_path / "kit", repo=repo)
    assert made == sorted(["notebooks/08_new.ipynb", "workshop_lib/new.py",
                           "assessment/release/a/a.ipynb", make_kit.VALIDATE_CONFIG,
                           make_kit.KIT_README])
    assert sorted(str(p.relative_to(tmp_path / "kit")) for p in (tmp_path / "kit").rglob("*")
                  if p.is_file()) == made
    config = PyFileConfigLoader("nbgrader_config.py",
                                path=str(tmp_path / "kit" / "assessment")).load_config()
    assert config.Execute.timeout == 99 and "Autograde" not in config

    with pytest.raises(make_kit.KitError, match="not an empty folder"):
        make_kit.make_kit(tmp_path / "kit", repo=repo)
    with pytest.raises(make_kit.KitError, match="not a git checkout"):
        make_kit.make_kit(tmp_path / "kit2", repo=tmp_path / "kit")


# -- the course's kit ---------------------------------------------------------------------

def test_the_kit_holds_the_course_and_nothing_of_the_instructors(kit):
    tracked = make_kit.tracked_files()
    copied = {str(p.relative_to(kit)) for p in kit.rglob("*") if p.is_file()} - {
        make_kit.VALIDATE_CONFIG, make_kit.KIT_README}
    assert not (kit / ".git").exists()
    assert not any(path.startswith(("tests/", ".ci/")) for path in copied)
    assert {path for path in copied if path.startswith("assessment/")} == {
        path for path in tracked if path.startswith("assessment/release/")}
    assert not any(part in ("gradebook.db", "submitted", "autograded", "feedback")
                   for path in copied for part in Path(path).parts)
    # The course itself, byte for byte: every notebook, the library, the set-up.
    for path in tracked:
        if path.startswith(("notebooks/", "workshop_lib/", "jupyter/", "deploy/")) or path in (
                "Makefile", "pyproject.toml", "environment.yml", "README.md", "LICENSE"):
            if path != "jupyter/learner/make_kit.py":
                assert (kit / path).read_bytes() == (REPO / path).read_bytes(), path


def test_no_solution_no_graded_run_and_no_graded_submission_in_the_kit(kit):
    texts = kit_texts(kit)
    for marker in (*SOLUTION, *HIDDEN):
        assert not [path for path, text in texts.items() if marker in text], marker

    instructor = instructor_texts()
    release_notebook = text_of(REPO / "assessment" / "release" / "ddp_refactor"
                               / "ddp_refactor.ipynb")
    # The graded run's settings: the lines of the hidden tests that learners do not see,
    # and any number of five digits or more in them (a seed).
    hidden = [line.strip() for source in instructor.values()
              for region in regions(source, HIDDEN) for line in region.splitlines()
              if line.strip() and line.strip() not in release_notebook]
    assert hidden, "the source's hidden tests were not found: this test reads them"
    seeds = {number for line in hidden for number in re.findall(r"\b\d{5,}\b", line)}
    for path, text in texts.items():
        assert not [line for line in hidden if line in text], path
        assert not seeds & set(re.findall(r"\b\d{5,}\b", text)), path

    # The solution: any block of three lines or more, and the whole solved script.
    blocks = [region for source in instructor.values() for region in regions(source, SOLUTION)
              if len(normalized(region).splitlines()) >= 3]
    assert blocks, "the source's solution was not found: this test reads it"
    submissions = [path.read_text() for path in sorted(SUBMISSIONS.glob("*.py"))]
    assert submissions, "no graded submissions found in tests/assessment_submissions/"
    for path, text in texts.items():
        assert not [block for block in blocks if holds(text, block)], path
        assert not holds(text, solution_script()), path
        assert not [sub for sub in submissions if holds(text, sub)], path


def test_the_kits_validate_settings_are_the_instructors(kit):
    """Without them a learner's Validate button would stop the graded launch at nbgrader's
    30 s per cell; nothing else of the grading settings goes."""
    ours = PyFileConfigLoader("nbgrader_config.py", path=str(kit / "assessment")).load_config()
    theirs = PyFileConfigLoader("nbgrader_config.py",
                                path=str(REPO / "assessment")).load_config()
    assert ours.Execute.timeout == theirs.Execute.timeout > 30
    assert set(ours) == {section for section in make_kit.VALIDATE_SECTIONS if section in theirs}
    for section in ours:
        assert dict(ours[section]) == dict(theirs[section]), section


def test_the_kits_make_refuses_the_instructors_targets_in_one_line(kit, tmp_path):
    for target in ("test", "instructor", "learner-kit"):
        # Should the refusal break, set-up fails at once (PYTHON=false) instead of installing.
        result = subprocess.run(["make", "--no-print-directory", target,
                                 f"VENV={tmp_path / 'venv'}", "PYTHON=false"],
                                cwd=kit, capture_output=True, text=True, timeout=60)
        assert result.returncode == 2
        assert "run it in the course repository" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and not result.stdout
    lab = subprocess.run(["make", "--no-print-directory", "-n", "-s", "lab",
                          f"VENV={sys.prefix}", "WORKSPACE=workspace"], cwd=kit,
                         capture_output=True, text=True, check=True).stdout
    assert "jupyter/learner/make_workspace.py workspace" in lab
    assert f'JUPYTER_CONFIG_PATH="{kit}/jupyter/learner"' in lab


def test_the_kits_workspace_is_made_from_the_kit(kit, tmp_path):
    """`make lab`'s workspace, by the kit's own make_workspace.py."""
    workspace = tmp_path / "workspace"
    subprocess.run([sys.executable, str(kit / "jupyter/learner/make_workspace.py"),
                    str(workspace)], check=True, capture_output=True)
    notebooks = sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb"))
    assert sorted(p.name for p in (workspace / "notebooks").iterdir()) == notebooks
    assert sorted(p.name for p in (workspace / "ddp_refactor").iterdir()) == sorted(
        p.name for p in (kit / "assessment/release/ddp_refactor").iterdir())


# -- the course from the kit alone --------------------------------------------------------

def kit_env(kit, scratch):
    """The environment of a learner's machine that has the kit: the course's Python (as
    `make setup` makes it), the kit's library and Jupyter settings, nothing of this
    repository."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "JUPYTER_CONFIG_PATH", "WORKSHOP_ASSESSMENT_DIR",
                          "WORKSHOP_DATA_DIR")}
    env.update(PYTHONPATH=str(kit), JUPYTER_CONFIG_PATH=str(kit / "jupyter"),
               JUPYTER_CONFIG_DIR=str(scratch / "jupyter-user"), PYTHONUNBUFFERED="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    return env


LOAD_VALIDATE_CONFIG = """
import json, os
from jupyter_core.paths import jupyter_config_path
from nbgrader.apps import NbGrader
app = NbGrader()
app.config_file_paths.append([os.getcwd(), *jupyter_config_path()])
app.load_config_file()
print(json.dumps(app.config.Execute.get("timeout")))
"""


@pytest.mark.slow
def test_the_course_runs_from_the_kit_alone(tmp_path):
    """In the kit's workspace, with the kit's library: the assessment's visible tests pass
    a correct script under nbgrader's Validate, and notebook 00 runs with its exercise."""
    kit = tmp_path / "kit"
    make_kit.make_kit(kit)
    env = kit_env(kit, tmp_path)
    workspace = kit / "workspace"
    subprocess.run([sys.executable, "jupyter/learner/make_workspace.py", "workspace"],
                   cwd=kit, env=env, check=True, capture_output=True)

    def run(args, cwd, timeout=600):
        result = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                                text=True, timeout=timeout)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        return result.stdout

    origin = run(["-c", "import importlib.util as u; print(u.find_spec('workshop_lib').origin)"],
                 cwd=workspace / "notebooks")
    assert Path(origin.strip()).is_relative_to(kit), origin

    assignment = workspace / "ddp_refactor"
    timeout = json.loads(run(["-c", LOAD_VALIDATE_CONFIG], cwd=assignment).splitlines()[-1])
    assert timeout == make_kit_timeout(kit) > 30, "Validate's time limit in the kit"
    notebook = nbformat.read(assignment / "ddp_refactor.ipynb", as_version=4)
    script = next(cell for cell in notebook.cells
                  if cell.metadata.get("nbgrader", {}).get("grade_id") == "ddp_script")
    script.source = solution_script()
    nbformat.write(notebook, assignment / "ddp_refactor.ipynb")
    validated = run(["-m", "nbgrader", "validate", "ddp_refactor.ipynb"], cwd=assignment)
    assert "Success! Your notebook passes all the tests." in validated, validated[-3000:]

    executed = tmp_path / "00_welcome.ipynb"
    parameters = {"profile": "cpu", "dataset": "digits", "solutions": True}
    run(["-m", "papermill", "00_welcome.ipynb", str(executed), "-k", "python3",
         "--no-progress-bar", "-y", json.dumps(parameters)], cwd=workspace / "notebooks")
    executed = nbformat.read(executed, as_version=4)
    assert not stderr_outputs(executed)
    welcome = profile.get_profile("cpu", "digits", launches=profile.PROCESSES)
    assert f"PASS: {welcome.nproc} process(es) on cpu" in notebook_text_outputs(executed)
    record = workspace / "notebooks" / "runs" / "00_welcome" / "first_run" / "run.jsonl"
    assert record.is_file(), "the notebook's run writes its record in the kit's workspace"


def make_kit_timeout(kit):
    return PyFileConfigLoader("nbgrader_config.py",
                              path=str(kit / "assessment")).load_config().Execute.timeout
