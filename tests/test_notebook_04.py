"""Notebook 04 executes in the CPU profile: each failure ends the way the notebook says,
and executing it again in the same folder gives the same outcomes (each demo starts clean,
and a restart resumes only from its own job's checkpoint)."""
import pytest

from conftest import execute_notebook, notebook_text_outputs
from workshop_lib import runlog
from workshop_lib.findings import when_things_go_wrong as nb04

pytestmark = pytest.mark.slow
HANG_TIMEOUT_S = 15


@pytest.fixture(scope="module")
def executions(tmp_path_factory):
    """The notebook executed twice in one runs folder: (results, restart run, text) each."""
    runs = tmp_path_factory.mktemp("04")
    outcomes = []
    for _ in range(2):
        notebook = execute_notebook("04_when_things_go_wrong.ipynb", runs)
        outcomes.append((runlog.load_json(runs / "failures.json"), runlog.read(runs / "restart"),
                         notebook_text_outputs(notebook)))
    return outcomes


def test_every_failure_ends_as_the_notebook_says(executions):
    results, restarted, _ = executions[0]
    found = nb04.failures(results, 2, HANG_TIMEOUT_S, restarted)
    assert [f.key for f in found] == ["crash", "hang", "restart"]
    assert all(f.holds for f in found), [f.text for f in found]
    crash, hang = results["crash"], results["hang"]
    assert crash["failed_rank"] == 1 and "InjectedFault" in crash["error"]
    assert hang["failed_rank"] == 0, "the rank left waiting reports the timeout"
    assert HANG_TIMEOUT_S <= hang["fault_to_exit_s"] < HANG_TIMEOUT_S + nb04.FAIL_FAST_S


def test_the_restart_resumes_from_its_own_first_checkpoint(executions):
    results, restarted, _ = executions[0]
    assert results["restart"]["ok"] and results["restart"]["attempts"] == 2
    assert [r["start_epoch"] for r in restarted.resumes] == [2]
    assert restarted.column("epoch") == [1, 2, 3]
    assert restarted.final["val_acc"] >= 0.95


def test_a_second_execution_in_the_same_folder_gives_the_same_outcomes(executions):
    (first, first_run, _), (second, second_run, _) = executions
    keys = ("ok", "attempts", "failed_rank", "exitcode")
    for demo in ("crash", "hang", "restart"):
        assert {k: first[demo][k] for k in keys} == {k: second[demo][k] for k in keys}, demo
    assert [r["start_epoch"] for r in second_run.resumes] == [2], \
        "the second restart resumed from its own checkpoint, not the first execution's"
    assert second_run.column("epoch") == [1, 2, 3]


def test_the_resumed_job_is_the_uninterrupted_one_bit_for_bit(executions):
    _, _, text = executions[0]
    assert "bit for bit the same job (the bar: 0.0)" in text


def test_the_debugging_exercise_shows_the_hang_names_it_and_the_fix_passes(executions):
    _, _, text = executions[0]
    assert "===== rank 0" in text and "===== rank 1" in text, "each stuck rank's stack"
    assert "PASS: rank 0 waits in line" in text, "where each rank waits, answered first"
    assert "Timed out waiting" in text, "the stuck job ends at its collective timeout"
    assert "Detected mismatch between collectives" in text, "TORCH_DISTRIBUTED_DEBUG=DETAIL"
    assert "PASS: the job finishes" in text


def test_summary_is_computed_and_torchrun_internals_stay_out(executions):
    results, restarted, text = executions[0]
    for finding in nb04.failures(results, 2, HANG_TIMEOUT_S, restarted):
        assert finding.text in text
    assert "ChildFailedError" not in text
