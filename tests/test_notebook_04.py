"""Notebook 04 executes in the CPU profile: each failure ends the way the notebook says."""
import json

import pytest

from conftest import execute_notebook, notebook_text_outputs


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    runs = tmp_path_factory.mktemp("04")
    notebook = execute_notebook("04_when_things_go_wrong.ipynb", runs)
    return json.loads((runs / "failures.json").read_text()), notebook


def test_a_crash_ends_the_job_fast_and_names_the_rank(executed):
    crash = executed[0]["crash"]
    assert not crash["ok"] and crash["failed_rank"] == 1
    assert "InjectedFault" in crash["error"] and crash["fault_to_exit_s"] < 60


def test_a_one_sided_collective_times_out_instead_of_hanging(executed):
    hang = executed[0]["hang"]
    assert not hang["ok"] and hang["failed_rank"] == 0
    assert 15 <= hang["fault_to_exit_s"] < 60


def test_a_killed_rank_restarts_and_the_job_finishes(executed):
    restart = executed[0]["restart"]
    assert restart["ok"] and restart["attempts"] == 2
    assert restart["resumed_at_epoch"] == [2] and restart["epochs"] == [1, 2, 3, 4]
    assert restart["final_val_acc"] >= 0.95


def test_summary_is_computed(executed):
    text = notebook_text_outputs(executed[1])
    assert "A killed rank cost one restart (2 attempts)" in text
    assert "ChildFailedError" not in text
