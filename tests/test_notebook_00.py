"""Notebook 00 executes in the CPU profile and shows what it claims: each claim is checked
from the run records that execution wrote, and the printed summary against them."""
import pytest

from conftest import execute_notebook, notebook_text_outputs
from workshop_lib import doctor, profile, runlog
from workshop_lib.findings import welcome as nb00

pytestmark = pytest.mark.slow  # starts processes: torchrun, spawned ranks, papermill

# The CPU profile on the offline dataset, as the tests execute the notebooks.
WELCOME = profile.get_profile("cpu", "digits", launches=profile.PROCESSES)


@pytest.fixture(scope="module")
def welcome(tmp_path_factory):
    runs_dir = tmp_path_factory.mktemp("00_welcome")
    return execute_notebook("00_welcome.ipynb", runs_dir), runs_dir


def test_welcome_reports_the_machine_and_the_profile(welcome):
    notebook, _ = welcome
    text = notebook_text_outputs(notebook)
    assert all(line in text for line in doctor.report())
    assert WELCOME.describe() in text
    assert f"DEVICE=cpu NPROC={WELCOME.nproc} DDP_DEVICE=cpu DATASET={WELCOME.dataset}" in text


def test_welcome_first_run_is_a_learning_ddp_run_and_the_summary_reads_it(welcome):
    notebook, runs_dir = welcome
    run = runlog.read(runs_dir / "first_run")
    assert run.start["world_size"] == WELCOME.nproc and run.start["backend"] == "gloo"
    assert run.start["global_batch_size"] == WELCOME.nproc * WELCOME.batch_size
    assert len(run.epochs) == 3 and run.end is not None
    found = nb00.welcome(run, WELCOME, num_classes=10)
    assert found["learned"].holds, found["learned"].text
    # Measured 0.93 after three epochs; ten classes, so guessing scores 0.10.
    assert run.final["val_acc"] > 0.7
    text = notebook_text_outputs(notebook)
    assert all(finding.text in text for finding in found)
    assert "PASS: 2 process(es) on cpu" in text, "the observation exercise's reference"
