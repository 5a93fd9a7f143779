"""Notebook 04 executes in the CPU profile: each failure ends the way the notebook says.
Executing it again in the same folder gives the same outcomes: each demo's --out is
emptied first (notebook.fresh, required of every launch below), and a restart resumes only
from its own job's checkpoint (checkpoint.from_job, tests/test_checkpoint_and_scaling.py),
so the second execution is not run here."""
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import warnings
from pathlib import Path

import nbformat
import pytest

from conftest import REPO, execute_notebook, notebook_text_outputs
from workshop_lib import notebook as notebook_helpers
from workshop_lib import runlog, stacks
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
    assert "Timed out waiting" in text, "section 2's hang ends at its collective timeout"
    assert "Detected mismatch between collectives" in text, "TORCH_DISTRIBUTED_DEBUG=DETAIL"
    assert "PASS: the job finishes" in text
    dump = plain(text)
    assert "most recent call first" in dump, "each rank wrote its own stack: no tracer"
    for rank, line in when_things_go_wrong.WAITS.items():  # the answer is what the dump showed
        assert f"(debug_job.py:{when_things_go_wrong.line_of(line)})" in dump, (rank, line)
    # The picture after the answer reads the same dump: each rank at its line, in its call.
    assert "The picture of where each rank waits comes once" not in text
    script = Path(tempfile.mkdtemp()) / "debug_job.py"
    script.write_text((when_things_go_wrong.FILES / "debugging_stub.py").read_text())
    first_job = re.split(r"===== rank (\d) \(pid \d+\) =====", dump)[1:5]
    waiting = {int(rank): stacks.where_waiting(text, str(script))
               for rank, text in zip(first_job[::2], first_job[1::2], strict=True)}
    for rank, line in when_things_go_wrong.WAITS.items():
        assert waiting[rank]["line"] == when_things_go_wrong.line_of(line), waiting
        assert waiting[rank]["calls"] == line.removeprefix("dist.").split("(")[0], waiting


@pytest.mark.slow
def test_the_second_job_hangs_in_ddps_buffer_broadcast_and_its_fix_passes(executions):
    """Rank 0's stack goes from the script's evaluation forward into DDP's buffer broadcast;
    rank 1's from the barrier; the reference answer is those lines, and the fix passes."""
    _, _, text = executions[0]
    debugging = when_things_go_wrong
    forward = debugging.line_of(debugging.EVAL_WAITS[0], debugging.EVAL_STUB)
    barrier = debugging.line_of(debugging.EVAL_WAITS[1], debugging.EVAL_STUB)
    dump = plain(text)[plain(text).rindex("===== rank 0"):]  # the second job's, the last
    assert f"evaluate (debug_eval_job.py:{forward})" in dump
    assert f"main (debug_eval_job.py:{barrier})" in dump
    frames = [f"\n    {function} (" for function in (
        "_distributed_broadcast_coalesced", "_default_broadcast_coalesced",
        "_sync_module_buffers", "_sync_buffers", "_pre_forward", "forward")]
    frames.append(f"evaluate (debug_eval_job.py:{forward})")
    at = [dump.index(frame) for frame in frames]
    assert at == sorted(at), "the frames the notebook names, in the dump's order, top first"
    assert f"PASS: rank 0 waits in line {forward} (logits = model(x))" in text
    assert "def will_sync_module_buffers" in text, "the installed torch's rule, printed"
    assert text.count("PASS: the job finishes") == 2, "both fixes pass"


def plain(text):
    """Text without the terminal's colour codes (py-spy, where it serves, prints some)."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


@pytest.mark.slow
def test_summary_is_computed_and_torchrun_internals_stay_out(executions):
    results, restarted, text = executions[0]
    for finding in nb04.failures(results, 2, HANG_TIMEOUT_S, restarted):
        assert finding.text in text
    assert "ChildFailedError" not in text, "torchrun's traceback wall stays in the log folder"
    assert "rank 1 failed first" in text, "the summary names the rank that failed first"
    assert "[rank 1]" in text, "the other ranks' lines are tagged"


# Stack dumps without a tracer (workshop_lib/stacks.py): a learner account may have no
# ptrace rights (Ubuntu's kernel.yama.ptrace_scope=1, a container without SYS_PTRACE).

SLEEPER = """
import time
import workshop_lib  # sets up the rank's own stack dump (RANK and the folder are set)
def wait_here():
    print("ready", flush=True)
    while True:
        time.sleep(0.1)
wait_here()
"""


def test_a_rank_dumps_its_own_stack_on_a_signal_and_a_process_without_it_is_never_signalled(
        tmp_path, monkeypatch):
    folder = tmp_path / "stacks"
    env = {**os.environ, "RANK": "0", stacks.ENV: str(folder)}
    rank = subprocess.Popen([sys.executable, "-c", SLEEPER], env=env, stdout=subprocess.PIPE,
                            text=True, cwd=tmp_path)
    bare = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert rank.stdout.readline().strip() == "ready"
        monkeypatch.setattr(stacks, "py_spy", lambda pid: f"py-spy asked for {pid}")
        dumped = stacks.dump({0: rank.pid, 1: bare.pid}, folder)
        called_at = SLEEPER.splitlines().index("wait_here()") + 1
        assert re.search(r"^    wait_here \(<string>:\d+\)$", dumped[0], re.M), dumped[0]
        assert f"<module> (<string>:{called_at})" in dumped[0]
        assert dumped[0].index("wait_here") < dumped[0].index("<module>"), "innermost first"
        assert dumped[1] == f"py-spy asked for {bare.pid}", "no dump file: never signalled"
        assert rank.poll() is None and bare.poll() is None, "both still running"
        again = stacks.dump({0: rank.pid}, folder)[0]
        assert again.count("wait_here (") == 1, "each dump reads only what the rank added"
    finally:
        rank.kill()
        bare.kill()


def test_faulthandlers_dump_reads_as_py_spys():
    text = ('Current thread 0x00007f63 (most recent call first):\n'
            f'  File "{sysconfig.get_paths()["purelib"]}/torch/distributed/'
            'distributed_c10d.py", line 3913 in all_reduce\n'
            '  File "/elsewhere/debug_job.py", line 65 in main\n')
    assert stacks.readable(text) == ("Current thread 0x00007f63 (most recent call first):\n"
                                     "    all_reduce (torch/distributed/distributed_c10d.py:3913)\n"
                                     "    main (/elsewhere/debug_job.py:65)\n")


LEARNER_DUMP = """
import contextlib, io, json, re
from workshop_lib import labs, launch, stacks
assert stacks.py_spy_path() is None, "this account has no py-spy"
script = labs.get("debugging").stub(path="debug_job.py")
job = launch.start([str(script), "--out", "out", "--dist-timeout", "60"], nproc=2,
                   env={"CUDA_VISIBLE_DEVICES": ""}, quiet=True)
