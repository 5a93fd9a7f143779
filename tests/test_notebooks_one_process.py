"""Every notebook executes with ``nproc = 1`` and the exercises' stubs, as a learner who
runs it top to bottom before writing anything would. Nothing may crash: each exercise's
check says NOT YET with its reason, and what needs two processes says it was skipped.

(The default, two processes with the reference solutions, is executed by
tests/test_notebook_*.py. This run is about the paths the notebooks take, not about what
their runs show, so every parameter that sizes a measurement is cut to the least that
still takes each path: QUICK.)
"""
import pytest
from test_notebook_hygiene import NOTEBOOKS

from conftest import execute_notebooks_side_by_side, notebook_text_outputs
from workshop_lib import labs, runlog

pytestmark = pytest.mark.slow
# Each notebook's parameters that size its runs, at their least (a notebook ignores the
# ones it does not have): 01/03's sweeps, 02's seeds per arm, 05's comparison epochs,
# 07's timing rounds. A sweep cell takes the same path at any length (one device, whatever
# nproc is), and the references' execution runs it at the notebook's own length: here 2
# epochs, a warmup's share and a last epoch to settle on (the whole fixture measured 237
# CPU-s against 254 at 6 epochs, on 2 idle cores).
QUICK = {"sweep_epochs": 2, "seeds": 1, "epochs": 1, "rounds": 2}


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """Every notebook executed this way, two at a time: ``{name: (SideBySide, runs dir)}``
    (a notebook that fails to execute fails its own test below, and no other)."""
    runs = [(name, tmp_path_factory.mktemp(name[:2]), {"nproc": 1, "solutions": False, **QUICK})
            for name in NOTEBOOKS]
    notebooks = execute_notebooks_side_by_side(runs)
    return {name: (notebooks[name], runs_dir) for name, runs_dir, _ in runs}


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_executes_with_one_process(name, executed):
    outcome, tmp_path = executed[name]
    notebook = outcome.notebook()
    text = notebook_text_outputs(notebook)
    assert "Traceback" not in text
    exercises = [e for e in labs._load().values() if name.startswith(e.notebook)]
    verdicts = [line for line in text.splitlines() if line.startswith("NOT YET: ")]
    for exercise in exercises:  # the stub half of `make check-labs`, in the learner's path
        assert any(exercise.stub_reason in line for line in verdicts), (
            f"{exercise.key}: its stub is not judged NOT YET with {exercise.stub_reason!r}: "
            f"{verdicts}")
    for path in tmp_path.rglob("run.jsonl"):
        assert runlog.read(path).start["world_size"] == 1, f"{path} had several processes"
    if name.startswith(("02", "04")):
        assert "Skipped:" in text, "a part that needs two processes says it was skipped"
