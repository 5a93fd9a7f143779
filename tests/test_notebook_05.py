"""Notebook 05 executes in the CPU profile: each tool of the worked example is measured,
the GPU-only parts say why they did not run, and the exercise's reference passes."""
import pytest

from conftest import execute_notebook, notebook_text_outputs
from workshop_lib import profile, runlog
from workshop_lib.findings import worked_example as nb05

pytestmark = pytest.mark.slow  # starts processes: torchrun, papermill
P = profile.get_profile("cpu", "digits")


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    runs = tmp_path_factory.mktemp("05")
    notebook = execute_notebook("05_worked_example.ipynb", runs)
    return runs, notebook_text_outputs(notebook)


def test_precision_runs_record_what_they_change(executed):
    runs, text = executed
    precision = runlog.read_all(runs / "precision")
    assert {run.start["amp"] for run in precision.values()} == {"off", "bf16", "fp16"}
    for run in precision.values():
        assert run.final["val_acc"] >= 0.9 and run.epochs[0]["saved_activation_bytes"] > 0
    for finding in nb05.precision(precision):
        assert finding.text in text


def test_the_remedies_keep_the_global_batch_and_save_memory(executed):
    runs, text = executed
    remedies = runlog.read_all(runs / "remedies")
    assert {run.start["global_batch_size"] for run in remedies.values()} == {4 * P.batch_size}
    found = nb05.remedies(remedies, "plain")
    # Measured: accumulation saves 4x (a quarter of the batch per step), checkpointing half.
    assert found["smaller_batch_accumulate"].holds and found["checkpointing"].holds
    for finding in found:
        assert finding.text in text
    assert "Skipped: no GPU allocator to run out of" in text


def test_accumulation_the_exercise_and_the_trace(executed):
    runs, text = executed
    equivalence = runlog.load_json(runs / "equivalence.json")
    assert nb05.accumulation(equivalence["accumulation"])["accumulation"].holds
    assert "PASS: global batch 256 in" in text
    assert "Skipped: DataParallel against DDP needs two GPUs" in text
    trace = runlog.load_json(runs / "trace" / "summary.json")
    assert trace["setup"]["world_size"] == P.nproc
    assert (runs / "trace" / "trace_rank0.json").is_file()
    found = nb05.step_time(trace)
    assert found["step_time"].holds, found["step_time"].text  # compute + exposed ~ the step
    assert found["step_time"].text in text
    if P.nproc > 1:  # the trace fitted the all-reduce floor on its own ranks
        assert trace["floor"]["floor_ms"] > 0 and "The all-reduce floor for" in text


def test_the_input_bound_check_measures_both_feeds_and_says_so_twice(executed):
    runs, text = executed
    measured = runlog.load_json(runs / "input_feed.json")
    assert measured["num_workers"] == 0 and measured["pin_memory"] is False  # the CPU profile
    assert measured["steps"] > 0 and all(r > 0 for r in measured["samples_per_s"].values())
    sentence = nb05.input_bound(measured)["input_bound"].text
    # In the section's own cell and in the closing summary.
    assert text.count(sentence) == 2, sentence


def test_the_knee_curve_spans_the_profiles_batch_and_the_reference_finds_its_knee(executed):
    _, text = executed
    assert "PASS: my_knee finds the knee of 5 curves" in text
    found = [line for line in text.splitlines() if "Your knee: batch" in line]
    assert found, "the knee's finding reads this machine's curve with the learner's my_knee"
    assert f"The profile trains at batch {P.batch_size} per device" in found[0]
    # The reference's knee is the rule's, so the finding adds no correction.
    assert "By the rule" not in found[0]
