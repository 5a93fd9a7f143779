"""`make gpu-check`, the instructor's check of a GPU image: its CPU-runnable parts, here."""
import pytest

from conftest import run_course_command
from workshop_lib import gpu_check, hardware, runlog
from workshop_lib.hardware import Machine


def test_without_a_gpu_it_says_so_in_one_line(capsys, monkeypatch):
    monkeypatch.setattr(hardware, "detect", lambda: Machine(gpus=0))  # on any machine
    with pytest.raises(SystemExit) as stop:
        gpu_check.main(["--out", "unused"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs a GPU that PyTorch can use" in err[0]


def test_an_unknown_notebook_is_named(capsys):
    with pytest.raises(SystemExit):
        gpu_check.main(["--profile", "cpu", "--notebooks", "99_nothing"])
    assert "no notebook named 99_nothing" in capsys.readouterr().err


@pytest.mark.slow
def test_the_report_holds_each_steps_time_result_and_figures(tmp_path):
    """The orchestration and the report, on the CPU: the GPU tests (all skipped here, the
    GPUs hidden, so that on a GPU workstation they do not run nested in this test), one
    notebook executed by papermill, no bench."""
    result = run_course_command(["-m", "workshop_lib.gpu_check", "--profile", "cpu",
                                 "--notebooks", "00_welcome", "--no-bench",
                                 "--out", str(tmp_path)], timeout=900,
                                env={"CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    report = runlog.load_json(tmp_path / "report.json")
    names = [step["name"] for step in report["steps"]]
    assert names == ["GPU tests (pytest -m gpu)", "00_welcome"]
    assert all(step["ok"] and step["seconds"] > 0 for step in report["steps"])
    welcome = report["steps"][1]
    assert any("the environment works" in line for line in welcome["figures"])
    assert report["notebooks_s"] == pytest.approx(welcome["seconds"])
    markdown = (tmp_path / "report.md").read_text()
    assert "| 00_welcome | pass |" in markdown and "budget of 15 min" in markdown
    assert (tmp_path / "notebooks" / "00_welcome.ipynb").is_file()
