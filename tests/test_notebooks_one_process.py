"""Every notebook executes with ``nproc = 1``: the shape of a run with one process per
launch. Nothing may crash; what needs two processes says it was skipped, and why.

(The default, two processes, is executed by tests/test_notebook_*.py.)
"""
import pytest
from test_notebook_hygiene import NOTEBOOKS

from conftest import execute_notebook, notebook_text_outputs
from workshop_lib import runlog

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_executes_with_one_process(name, tmp_path):
    notebook = execute_notebook(name, tmp_path, nproc=1)
    text = notebook_text_outputs(notebook)
    assert "Traceback" not in text
    for path in tmp_path.rglob("run.jsonl"):
        assert runlog.read(path).start["world_size"] == 1, f"{path} had several processes"
    if name.startswith(("02", "04")):
        assert "Skipped:" in text, "a part that needs two processes says it was skipped"
