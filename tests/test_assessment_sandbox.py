"""The grader's sandbox (assessment/source/ddp_refactor/ddp_sandbox.py), attacked by real
submissions through the real launch path: ``ddp_checks.launch`` under torchrun, in a copy
of a course folder laid out as nbgrader's (source/ with the hidden tests, gradebook.db,
submitted/, autograded/<learner>/), with a hub token in the grader's environment.

The submission tries to read the hidden tests (by absolute and relative path), the
gradebook and other submissions, to write into the course folder and the grader's home, to
read the token, and leaves a child in a session of its own; it writes what it saw into its
--out folder, which the test reads. While it runs, every process's command line is read
for the graded run's settings. Then: a job that never ends is stopped at its time limit
with everything it started; the same attack from a grader that is not root (the
unprivileged sandbox, in a user namespace); and the refusal while grading where no sandbox
can be made.
"""
import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "assessment" / "source" / "ddp_refactor"
# The files beside the notebook: the checks and the recorder, each with its rooms, the
# sandbox and the data module.
PROVIDED = ("ddp_checks.py", "ddp_checks_rules.py", "ddp_checks_run.py", "ddp_checks_launch.py",
            "ddp_checks_training.py", "ddp_checks_gradients.py", "ddp_checks_rank0.py",
            "ddp_recorder.py", "ddp_recorder_data.py", "ddp_recorder_steps.py",
            "ddp_recorder_outputs.py", "ddp_recorder_replay.py", "ddp_sandbox.py",
            "digits_data.py")
SCRIPT = "train_digits_ddp.py"
# The graded run's settings: numbers no other process on the machine has on its command line.
HIDDEN = {"epochs": 3, "batch_size": 7, "lr": 0.0417, "seed": 86420917}
TOKEN = "hub-token-that-must-not-leak"
NOBODY = 65534

pytestmark = pytest.mark.slow

ATTACK = r'''
import json, os, sys, time
from pathlib import Path

COURSE, HOME, MARK = Path({course!r}), Path({home!r}), {mark!r}
rank = int(os.environ.get("RANK", 0))
seen = {{"argv": sys.argv[1:], "uid": os.getuid(), "env": sorted(os.environ),
        "token": os.environ.get("JUPYTERHUB_API_TOKEN"), "home": os.environ.get("HOME")}}


def attempt(name, action):
    try:
        seen[name] = ["succeeded", repr(action())[:80]]
    except Exception as error:
        seen[name] = ["failed", type(error).__name__]


if rank == 0:
    notebook = Path("source", "ddp_refactor", "ddp_refactor.ipynb")
    attempt("read hidden tests", lambda: (COURSE / notebook).read_text())
    attempt("read hidden tests by ../", lambda: Path("../../../..", notebook).read_text())
    attempt("read gradebook", lambda: (COURSE / "gradebook.db").read_bytes())
    attempt("list submitted", lambda: os.listdir(COURSE / "submitted"))
    attempt("read another learner", lambda: (COURSE / "submitted" / "bob" / "ddp_refactor"
                                              / "ddp_refactor.ipynb").read_text())
    attempt("read the checks beside the notebook", lambda: Path("../ddp_checks.py").read_text())
    attempt("rewrite the checks", lambda: open(COURSE / "source" / "ddp_refactor"
                                               / "ddp_checks.py", "a").write("# pwned"))
    attempt("write into the course", lambda: (COURSE / f"escape-{{MARK}}").write_text("x"))
    attempt("write into the grader's home", lambda: (HOME / f"escape-{{MARK}}").write_text("x"))
    # A link the checks would follow as the grader: the gradebook in place of the log.
    out = Path(sys.argv[sys.argv.index("--out") + 1])
    out.mkdir(parents=True, exist_ok=True)
    os.symlink(COURSE / "gradebook.db", out / "log.jsonl")
    if os.fork() == 0:  # a child in its own session, meant to outlive grading
        os.setsid()
        os.execv("/bin/sleep", ["sleep", MARK])

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.ones(1)
dist.all_reduce(total)
seen["all_reduce"] = total.item()
dist.destroy_process_group()
if rank == 0:
    out = Path(sys.argv[sys.argv.index("--out") + 1])
    out.mkdir(parents=True, exist_ok=True)
    (out / "seen.json").write_text(json.dumps(seen))
'''

