"""Notebook 03 executes in the CPU profile and reproduces each claim from its own run records."""
import json
from pathlib import Path

import pytest

from conftest import execute_notebook, notebook_text_outputs
from workshop_lib import runlog

pytestmark = pytest.mark.slow  # starts processes: torchrun, spawned ranks, papermill


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    runs = tmp_path_factory.mktemp("03")
    notebook = execute_notebook("03_keeping_accuracy_at_scale.ipynb", runs)
    acc = {name: run.final["val_acc"] for name, run in runlog.read_all(runs / "base_lr").items()}
    hot = {name: run.final["val_acc"] for name, run in runlog.read_all(runs / "hot_lr").items()}
    return acc, hot, notebook


def test_large_batch_at_the_base_rate_ends_well_below_the_small_batch(executed):
    acc, _, _ = executed
    assert acc["small"] >= 0.95
    assert acc["large_same_lr"] < acc["small"] - 0.2


def test_linear_scaling_closes_most_of_the_gap(executed):
    acc, _, _ = executed
    gap = acc["small"] - acc["large_same_lr"]
    assert acc["large_linear"] - acc["large_same_lr"] > 0.6 * gap
    assert acc["large_linear_warmup"] > acc["large_same_lr"] + 0.5 * gap


def test_linear_scaling_breaks_from_a_hot_base_rate_and_is_rescued(executed):
    _, hot, _ = executed
    assert hot["large_linear"] < 0.7, "the scaled rate should be past the edge of stability"
    assert hot["large_linear_warmup"] > hot["large_linear"], "warmup helps"
    assert hot["large_sqrt"] > hot["large_linear"] + 0.2, "the sqrt rule avoids the blow-up"
    assert hot["large_linear_lars"] >= 0.9, "LARS trains at the full linear rate"


def test_summary_reports_the_reproduced_claims(executed):
    _, _, notebook = executed
    text = notebook_text_outputs(notebook)
    assert "NOT reproduced" not in text
    assert text.count("reproduced") >= 2


def test_extras_measure_accumulation_precision_and_batchnorm(executed):
    _, _, notebook = executed
    extras = json.loads((Path(notebook.metadata.papermill.parameters["runs_dir"])
                         / "extras.json").read_text())
    accumulation = extras["accumulation"]
    assert accumulation["no_sync"]["allreduce_calls"] == 1
    assert accumulation["all_reduce_every_micro_batch"]["allreduce_calls"] == 4
    assert accumulation["max_abs_difference_vs_one_big_batch"] < 1e-5
    precision = extras["mixed_precision"]
    assert abs(precision["bf16_autocast"]["final_loss"] - precision["fp32"]["final_loss"]) < 0.1
    assert precision["fp32"]["final_loss"] < 2.0, "the 20 steps must have trained"
    assert not extras["batchnorm"]["sync_batchnorm_used"]  # CPU: SyncBatchNorm needs CUDA
    assert extras["batchnorm"]["running_mean_spread_across_ranks"] > 1e-4