try:  # the notebook's steps
    if not job.wait_until_stuck(timeout=240):
        if job.process.poll() is None:
            raise SystemExit("the ranks never stopped: still changing after 240 s")
        result = job.result()  # the job ended before its ranks were seen waiting: how
        print(json.dumps({"ended": result.summary(), "output": "".join(result.output)}))
        raise SystemExit(3)
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        job.dump_stacks()
finally:
    job.stop()
dump = shown.getvalue()
ranks = re.split(r"===== rank (\\d) \\(pid \\d+\\) =====", dump)[1:]
frames = {int(r): re.findall(r"^ +(\\w+) \\((.*?):(\\d+)\\)$", t, re.M)
          for r, t in zip(ranks[::2], ranks[1::2])}
answer = {r: next(int(n) for _, file, n in f if file == "debug_job.py")
          for r, f in frames.items()}
verdict = labs.get("stuck_ranks").check(answer)
print(json.dumps({"dump": dump, "answer": answer, "ok": verdict.ok, "reason": verdict.reason}))
"""


@pytest.fixture
def learner_account():
    """A throw-away account with no rights beyond its own folder, and a Python that sees
    the course (its own venv, no py-spy in it or on its PATH): (user, python, folder)."""
    python = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    why = ("creates an account: needs root" if os.geteuid() != 0
           else "needs useradd and runuser (passwd, util-linux)"
           if not (shutil.which("useradd") and shutil.which("runuser"))
           else f"needs {python} (the system's Python of the course's version)"
           if not python.exists() else None)
    site_packages = Path(sysconfig.get_paths()["purelib"])
    blocked = [p for p in (site_packages, *site_packages.parents, REPO, *REPO.parents)
               if not p.stat().st_mode & 0o005]
    if why is None and blocked:
        why = f"{blocked[0]} is not readable by other accounts"
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"under CI, {why}")
        pytest.skip(why)
    base = Path(tempfile.mkdtemp(prefix="learner-stacks-"))
    base.chmod(0o755)
    user = f"ws-stacks-{os.getpid()}"
    try:
        subprocess.run([str(python), "-m", "venv", "--without-pip", str(base / "venv")],
                       check=True)
        venv_site = next((base / "venv" / "lib").glob("python*/site-packages"))
        (venv_site / "course.pth").write_text(f"{site_packages}\n{REPO}\n")
        torchrun = base / "venv" / "bin" / "torchrun"
        torchrun.write_text(f"#!{base}/venv/bin/python\nimport sys\n"
                            "from torch.distributed.run import main\nsys.exit(main())\n")
        torchrun.chmod(0o755)
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell",
                        "/usr/sbin/nologin", user], check=True)
        work = base / "work"
        work.mkdir()
        shutil.chown(work, user)
        yield user, base / "venv" / "bin" / "python", work
    finally:
        subprocess.run(["userdel", user], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
def test_a_learner_account_without_py_spy_reads_the_stuck_ranks_and_answers_from_it(
        learner_account):
    """The notebook's steps (write debug_job.py, start it, dump_stacks) as an ordinary
    account with no py-spy at all: each rank's stack comes from the rank itself, and the
    line of debug_job.py read from it passes stuck_ranks."""
    user, python, work = learner_account
    (work / "dump.py").write_text(LEARNER_DUMP)
    for attempt in (1, 2):
        done = subprocess.run(["runuser", "-u", user, "--", "env", "-i", "PATH=/usr/bin:/bin",
                               f"HOME={work}", "OMP_NUM_THREADS=1", str(python), "dump.py"],
                              cwd=work, capture_output=True, text=True, timeout=300)
        if done.returncode != 3:
            break
        # Once in some twenty CI runs the job ended within 40 s, before its ranks were seen
        # waiting (they wait 60 s); its cause was not reproduced here (14 runs of 14 beside
        # busy loops). Say how it ended, and try once more: a second end fails the test.
        ended = json.loads(done.stdout.splitlines()[-1])
        warnings.warn(f"attempt {attempt}: the debug job ended before it was seen stuck: "
                      f"{ended['ended']}\n{ended['output'][-3000:]}", stacklevel=1)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    said = json.loads(done.stdout.splitlines()[-1])
    assert said["ok"], said
    assert "most recent call first" in said["dump"], "the ranks' own dumps, not py-spy's"
    expected = {str(rank): when_things_go_wrong.line_of(line)
                for rank, line in when_things_go_wrong.WAITS.items()}
    assert said["answer"] == expected