HANG = r'''
import os, time
if os.fork() == 0:
    os.setsid()
    os.execv("/bin/sleep", ["sleep", {mark!r}])
while True:
    time.sleep(1)
'''


def load_checks(folder):
    spec = importlib.util.spec_from_file_location("sandbox_test_ddp_checks",
                                                  folder / "ddp_checks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_course(base):
    """A course folder as nbgrader lays it out, with alice's notebook folder ready to grade."""
    course = base / "course"
    shutil.copytree(SOURCE, course / "source" / "ddp_refactor",
                    ignore=shutil.ignore_patterns("grading_run", "runs", "__pycache__",
                                                  "train_digits*.py"))
    (course / "gradebook.db").write_text("the gradebook's solutions")
    bob = course / "submitted" / "bob" / "ddp_refactor"
    bob.mkdir(parents=True)
    (bob / "ddp_refactor.ipynb").write_text("bob's work")
    alice = course / "autograded" / "alice" / "ddp_refactor"
    alice.mkdir(parents=True)
    for name in PROVIDED:
        shutil.copy(SOURCE / name, alice / name)
    return course, alice


def marks():
    return str(random.randrange(10**8, 10**9))


def command_lines():
    lines = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                lines[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                pass
    return lines


def processes_with(mark):
    return [line for line in command_lines().values() if mark.encode() in line]


class CommandLineWatch(threading.Thread):
    """Reads every process's command line until stopped: what the settings revealed, and
    whether it saw the job at all (a watch that saw nothing proves nothing)."""

    def __init__(self, secrets, job_mark):
        super().__init__(daemon=True)
        self.secrets, self.job_mark = [s.encode() for s in secrets], job_mark.encode()
        self.revealed, self.saw_job, self.done = set(), False, threading.Event()

    def run(self):
        while not self.done.wait(0.1):
            for line in command_lines().values():
                self.saw_job |= self.job_mark in line
                self.revealed |= {line for s in self.secrets if s in line}


def hidden_config(checks):
    return checks.Config(**HIDDEN, time_limit_s=240, measure_speedup=False)


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    """alice's attacking submission, graded once through ddp_checks.launch."""
    base = tmp_path_factory.mktemp("sandbox")
    course, alice = make_course(base)
    mark = marks()
    (alice / SCRIPT).write_text(ATTACK.format(course=str(course), home=str(Path.home()),
                                              mark=mark))
    checks = load_checks(alice)
    checks_before = (course / "source" / "ddp_refactor" / "ddp_checks.py").read_bytes()
    settings = [str(HIDDEN["seed"]), f"--lr {HIDDEN['lr']}", f"--lr={HIDDEN['lr']}"]
    # The job's command lines name its settings file (not what is in it).
    watch = CommandLineWatch(settings, str(alice / "grading_run" / "settings.json"))
    previous = os.getcwd()
    environ = dict(os.environ)
    os.environ.update(JUPYTERHUB_API_TOKEN=TOKEN, NBGRADER_EXECUTION="autograde",
                      OMP_NUM_THREADS="1")
    os.environ.pop(checks._sandbox_module().UNSANDBOXED_ENV, None)
    os.chdir(alice)
    watch.start()
    try:
        run = checks.launch(SCRIPT, hidden_config(checks), 2, False)
    finally:
        watch.done.set()
        watch.join()
        os.chdir(previous)
        os.environ.clear()
        os.environ.update(environ)
    left = processes_with(mark)
    seen_file = run.out_dir / "seen.json"
    yield {"run": run, "course": course, "checks_before": checks_before, "mark": mark,
           "watch": watch,
           "left": left, "seen": json.loads(seen_file.read_text()) if seen_file.is_file()
           else None}
    for escaped in (course / f"escape-{mark}", Path.home() / f"escape-{mark}"):
        escaped.unlink(missing_ok=True)


def test_the_attack_ran_in_the_graded_job(attacked):
    run, seen = attacked["run"], attacked["seen"]
    assert seen is not None, f"the job wrote nothing:\n{run.output[-3000:]}"
    out = str(run.out_dir)
    # The settings reached the script, from the file in its scratch folder.
    assert seen["argv"] == ["--epochs", "3", "--batch-size", "7", "--lr", "0.0417",
                            "--seed", "86420917", "--out", out]
    assert seen["all_reduce"] == 2.0  # torchrun --standalone and gloo work in the sandbox
    assert run.returncode == 0 and run.ranks[0] is not None


def test_the_job_reads_and_writes_nothing_outside_its_scratch_copy(attacked):
    seen, course = attacked["seen"], attacked["course"]
    attempts = {name: result for name, result in seen.items()
                if isinstance(result, list) and len(result) == 2
                and result[0] in ("succeeded", "failed")}
    assert len(attempts) == 9
    for name, (outcome, detail) in attempts.items():
        print(f"{name}: {outcome} ({detail})")
        assert outcome == "failed", f"{name}: {detail}"
    assert not (course / f"escape-{attacked['mark']}").exists()
    assert not (Path.home() / f"escape-{attacked['mark']}").exists()
    checks_file = course / "source" / "ddp_refactor" / "ddp_checks.py"
    assert checks_file.read_bytes() == attacked["checks_before"]


def test_the_job_sees_no_token_and_no_grader_identity(attacked):
    seen, run = attacked["seen"], attacked["run"]
    assert seen["token"] is None
    assert not [name for name in seen["env"] if name.startswith("JUPYTERHUB")]
    assert "NBGRADER_EXECUTION" not in seen["env"]
    assert seen["home"] == str(run.out_dir.parent)
    if os.geteuid() == 0:
        assert seen["uid"] != 0  # a throw-away account, not the grader's root
        assert run.out_dir.stat().st_uid == 0  # the grader owns the folder again


def test_no_process_of_the_job_outlives_grading(attacked):
    assert attacked["left"] == []


def test_the_graded_settings_are_on_no_command_line(attacked):
    watch = attacked["watch"]
    assert watch.saw_job
    assert watch.revealed == set()


def test_the_grader_follows_no_link_the_job_left(attacked):
    scratch = attacked["run"].out_dir.parent
    assert not (scratch / "out" / "log.jsonl").is_symlink()
    assert not [p for p in scratch.rglob("*") if p.is_symlink()]


def grade(alice, checks, **env):
    """alice's script launched as autograde launches it (the graded settings, 2 CPU ranks,
    in the sandbox, from her folder), with ``env`` set meanwhile; the ``Run``."""
    previous, environ = os.getcwd(), dict(os.environ)
    os.environ.update(NBGRADER_EXECUTION="autograde", **env)
    os.environ.pop(checks._sandbox_module().UNSANDBOXED_ENV, None)
    os.chdir(alice)
    try:
        return checks.launch(SCRIPT, hidden_config(checks), 2, False)
    finally:
        os.chdir(previous)
        os.environ.clear()
        os.environ.update(environ)


def test_a_job_past_its_time_limit_is_stopped_with_all_it_started(tmp_path):
    _, alice = make_course(tmp_path)
    mark = marks()
    (alice / SCRIPT).write_text(HANG.format(mark=mark))
    # A short limit (the job's start is a few seconds here), so the watch proves the job got
    # as far as leaving its process behind before the limit: otherwise nothing was tested.
    watch = CommandLineWatch([], f"sleep {mark}")
    watch.start()
    try:
        run = grade(alice, load_checks(alice), DDP_CHECKS_TIME_LIMIT_S="8")
    finally:
        watch.done.set()
        watch.join()
    assert run.timed_out
    assert watch.saw_job, "the job never started its process: the limit stopped nothing"
    assert processes_with(mark) == []


GRADE_AS_GRADER = r'''
import json, os, sys
sys.path.insert(0, os.getcwd())
import ddp_checks, ddp_sandbox
run = ddp_checks.launch({script!r}, ddp_checks.Config(**{hidden!r}, time_limit_s=240,
                        measure_speedup=False), 2, False)
print("UNPRIVILEGED", os.getuid(), ddp_sandbox.sandboxed(), run.returncode)
'''


@pytest.mark.skipif(os.geteuid() != 0, reason="not root: the attack above already ran "
                                               "from a grader that is not root")
def test_a_grader_that_is_not_root_gets_the_unprivileged_sandbox():
    """The attack again, graded by `nobody`: bwrap in a user namespace. An outer sandbox
    (as root) shows `nobody` this Python, which lives in root's closed home."""
    base = Path(tempfile.mkdtemp(prefix="sandbox-as-nobody-", dir="/tmp"))
    try:
        unprivileged_attack(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def unprivileged_attack(base):
    course, alice = make_course(base)
    mark = marks()
    home = base / "grader_home"
    home.mkdir()
    (alice / SCRIPT).write_text(ATTACK.format(course=str(course), home=str(home), mark=mark))
    subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", str(base)], check=True)
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(home),
           "OMP_NUM_THREADS": "1", "NBGRADER_EXECUTION": "autograde",
           "JUPYTERHUB_API_TOKEN": TOKEN}
    # The outer sandbox shows this machine's /proc as it is: the kernel lets a user
    # namespace mount a new one only where a visible one has nothing mounted over it (bwrap's
    # own --proc covers parts of it, read-only).
    outer = ["bwrap", "--die-with-parent"]
    for folder in ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc"):
        path = Path(folder)
        if path.is_symlink():
            outer += ["--symlink", os.readlink(path), folder]
        elif path.is_dir():
            outer += ["--ro-bind", folder, folder]
    outer += ["--dev", "/dev", "--bind", "/proc", "/proc", "--tmpfs", "/tmp", "--bind", str(base),
              str(base), "--tmpfs", str(Path.home())]
    for prefix in {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), ROOT}:
        if prefix.is_relative_to(Path.home()):  # root's closed home: its top folder only
            top = Path.home() / prefix.relative_to(Path.home()).parts[0]
        elif prefix.is_relative_to("/tmp"):  # a clone under /tmp: over the outer --tmpfs
            top = prefix
        else:
            top = Path("/", prefix.parts[1])
        if str(top) not in ("/usr", "/tmp") and str(top) not in outer:
            # bwrap makes a bind's missing parents 0700 as root: open them to `nobody`
            for parent in reversed(top.parents[:-2] if top.is_relative_to("/tmp") else ()):
                outer += ["--perms", "0755", "--dir", str(parent)]
            outer += ["--ro-bind", str(top), str(top)]
    outer += ["--chdir", str(alice), "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}",
              "--clear-groups", sys.executable, "-c",
              GRADE_AS_GRADER.format(script=SCRIPT, hidden=HIDDEN)]
    result = subprocess.run(outer, env=env, capture_output=True, text=True, timeout=400)
    assert f"UNPRIVILEGED {NOBODY} True 0" in result.stdout, result.stdout + result.stderr
    seen = json.loads((alice / "grading_run" / "out" / "seen.json").read_text())
    assert seen["token"] is None and seen["all_reduce"] == 2.0
    for name in ("read hidden tests", "read hidden tests by ../", "read gradebook",
                 "list submitted", "read another learner",
                 "read the checks beside the notebook", "rewrite the checks",
                 "write into the course", "write into the grader's home"):
        assert seen[name][0] == "failed", f"{name}: {seen[name]}"
    assert not (course / f"escape-{mark}").exists() and not (home / f"escape-{mark}").exists()
    assert processes_with(mark) == []


def sandbox_command(*args, **env):
    """ddp_sandbox.py run as `make autograde` runs it, with PATH and extra variables."""
    return subprocess.run([sys.executable, str(SOURCE / "ddp_sandbox.py"), *args],
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": str(Path(sys.executable).parent), **env})


def test_grading_is_refused_in_one_line_where_no_sandbox_can_be_made(tmp_path):
    """PATH without bwrap: the refusal, from the launch itself and from `make autograde`'s
    check; an explicit flag grades without a sandbox; a learner's own run is not refused."""
    _, alice = make_course(tmp_path)
    (alice / SCRIPT).write_text("print('never run')\n")
    launch = ("import ddp_checks\n"
              "try:\n"
              "    ddp_checks.launch('train_digits_ddp.py', ddp_checks.Config(), 2, False)\n"
              "except Exception as refusal:\n"
              "    print(type(refusal).__name__ + ': ' + str(refusal))\n")
    refused = subprocess.run([sys.executable, "-c", launch], cwd=alice, capture_output=True,
                             text=True, timeout=60,
                             env={"PATH": str(Path(sys.executable).parent),
                                  "NBGRADER_EXECUTION": "autograde"})
    line = refused.stdout.strip()
    assert line.count("\n") == 0 and line.startswith("SandboxUnavailable: "), refused
    assert "bubblewrap (bwrap) is not installed" in line
    assert "apt-get install bubblewrap" in line and "DDP_CHECKS_UNSANDBOXED=1" in line
    assert not (alice / "grading_run").exists()  # refused before anything ran

    check = sandbox_command()
    assert check.returncode == 1
    assert check.stderr.strip().startswith("Grading refused: no sandbox")
    assert check.stderr.strip().count("\n") == 0
    flagged = sandbox_command(DDP_CHECKS_UNSANDBOXED="1")
    assert flagged.returncode == 0 and "WITHOUT a sandbox" in flagged.stdout
    own_run = subprocess.run([sys.executable, "-c", "import ddp_sandbox; "
                              "print(ddp_sandbox.sandboxed())"], cwd=alice,
                             capture_output=True, text=True, timeout=60,
                             env={"PATH": str(Path(sys.executable).parent)})
    assert own_run.stdout.strip() == "False", own_run.stderr


def test_the_sandboxs_cost_per_launch_is_measured(tmp_path, capsys):
    """What the sandbox adds to each launch, printed (BENCHMARKS.md quotes it): a process
    that does nothing, started 15 times in a fresh sandbox (its scratch folder handed over
    and taken back, as each graded launch does) and 15 times directly, interleaved."""
    import time

    sys.path.insert(0, str(SOURCE))
    try:
        import ddp_sandbox
    finally:
        sys.path.remove(str(SOURCE))
    argv = [sys.executable, "-S", "-c", "pass"]
    seconds = {"sandboxed": [], "direct": []}
    for i in range(15):
        scratch = tmp_path / f"scratch{i}"
        scratch.mkdir()
        (scratch / SCRIPT).write_text("pass\n")
        start = time.perf_counter()
        job = ddp_sandbox.Job(scratch, on_gpu=False)
        assert job.popen(argv, env=dict(os.environ)).wait(timeout=60) == 0
        job.finish()
        seconds["sandboxed"].append(time.perf_counter() - start)
        start = time.perf_counter()
        subprocess.run(argv, check=True, timeout=60)
        seconds["direct"].append(time.perf_counter() - start)
    median = {how: sorted(times)[len(times) // 2] for how, times in seconds.items()}
    with capsys.disabled():
        print(f"\nsandbox cost per launch: median {median['sandboxed'] * 1000:.0f} ms "
              f"sandboxed, {median['direct'] * 1000:.0f} ms direct: "
              f"+{(median['sandboxed'] - median['direct']) * 1000:.0f} ms a launch "
              f"({'as a throw-away uid' if os.geteuid() == 0 else 'unprivileged'})")


# A graded script that tries to take the grading server down: threads, processes, a large
# file in its folder, /dev/shm, and a flood of output. Rank 0 attacks before it imports
# torch and lets everything go again; rank 1 waits for it (its gloo threads need tasks).
RESOURCE_ATTACK = r'''
import json, os, signal, sys, threading, time
from pathlib import Path

MIB = 2**20
out = Path(sys.argv[sys.argv.index("--out") + 1])


def resources(folder, threads=1500, processes=300, file_mib=300, shm_mib=600):
    """How far each attempt got: threads and processes started, MiB written."""
    seen, stop, started, children = {}, threading.Event(), [], []
    try:
        for _ in range(threads):
            thread = threading.Thread(target=stop.wait, daemon=True)
            thread.start()
            started.append(thread)
    except RuntimeError:
        pass
    seen["threads"] = len(started)
    stop.set()
    for thread in started:
        thread.join()
    try:
        for _ in range(processes):
            pid = os.fork()
            if pid == 0:
                signal.pause()
                os._exit(0)
            children.append(pid)
    except OSError:
        pass
    seen["processes"] = len(children)
    for pid in children:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    for name, path, mib in (("file_mib", Path(folder) / "big.bin", file_mib),
                            ("shm_mib", Path("/dev/shm/big.bin"), shm_mib)):
        written = 0
        try:
            with open(path, "wb") as big:
                for _ in range(mib):
                    big.write(bytes(MIB))
                    big.flush()
                    written += 1
        except OSError:
            pass
        path.unlink(missing_ok=True)
        seen[name] = written
    return seen


if __name__ == "__main__":
    rank = int(os.environ.get("RANK", 0))
    out.mkdir(parents=True, exist_ok=True)
    if rank == 0:
        seen = resources(out)
        for _ in range(20):  # 20 MiB of output, twenty times what the grader keeps
            sys.stdout.write("x" * (MIB - 1) + "\n")
        sys.stdout.flush()
        (out / "attacked").write_text(json.dumps(seen))
    while not (out / "attacked").exists():
        time.sleep(0.2)
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.ones(1)
    dist.all_reduce(total)
    dist.destroy_process_group()
    if rank == 0:
        (out / "seen.json").write_text(json.dumps({**json.loads((out / "attacked")
                                                              .read_text()),
                                                   "all_reduce": total.item()}))
'''


def test_a_job_cannot_exhaust_the_grading_server(tmp_path):
    """Threads and processes stop at the job's task limit, a file in its folder at the file
    size limit, /dev/shm at its own size, and the grader keeps the first OUTPUT_CHARS of a
    flood of output, with a note; the job itself still runs its collective. The same attack
    run plainly, with no sandbox, gets past every one of those limits (the test can see an
    attack succeed)."""
    _, alice = make_course(tmp_path)
    (alice / SCRIPT).write_text(RESOURCE_ATTACK)
    checks = load_checks(alice)
    sandbox = checks._sandbox_module()
    run = grade(alice, checks, OMP_NUM_THREADS="1")
    seen_file = run.out_dir / "seen.json"
    assert seen_file.is_file(), run.output[-3000:]
    seen = json.loads(seen_file.read_text())
    tasks = sandbox.TASKS_BASE + sandbox.TASKS_PER_RANK * 2
    print(f"in the sandbox: {seen}; tasks limit {tasks}")
    assert seen["all_reduce"] == 2.0 and run.returncode == 0
    assert seen["threads"] < tasks and seen["processes"] < tasks
    assert seen["file_mib"] == sandbox.FILE_BYTES // 2**20
    shm_mib = (sandbox.SHM_BASE + 2 * sandbox.SHM_PER_RANK) // 2**20
    assert seen["shm_mib"] <= shm_mib
    assert checks.OUTPUT_CHARS <= len(run.output) < checks.OUTPUT_CHARS + 200
    assert "more characters; the grader kept its first" in run.output

    plain = tmp_path / "plain"
    plain.mkdir()
    attack = RESOURCE_ATTACK.split('if __name__ == "__main__":')[0]
    unlimited = subprocess.run(
        [sys.executable, "-c", attack + "print(json.dumps(resources(sys.argv[-1])))",
         "--out", str(plain), str(plain)], capture_output=True, text=True, timeout=300)
    open_seen = json.loads(unlimited.stdout.strip().splitlines()[-1])
    print(f"without it: {open_seen}")
    assert open_seen["threads"] >= tasks and open_seen["processes"] >= tasks
    assert open_seen["file_mib"] > sandbox.FILE_BYTES // 2**20
    assert open_seen["shm_mib"] > shm_mib


def test_a_gpu_job_sees_the_drivers_libraries_where_the_image_keeps_them(tmp_path,
                                                                         monkeypatch):
    """libcuda outside the system's folders (as /usr/local/nvidia/lib64 in many container
    images), named on LD_LIBRARY_PATH: a GPU job's sandbox binds its folder, read-only; a
    CPU job's does not (the test sees the folder missing where it is)."""
    sys.path.insert(0, str(SOURCE))
    try:
        import ddp_sandbox
    finally:
        sys.path.remove(str(SOURCE))
    driver = tmp_path / "vendor" / "nvidia" / "lib64"
    driver.mkdir(parents=True)
    (driver / "libcuda.so.1").write_bytes(b"a stand-in for the driver's library")
    (driver / "libcuda.so.1").chmod(0o644)
    for folder in (driver, *driver.parents):
        if folder == tmp_path.parent:
            break
        folder.chmod(0o755)
    monkeypatch.setenv("LD_LIBRARY_PATH", str(driver))
    assert driver in ddp_sandbox.driver_folders()
    seen = {}
    for on_gpu in (True, False):
        scratch = tmp_path / f"scratch-{on_gpu}"
        scratch.mkdir()
        job = ddp_sandbox.Job(scratch, on_gpu=on_gpu, nproc=1)
        listed = job.popen(["/bin/cat", str(driver / "libcuda.so.1")], env=dict(os.environ),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        seen[on_gpu] = listed.communicate(timeout=60)[0].decode(errors="replace")
        job.finish()
    assert seen[True] == "a stand-in for the driver's library", seen
    assert "No such file" in seen[False], seen
