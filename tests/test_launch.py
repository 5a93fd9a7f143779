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


# A rank's stderr after its all-reduce timed out on GPUs, in ProcessGroupNCCL's own format
# (torch 2.11-2.14: WorkNCCL::checkTimeout, Watchdog::runLoop, Watchdog::run): the watchdog
# thread, not Python, reports it and takes the process down (SIGABRT).
WATCHDOG_LOG = """\
[rank1]:[E1204 10:31:07.152 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective \
operation timeout: WorkNCCL(SeqNum=57, OpType=ALLREDUCE, NumelIn=2770, NumelOut=2770, \
Timeout(ms)=5000) ran for 5081 milliseconds before timing out.
[rank1]:[E1204 10:31:07.153 ProcessGroupNCCL.cpp:2275] [PG ID 0 PG GUID 0(default_pg) Rank 1] \
failure detected by watchdog at work sequence id: 57 PG status: last enqueued work: 57, \
last completed work: 56
[rank1]:[E1204 10:31:23.160 ProcessGroupNCCL.cpp:687] [Rank 1] To avoid data inconsistency, \
we are taking the entire process down.
terminate called after throwing an instance of 'c10::DistBackendError'
  what():  [PG ID 0 PG GUID 0(default_pg) Rank 1] Process group watchdog thread terminated \
with exception: [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=57, \
OpType=ALLREDUCE, NumelIn=2770, NumelOut=2770, Timeout(ms)=5000) ran for 5081 milliseconds \
before timing out.
"""


def test_an_nccl_watchdog_timeout_is_named_with_its_collective_and_dumps(tmp_path):
    """On GPUs the summary names the collective the watchdog caught (rank, operation,
    sequence number, sizes, timeout) and where the Flight Recorder put each rank's dump;
    the launcher sets where those go and the settings that end the rank promptly."""
    rank_log(tmp_path, 0, "")
    rank_log(tmp_path, 1, WATCHDOG_LOG)
    assert launch.watchdog_timeout(tmp_path, rank=0) is None
    env = launch.flight_recorder_env(tmp_path)
    dump = tmp_path / launch.FLIGHT_RECORDER / "rank_1"
    assert env["TORCH_FR_DUMP_TEMP_FILE"] + "1" == str(dump)
    dump.write_bytes(b"pickled entries")
    rank, code, message = launch._root_cause(ROOT_CAUSE.format(code=-6), tmp_path)
    assert (rank, code) == (1, -6)
    assert message.startswith("NCCL's watchdog: rank 1's ALLREDUCE (collective #57 of its "
                              "process group, 2,770 elements) ran 5 s, past its 5 s timeout")
    assert f"torchfrtrace {dump.parent} -p rank_" in message
    summary = launch.LaunchResult(1, 1, tmp_path, failed_rank=rank, exitcode=code,
                                  error=message, seconds=31).summary()
    assert "rank 1 failed first (killed by SIGABRT): NCCL's watchdog" in summary
    assert launch.NCCL_FAIL_FAST_ENV["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"
    # 4 x the dump wait: the watchdog's sleep before it takes the rank down, under 30 s.
    assert 4 * int(launch.NCCL_FAIL_FAST_ENV["TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC"]) < 30_000


def test_every_launch_sets_the_watchdogs_settings_unless_the_learner_did(monkeypatch):
    seen = {}
    monkeypatch.setattr(launch, "Job", lambda command, env, log_dir, *a: seen.update(
        env=env, log_dir=log_dir))
    monkeypatch.setenv("TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC", "9000")  # the learner's own
    launch.start(["-m", "workshop_lib.train_ddp"], nproc=1)
    assert seen["env"]["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"
    assert seen["env"]["TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC"] == "9000"
    assert seen["env"]["TORCH_FR_DUMP_TEMP_FILE"].startswith(
        str(seen["log_dir"] / launch.FLIGHT_RECORDER))


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
