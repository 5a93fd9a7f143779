"""The launcher's report of a failed job, from torchrun's output and the ranks' logs."""
import io
import json
import os
import sys

from workshop_lib import launch

ROOT_CAUSE = """Root Cause (first observed failure):
[0]:
  time      : 2026-11-30_13:36:17
  rank      : 1 (local_rank: 1)
  exitcode  : {code} (pid: 5411)
"""


def rank_log(tmp_path, rank, text, name="stderr.log"):
    folder = tmp_path / "run-id" / "attempt_0" / str(rank)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)
    return folder


def test_the_error_file_names_the_error(tmp_path):
    folder = rank_log(tmp_path, 1, "")
    (folder / "error.json").write_text(json.dumps({"message": {"message": "ValueError: bad"}}))
    assert launch._root_cause(ROOT_CAUSE.format(code=1), tmp_path) == (1, 1, "ValueError: bad")


def test_a_scripts_one_line_error_wins_over_its_traceback(tmp_path):
    rank_log(tmp_path, 1, "Traceback (most recent call last):\n"
                          "[rank1]: RuntimeError: something deep\nerror: --lr must be positive\n")
    assert launch._root_cause(ROOT_CAUSE.format(code=2), tmp_path)[2] == "--lr must be positive"


def test_without_an_error_file_the_traceback_s_last_exception_is_named(tmp_path):
    rank_log(tmp_path, 1, '[rank1]:   File "x.py", line 3, in f\n[rank1]:     work.wait()\n'
                          "[rank1]: RuntimeError: [gloo] Timed out waiting 20000ms for recv\n")
    rank, code, message = launch._root_cause(ROOT_CAUSE.format(code=1), tmp_path)
    assert (rank, code) == (1, 1)
    assert message == "RuntimeError: [gloo] Timed out waiting 20000ms for recv"


def test_the_summary_says_which_rank_failed_how(tmp_path):
    killed = launch.LaunchResult(returncode=1, attempts=2, log_dir=tmp_path, failed_rank=1,
                                 exitcode=-9, seconds=12.3)
    summary = killed.summary()
    assert "after 1 restart(s)" in summary and "rank 1 failed first (killed by SIGKILL)" in summary
    assert killed.outcome()["exitcode"] == -9 and not killed.outcome()["ok"]
    assert launch.LaunchResult(0, 1, tmp_path, seconds=3).summary() == "SUCCESS in 3 s."


def test_a_job_that_ended_on_its_own_says_so_and_can_still_be_stopped(tmp_path, capsys):
    """The notebook reads a stuck job's stacks, then stops it; if the job's collective
    timed out first (a slow machine), the dump says how the job ended, and ``stop`` finds
    nothing to stop and says nothing, as it does when called twice."""
    job = launch.Job([sys.executable, "-c", "raise SystemExit(3)"], dict(os.environ),
                     tmp_path, quiet=True, stream=io.StringIO())
    job.process.wait(timeout=60)
    assert job.dump_stacks() == {}
    said = capsys.readouterr().out
    assert said.startswith("no rank is running: the job has ended. FAILED after"), said
    assert "exit code 3" in said, said
    job.stop()
    job.stop()
    assert job.result().returncode == 3
