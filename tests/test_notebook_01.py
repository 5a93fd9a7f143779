"""Notebook 01 executes in the CPU profile and shows what it claims: each claim is checked
from the run records that execution wrote, and the printed summary against them."""
import pytest

from conftest import execute_notebook, notebook_text_outputs
from workshop_lib import profile, runlog
from workshop_lib.findings import sgd_and_batch_size as nb01

pytestmark = pytest.mark.slow  # starts processes: torchrun, spawned ranks, papermill

# The CPU profile on the offline dataset, as the tests execute the notebooks.
SWEEP = profile.get_profile("cpu", "digits")


@pytest.fixture(scope="module")
def batch_size(tmp_path_factory):
    runs_dir = tmp_path_factory.mktemp("01_sgd_and_batch_size")
    return execute_notebook("01_sgd_and_batch_size.ipynb", runs_dir), runs_dir


@pytest.fixture(scope="module")
def sweep(batch_size):
    _, runs_dir = batch_size
    runs = runlog.read_all(runs_dir / "batch_size")
    same_lr = sorted((run for run in runs.values() if run.start["lr"] == SWEEP.lr),
                     key=lambda run: run.start["global_batch_size"])
    linear = [run for run in runs.values() if run.start["lr"] != SWEEP.lr]
    return same_lr, linear


def test_sweep_covers_one_to_sixteen_times_the_profile_batch_with_100_steps(sweep):
    same_lr, linear = sweep
    assert [run.start["global_batch_size"] for run in same_lr] == [
        SWEEP.batch_size * k for k in (1, 2, 4, 8, 16)]
    epochs = SWEEP.sweep_epochs(16)
    assert all(len(run.epochs) == epochs for run in same_lr + linear), "one budget for all"
    largest = same_lr[-1]
    assert largest.start["steps_per_epoch"] * len(largest.epochs) >= 100
    assert len(linear) == 1 and linear[0].start["global_batch_size"] == 16 * SWEEP.batch_size
    assert linear[0].start["lr"] == pytest.approx(16 * SWEEP.lr)


def test_the_fixed_epoch_gap_and_the_linear_rule_from_the_records(sweep):
    same_lr, linear = sweep
    found = nb01.batch_size_sweep(same_lr, linear[0], SWEEP.batch_size)
    # Measured: batch 512 at the base rate 0.961 against 0.994, training loss 80x higher;
    # the linear rule 0.992.
    assert found["gap"].holds, found["gap"].text
    assert "under-trained" in found["gap"].text
    assert found["linear_restores"].holds, found["linear_restores"].text


def test_batch_size_notebook_shows_the_exercise_widget_and_computed_summary(batch_size, sweep):
    notebook, _ = batch_size
    same_lr, linear = sweep
    text = notebook_text_outputs(notebook)
    assert "PASS: my_sgd takes the same" in text, "the reference solution passes the check"
    for finding in nb01.batch_size_sweep(same_lr, linear[0], SWEEP.batch_size):
        assert finding.text in text
    assert "single sample ended at loss" in text
    widget_outputs = [out for cell in notebook.cells for out in cell.get("outputs", [])
                      if "application/vnd.jupyter.widget-view+json" in out.get("data", {})]
    assert widget_outputs, "the batch-size widget was not displayed"
