"""Notebook 02 executes in the CPU profile with the exercises' reference solutions: each
exercise's check passes, and the comparison of one device with N processes is computed
from its own run records."""
import html as html_module

import pytest

from workshop_lib import ddp_diff, profile, runlog
from workshop_lib.findings import from_one_gpu_to_many as nb02
from workshop_lib.labs.from_one_gpu_to_many import QUESTIONS as sampler_questions

pytestmark = pytest.mark.slow  # starts processes: torchrun, spawned ranks, papermill
P = profile.get_profile("cpu", "digits", launches=profile.PROCESSES)
SEEDS = 3


@pytest.fixture(scope="module")
def executed(notebook_02):
    return notebook_02


def test_every_exercise_passes_with_its_reference_solution(executed):
    _, _, text = executed
    assert "PASS: all 7 requirements met: your script is a correct DDP job" in text
    assert f"PASS: all {len(sampler_questions)} predictions match what the sampler did" in text
    assert "PASS: your wrapper trains exactly as DDP does" in text
    assert "- Same numbers: after 20 steps your wrapper's parameters are DDP's" in text
    assert "NOT YET" not in text


def test_one_device_against_n_processes_at_the_scaled_rate(executed):
    runs, _, text = executed
    one_device = list(runlog.read_all(runs / "one_device").values())
    scaled = list(runlog.read_all(runs / "scaled").values())
    assert len(one_device) == len(scaled) == SEEDS
    assert {run.start["args"]["seed"] for run in scaled} == {str(s) for s in range(SEEDS)}
    for run in one_device:
        assert run.start["world_size"] == 1 and run.start["lr"] == pytest.approx(P.lr)
    for run in scaled:
        assert run.start["world_size"] == P.nproc
        assert run.start["lr"] == pytest.approx(P.lr * P.nproc), "the linear rule"
        assert run.start["warmup_steps"] == run.start["steps_per_epoch"]
    assert all(run.final["val_acc"] >= 0.95 for run in one_device + scaled)
    promise, rows = nb02.same_accuracy_in_less_time(one_device, scaled)
    for finding in promise:
        assert finding.text in text
    assert nb02.worked_example_table(rows) in text
    assert "3.4x" in text and "within 0.2 pp" in text
    assert nb02.tolerance_resolution(scaled[0])["resolution"].text in text
    # Weak scaling on these runs, in its own cell after the promise and in the summary
    assert text.count(nb02.scaling_efficiency(one_device, scaled)["scaling"].text) == 2
    assert nb02.rank_vocabulary(scaled[0])[1] in text


def test_weak_scaling_is_read_right_after_the_promise_is_measured(executed):
    _, notebook, _ = executed
    sources = [cell.source for cell in notebook.cells]
    promise = next(i for i, src in enumerate(sources) if "same_accuracy_in_less_time(" in src)
    law = next(i for i, src in enumerate(sources) if "findings.scaling_efficiency(" in src)
    explained = next(i for i, src in enumerate(sources) if "**parallel overhead**" in src)
    assert promise < explained < law <= explained + 1 < promise + 4
    # Amdahl's law named for what it is (work done once), not fitted to an epoch.
    assert "**weak scaling**" in sources[explained] and "Amdahl's law (1967)" in \
        sources[explained] and "no ceiling" in sources[explained]


def test_benchmark_compares_scaling_with_the_bandwidth_floor(executed):
    runs, _, text = executed
    bench = runlog.load_json(runs / "bench.json")
    weak = [r for r in bench["scaling"] if r["mode"] == "weak" and r["world_size"] == 2]
    assert weak and all(0 < r["predicted_efficiency"] <= 1.0 for r in weak)
    for finding in nb02.bench_scaling(bench):
        assert finding.text in text


def test_the_diff_is_rendered_step_by_step_and_shards_are_explained(executed):
    _, notebook, text = executed
    rendered = [out["data"]["text/html"] for cell in notebook.cells
                for out in cell.get("outputs", []) if "text/html" in out.get("data", {})]
    for step in ddp_diff.EXERCISE_STEPS:  # the exercise's own diff, every step named
        assert any(html_module.escape(step) in html for html in rendered), step
    assert not any("TensorLoader" in html for html in rendered), "not the course's diff"
    assert "global (sum of counts, as train_ddp all-reduces them)" in text
