"""Every notebook is committed clean, starts the same way, and launches on the profile's device.

No execution here: these read the committed notebooks (the executed ones are tested by
tests/test_notebook_*.py).
"""
import re

import nbformat
import pytest

from conftest import REPO

NOTEBOOKS = sorted(p.name for p in (REPO / "notebooks").glob("[0-9]*.ipynb"))
# A course script started from a cell: it must say which device it runs on.
LAUNCH = re.compile(r"-m workshop_lib\.(train|train_ddp|sweep|equivalence|trace)\b")


def code_cells(name):
    notebook = nbformat.read(REPO / "notebooks" / name, as_version=4)
    return notebook, [cell for cell in notebook.cells if cell.cell_type == "code"]


def test_every_section_has_a_notebook():
    assert len(NOTEBOOKS) >= 5, NOTEBOOKS


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_committed_clean_with_a_parameters_cell(name):
    notebook, cells = code_cells(name)
    assert notebook.metadata["kernelspec"]["name"] == "python3"
    assert all(not cell.outputs and cell.execution_count is None for cell in cells)
    assert "parameters" in cells[0].metadata.get("tags", [])
    for parameter in ("profile", "dataset", "nproc", "runs_dir"):
        assert re.search(rf"^{parameter} = ", cells[0].source, re.M), parameter
    assert "notebook.setup(profile, dataset, nproc, runs_dir" in cells[1].source


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_every_launch_names_its_device(name):
    _, cells = code_cells(name)
    for cell in cells:
        # A launch may continue over several lines (trailing backslashes): join them.
        source = cell.source.replace("\\\n", " ")
        for line in source.splitlines():
            if LAUNCH.search(line) and "naive_ddp" not in line:
                assert "--device" in line, f"{name}: {line.strip()}"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_one_heading_style(name):
    """The title is "# NN · Title" with the notebook's number; numbered sections are
    "## N · Section" (unnumbered ones, like the closing summary, are plain "## Title")."""
    notebook = nbformat.read(REPO / "notebooks" / name, as_version=4)
    headings = [line for cell in notebook.cells if cell.cell_type == "markdown"
                for line in cell.source.splitlines() if line.startswith("#")]
    assert re.match(rf"^# {name[:2]} · \S", headings[0]), headings[0]
    for heading in headings[1:]:
        assert not heading.startswith("# "), f"one title per notebook: {heading}"
        assert not re.match(r"^##+ (Part )?\d+[.:]", heading), \
            f"numbered as '## N · Section': {heading}"


def test_every_file_a_notebook_writes_beside_it_is_git_ignored():
    """A learner's work, and what a notebook's cells write next to it (%%writefile, or a
    library call given ``path="..."``), stay out of the repository's changes."""
    import subprocess

    written = set()
    for name in NOTEBOOKS:
        text = (REPO / "notebooks" / name).read_text()
        written |= set(re.findall(r"%%writefile ([\w./-]+)", text))
        written |= set(re.findall(r'path=\\"([\w./-]+)\\"', text))
    assert {"my_train_ddp.py", "prepare_once.py", "debug_job.py"} <= written, written
    result = subprocess.run(["git", "check-ignore", "--no-index", *sorted(written)],
                            cwd=REPO / "notebooks", capture_output=True, text=True)
    ignored = set(result.stdout.split())
    assert ignored == written, f"not ignored: {sorted(written - ignored)}"


def test_each_execution_under_test_writes_beside_the_notebook_in_a_folder_of_its_own(tmp_path):
    """Two executions of one notebook at once (the references' and the stubs', in two test
    processes) never share the folder their scripts are written to, and neither is the
    repository's notebooks/; notebook 06 finds the cluster files at ../deploy there."""
    from conftest import notebook_workspace

    first, second = (notebook_workspace(tmp_path / name) for name in ("02", "02-stubs"))
    assert first != second and first.name == second.name == "notebooks"
    for folder in (first, second):
        assert folder.is_dir() and REPO not in folder.parents
        assert (folder.parent / "deploy" / "train_ddp.sbatch").is_file()
