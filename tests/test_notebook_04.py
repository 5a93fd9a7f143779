"""Notebook 04 executes in the CPU profile: each failure ends the way the notebook says.
Executing it again in the same folder gives the same outcomes: each demo's --out is
emptied first (notebook.fresh, required of every launch below), and a restart resumes only
from its own job's checkpoint (checkpoint.from_job, tests/test_checkpoint_and_scaling.py),
so the second execution is not run here."""
import ast
import re

import nbformat
import pytest

from conftest import REPO, execute_notebook, notebook_text_outputs
from workshop_lib import notebook as notebook_helpers
from workshop_lib import runlog
from workshop_lib.findings import when_things_go_wrong as nb04
from workshop_lib.labs import when_things_go_wrong

HANG_TIMEOUT_S = 15
NOTEBOOK = "04_when_things_go_wrong.ipynb"


@pytest.fixture(scope="module")
def executions(tmp_path_factory):
    """The notebook executed once: [(results, restart run, text)]."""
    runs = tmp_path_factory.mktemp("04")
    notebook = execute_notebook(NOTEBOOK, runs)
    return [(runlog.load_json(runs / "failures.json"), runlog.read(runs / "restart"),
             notebook_text_outputs(notebook))]


def test_every_launch_writes_to_a_folder_emptied_first():
    """A second execution starts each demo clean: every --out of a launch in the notebook
    is notebook.fresh(...), so no checkpoint, run record or error file of the first
    execution is read as this one's."""
    cells = [c.source for c in nbformat.read(REPO / "notebooks" / NOTEBOOK, as_version=4).cells
             if c.cell_type == "code" and not c.source.startswith("%%")]
    outs = []
    for node in ast.walk(ast.parse("\n".join(cells))):
        if isinstance(node, ast.List):
            items = node.elts
            outs += [items[i + 1] for i, item in enumerate(items[:-1])
                     if isinstance(item, ast.Constant) and item.value == "--out"]
    assert len(outs) >= 6, "crash, hang, debugging, restart, uninterrupted, the second job"
    for out in outs:
        assert re.fullmatch(r"notebook\.fresh\(.*\)", ast.unparse(out)), ast.unparse(out)


def test_fresh_empties_the_folder(tmp_path):
    folder = tmp_path / "restart"
    folder.mkdir()
    (folder / "checkpoint.pt").write_bytes(b"an earlier run's")
    assert notebook_helpers.fresh(folder) == str(folder)
    assert not folder.exists()
    assert notebook_helpers.fresh(tmp_path / "never_made") == str(tmp_path / "never_made")


@pytest.mark.slow
def test_every_failure_ends_as_the_notebook_says(executions):
    results, restarted, _ = executions[0]
    found = nb04.failures(results, 2, HANG_TIMEOUT_S, restarted)
    assert [f.key for f in found] == ["crash", "hang", "restart"]
    assert all(f.holds for f in found), [f.text for f in found]
    crash, hang = results["crash"], results["hang"]
    assert crash["failed_rank"] == 1 and "InjectedFault" in crash["error"]
    assert crash["fault_to_exit_s"] < nb04.FAIL_FAST_S
    assert hang["failed_rank"] == 0, "the rank left waiting reports the timeout"
    assert HANG_TIMEOUT_S <= hang["fault_to_exit_s"] < HANG_TIMEOUT_S + nb04.FAIL_FAST_S


@pytest.mark.slow
def test_the_restart_resumes_from_its_own_first_checkpoint(executions):
    results, restarted, _ = executions[0]
    assert results["restart"]["ok"] and results["restart"]["attempts"] == 2
    assert [r["start_epoch"] for r in restarted.resumes] == [2]
    assert restarted.column("epoch") == [1, 2, 3]
    assert restarted.final["val_acc"] >= 0.95


@pytest.mark.slow
def test_the_resumed_job_is_the_uninterrupted_one_bit_for_bit(executions):
    _, _, text = executions[0]
    assert "bit for bit the same job (the bar: 0.0)" in text


@pytest.mark.slow
def test_the_debugging_exercise_shows_the_hang_names_it_and_the_fix_passes(executions):
    _, _, text = executions[0]
    assert "===== rank 0" in text and "===== rank 1" in text, "each stuck rank's stack"
    assert "PASS: rank 0 waits in line" in text, "where each rank waits, answered first"
    assert "Timed out waiting" in text, "the stuck job ends at its collective timeout"
    assert "Detected mismatch between collectives" in text, "TORCH_DISTRIBUTED_DEBUG=DETAIL"
    assert "PASS: the job finishes" in text
    dump = plain(text)
    for rank, line in when_things_go_wrong.WAITS.items():  # the answer is what py-spy showed
        assert f"(debug_job.py:{when_things_go_wrong.line_of(line)})" in dump, (rank, line)


@pytest.mark.slow
def test_the_second_job_hangs_in_ddps_buffer_broadcast_and_its_fix_passes(executions):
    """Rank 0's stack goes from the script's evaluation forward into DDP's buffer broadcast;
    rank 1's from the barrier; the reference answer is those lines, and the fix passes."""
    _, _, text = executions[0]
    debugging = when_things_go_wrong
    forward = debugging.line_of(debugging.EVAL_WAITS[0], debugging.EVAL_STUB)
    barrier = debugging.line_of(debugging.EVAL_WAITS[1], debugging.EVAL_STUB)
    dump = plain(text)[plain(text).index("debug_eval_job.py --out"):]
    assert f"evaluate (debug_eval_job.py:{forward})" in dump
    assert f"main (debug_eval_job.py:{barrier})" in dump
    frames = ["._distributed_broadcast_coalesced (", "._default_broadcast_coalesced (",
              "._sync_module_buffers (", "._sync_buffers (", "._pre_forward (", ".forward (",
              f"evaluate (debug_eval_job.py:{forward})"]
    at = [dump.index(frame) for frame in frames]
    assert at == sorted(at), "the frames the notebook names, in the dump's order, top first"
    assert f"PASS: rank 0 waits in line {forward} (logits = model(x))" in text
    assert "def will_sync_module_buffers" in text, "the installed torch's rule, printed"
    assert text.count("PASS: the job finishes") == 2, "both fixes pass"


def plain(text):
    """Text without the terminal's colour codes (py-spy prints some)."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


@pytest.mark.slow
def test_summary_is_computed_and_torchrun_internals_stay_out(executions):
    results, restarted, text = executions[0]
    for finding in nb04.failures(results, 2, HANG_TIMEOUT_S, restarted):
        assert finding.text in text
    assert "ChildFailedError" not in text, "torchrun's traceback wall stays in the log folder"
    assert "rank 1 failed first" in text, "the summary names the rank that failed first"
    assert "[rank 1]" in text, "the other ranks' lines are tagged"
