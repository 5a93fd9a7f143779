"""The class server (deploy/classroom/) end to end, as a class day runs on it.

The kit's own commands build the class in a scratch folder: its environment (Debian's
Python with the course's packages), the grader account, the exchange, three learner
accounts; then JupyterHub on loopback ports. An instructor and three learners, each
through their own account and token:

- the formgrader answers the instructor's token and refuses a learner's; the instructor
  generates and releases the assessment through the formgrader's HTTP API;
- one learner logs in through Chromium: their JupyterLab shows the released assignment in
  the Assignment List and no instructor panel (a screenshot goes to build/classroom/);
- each learner fetches and submits through their own server (nbgrader's assignment-list
  endpoints): one the solution, one a known mistake, one the untouched release;
- the instructor collects, autogrades and releases feedback through the formgrader; the
  gradebook and the grader's `make grades` agree; each learner fetches their feedback;
- every file in the homes and the exchange belongs to its learner, and a learner cannot
  list the others' submissions, read another home or the grader's course folder;
- the class's intrusion test, from learner accounts over HTTP and in the shell: another's
  password, a class password, squatting the exchange, a forged submission, another's
  kernel, a page planted in ~/.local/share/jupyter/labextensions opened by the instructor
  in Chromium, memory, processes and file size past the limits, plain HTTP off the
  loopback: each blocked, one line each;
- the progress service and the instructors' board (tests/class_progress.py): three
  learners' kernels run real labs.check calls while the instructor's Chromium shows the
  board, each learner's verdicts there within 10 s; the common NOT YET reasons, who is
  stuck and two learners' survey answers aggregated; a learner's browser, own token and
  server's token refused the board; a record naming another learner kept as the sender's
  own; no verdict lost while the service stops answering.

The hub serves HTTPS with a self-signed certificate the kit made (--self-signed). Last, a
class of 30 learner accounts logs in, starts its servers, runs a cell and submits (the
solution, the mistake or the untouched release, in turn), all at once; the instructor
collects all 30; every kernel reports a verdict at once and all 30 are on the board (the
survey anonymous from then on). The grader's `make autograde` then grades each of the 30 in
the sandbox (``whole_class``: about 9 min here, so CI leaves it out; `make test` and `make
test-class` run it).

The SLURM variant runs the same hub with batchspawner on a one-node test SLURM with two fake
GPUs (tests/slurm.py): two learners' servers run as their jobs with disjoint
CUDA_VISIBLE_DEVICES, the third waits in the queue and starts when one stops.

Needs root (accounts), Debian's python3.11, npm, sudo, Chromium, SLURM and munge (.ci/run
installs them); without them it is skipped, saying why, except under CI, where that fails.
The accounts it creates have a unique prefix and are removed at the end, with the folder.
"""
import argparse
import asyncio
import csv
import errno
import importlib.util
import json
import os
import pwd
import random
import re
import secrets
import shlex
import shutil
import signal
import socket
import ssl
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import class_progress
import nbformat
import psutil
import pytest
import slurm
from nbgrader.api import Gradebook
from test_browser import CHROMIUM, CHROMIUM_ARGS
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect

from conftest import REPO, free_port

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # the kit fixture skips, or under CI fails
    sync_playwright = None

KIT = REPO / "deploy" / "classroom" / "classroom.py"
COURSE_ID = "ddp-workshop"
ASSIGNMENT = "ddp_refactor"
NOTEBOOK = f"{ASSIGNMENT}.ipynb"
SCRIPT_CELL = "ddp_script"
SCREENSHOTS = REPO / "build" / "classroom"
# The mistake: the learning rate not scaled with the world size (one requirement lost).
MISTAKE = ("    lr = args.lr * world_size\n", "    lr = args.lr\n")
MISTAKE_REQUIREMENT = "learning_rate_follows_global_batch"
INSTRUCTOR_PLUGINS = ["@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:create-assignment",
                      "@jupyter/nbgrader:course-list"]
HUB_START_S = 180
SERVER_START_S = 180
AUTOGRADE_S = 600
# The limits the test's class runs under: low, so that going past them is quick here.
LIMITS = {"--memory-limit": "2G", "--nproc-limit": "150", "--file-size-limit": "64M",
          "--learner-memory": "3G", "--learner-cpus": "1", "--home-size": "256M",
          "--exchange-size": "160M"}
# Two (pretend) GPUs shared out under the local spawner: learner k gets GPU k mod 2, and a
# devices group closes the other to them (character devices 195:N stand in for them).
GPU_ARGS = ["--gpus-per-learner", "1", "--gpu-ids", "0,1"]
PLANTED = "classroom-planted"  # the labextension a learner writes into their home
LEFT_MARK = 7771  # `sleep 7771`: a learner's process left behind (each day's own mark)


def missing():
    """Why the class cannot be built here (None: it can)."""
    if os.geteuid() != 0:
        return "the class server creates accounts and starts servers as them: needs root"
    tools = {"useradd": "passwd", "userdel": "passwd", "sudo": "sudo", "npm": "npm",
             "node": "nodejs"}
    absent = sorted({package for tool, package in tools.items() if not shutil.which(tool)})
    if not Path("/usr/bin/python3.11").exists():
        absent.append("python3.11")
    if not CHROMIUM.exists():
        absent.append("chromium")
    if absent:
        return f"apt-get install {' '.join(absent)} (the class server and its test need them)"
    if sync_playwright is None:
        return "playwright-python is missing (`make setup` installs it)"
    return None


def skip_or_fail(reason):
    if os.environ.get("CI"):
        pytest.fail(f"under CI, {reason}")
    pytest.skip(reason)


def kit(state, *args, timeout=600):
    """Run a command of the kit (as an instructor does between two days); its output."""
    result = subprocess.run([sys.executable, str(KIT), "--state", str(state), *args],
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"classroom.py {' '.join(args)}:\n{result.stdout}\n" \
                                   f"{result.stderr}"
    return result.stdout


def as_user(user, *command, timeout=60):
    """Run ``command`` as ``user`` (sudo, as a learner's own shell would)."""
    return subprocess.run(["sudo", "-u", user, "--", *command], capture_output=True,
                          text=True, timeout=timeout, cwd="/")


def make_classroom(state, accounts, init_args):
    """The commands of `make classroom` for this class, as `make -n` prints them (so the
    Makefile is tested too): env, init, accounts, serve."""
    dry_run = subprocess.run(
        ["make", "--no-print-directory", "-n", "-s", "classroom", f"VENV={sys.prefix}",
         f"CLASS_DIR={state}", "CLASS_LEARNERS=3", f"CLASS_PREFIX={accounts.learner_prefix}",
         f"CLASS_ARGS={shlex.join(init_args)}"],
        cwd=REPO, capture_output=True, text=True, check=True).stdout
    commands = [line for line in dry_run.splitlines() if "deploy/classroom/classroom.py" in line]
    assert [shlex.split(c)[4] for c in commands] == ["env", "init", "accounts", "serve"], commands
    return commands


def run_step(command):
    result = subprocess.run(["bash", "-c", command], cwd=REPO, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, f"{command}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


class Hub:
    """The class's JupyterHub (`classroom.py serve`), and HTTP requests through its proxy."""

    def __init__(self, state, serve_command, log_path):
        self.state = state
        self.settings = json.loads((state / "class.json").read_text())
        self.tls = None
        if self.settings.get("ssl_cert"):
            self.tls = ssl.create_default_context(cafile=self.settings["ssl_cert"])
        self.url = f"{'https' if self.tls else 'http'}://127.0.0.1:{self.settings['port']}"
        self.log_path = log_path
        # As from a shell's background job (`make classroom &`, nohup): SIGINT ignored.
        with open(log_path, "w") as log:
            self.process = subprocess.Popen(
                ["bash", "-c", f"exec {serve_command}"], cwd=REPO, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        deadline = time.monotonic() + HUB_START_S
        while self.request("GET", "/hub/api/")[0] != 200:
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"the hub did not start:\n{self.log()[-4000:]}")
            time.sleep(0.5)

    def log(self):
        return self.log_path.read_text(errors="replace")

    def request(self, method, path, token=None, json_body=None, form=None, timeout=30):
        """``(status, body)``; the body parsed when it is JSON."""
        headers, data = {}, None
        if token:
            headers["Authorization"] = f"token {token}"
        if json_body is not None:
            data, headers["Content-Type"] = json.dumps(json_body).encode(), "application/json"
        elif form is not None:
            data = urllib.parse.urlencode(form).encode()
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        elif method in ("POST", "PUT"):
            data = b""
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=self.tls) as response:
                status, text = response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            status, text = error.code, error.read().decode(errors="replace")
        except OSError:
            return None, None
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def ok(self, method, path, token, **kwargs):
        status, body = self.request(method, path, token, **kwargs)
        assert status in (200, 201, 202, 204), f"{method} {path}: {status} {str(body)[:2000]}"
        return body

    def token(self, user, password):
        """An API token, requested with the user's password as a script would."""
        status, body = self.request("POST", f"/hub/api/users/{user}/tokens", json_body={
            "auth": {"username": user, "password": password}})
        return body["token"] if status in (200, 201) else None

    def server(self, user, token):
        return self.ok("GET", f"/hub/api/users/{user}", token)["servers"].get("", {})

    def start_server(self, user, token):
        status, body = self.request("POST", f"/hub/api/users/{user}/server", token)
        assert status in (201, 202), f"starting {user}'s server: {status} {body}"

    def wait_ready(self, user, token, timeout=SERVER_START_S):
        deadline = time.monotonic() + timeout
        while not self.server(user, token).get("ready"):
            assert time.monotonic() < deadline, (f"{user}'s server not ready after {timeout} s"
                                                 f":\n{self.log()[-4000:]}")
            time.sleep(1)

    def formgrader(self, path, token, timeout=30):
        return self.ok("POST", f"/services/{COURSE_ID}/formgrader/api/{path}", token,
                       timeout=timeout)

    def stop(self):
        """SIGTERM, as Ctrl-C on `make classroom`: the hub stops the servers, the services
        and the proxy. Whatever is left of it after that is killed."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        for process in psutil.process_iter():
            try:
                if str(self.state) in " ".join(process.cmdline()):
                    process.kill()
            except psutil.Error:
                pass


class Accounts:
    """The scratch class's account names: a prefix no other account on the machine has."""

    def __init__(self):
        self.prefix = f"c{secrets.token_hex(3)}"
        self.grader = f"{self.prefix}grader"
        self.instructor = f"{self.prefix}teach"  # a hub user only (no Unix account)
        self.learner_prefix = f"{self.prefix}l"
        self.learners = [f"{self.learner_prefix}{i:02d}" for i in (1, 2, 3)]


@pytest.fixture(scope="module")
def classroom(request):
    """The class built by the kit's commands in a scratch folder (under /tmp, open to every
    account: pytest's temporary folders are private to root); the accounts and the folder
    are removed at the end, whatever happened."""
    reason = missing()
    if reason:
        skip_or_fail(reason)
    accounts = Accounts()
    state = Path(tempfile.mkdtemp(prefix="ddp-classroom-", dir="/tmp"))
    state.chmod(0o755)
    timings = {}
    try:
        internal = free_root_ports(4)
        init_args = ["--grader", accounts.grader, "--instructors", accounts.instructor,
                     "--port", str(free_port()), "--hub-port", str(internal[0]),
                     "--proxy-api-port", str(internal[1]),
                     "--formgrader-port", str(internal[2]),
                     "--progress-port", str(internal[3]), "--self-signed", "127.0.0.1",
                     *[part for pair in LIMITS.items() for part in pair], *GPU_ARGS]
        env, init, add_accounts, serve = make_classroom(state, accounts, init_args)
        start = time.monotonic()
        run_step(env)
        timings["env"] = time.monotonic() - start
        run_step(init)
        run_step(add_accounts)
        yield {"state": state, "accounts": accounts, "init_args": init_args, "serve": serve,
               "timings": timings}
    finally:
        result = subprocess.run([sys.executable, str(KIT), "--state", str(state), "down",
                                 "--purge"], capture_output=True, text=True, timeout=120)
        print(f"classroom.py down: {result.stdout}{result.stderr}")
        kit = load_kit("kit")
        left = [name for name in (accounts.grader, *accounts.learners) if kit.user_exists(name)]
        assert not left, f"accounts left behind: {left}"
        shutil.rmtree(state, ignore_errors=True)


def free_root_ports(count):
    """``count`` ports below 1024 that nothing holds now: the class's addresses on the
    loopback interface, which only root can bind (not the kit's defaults, which a class on
    this machine may hold)."""
    found = []
    for port in random.sample(range(600, 1000), 400):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        found.append(port)
        if len(found) == count:
            return found
    pytest.fail("no free port below 1024 on 127.0.0.1")


def passwords(state):
    """The instructors' password and each learner's (the kit's hand-out, root's only)."""
    found = {"instructor_password": (state / "secrets" / "instructor_password").read_text()
             .strip()}
    for line in (state / "secrets" / "learner_passwords").read_text().splitlines():
        name, word = line.split(" ", 1)
        found[name] = word
    return found


def grade_id(cell):
    return cell.metadata.get("nbgrader", {}).get("grade_id")


def solution_script():
    """The instructor's script cell, as a learner who wrote the same would submit it."""
    source = nbformat.read(REPO / "assessment" / "source" / ASSIGNMENT / NOTEBOOK,
                           as_version=4)
    cell = next(cell for cell in source.cells if grade_id(cell) == SCRIPT_CELL)
    return "\n".join(line for line in cell.source.split("\n")
                     if "### BEGIN SOLUTION" not in line and "### END SOLUTION" not in line)


def write_script_cell(hub, user, token, script):
    """Replace the script cell of the learner's fetched notebook, through their server's
    contents API (as their JupyterLab saves it)."""
    path = f"/user/{user}/api/contents/{ASSIGNMENT}/{NOTEBOOK}"
    model = hub.ok("GET", path, token)
    cells = [cell for cell in model["content"]["cells"]
             if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == SCRIPT_CELL]
    assert len(cells) == 1
    cells[0]["source"] = script
    hub.ok("PUT", path, token, json_body={"type": "notebook", "format": "json",
                                          "content": model["content"]})


def assignment_action(hub, user, token, action):
    """nbgrader's Assignment List buttons: fetch, submit, fetch_feedback."""
    body = hub.ok("POST", f"/user/{user}/assignments/{action}", token, form={
        "course_id": COURSE_ID, "assignment_id": ASSIGNMENT}, timeout=120)
    assert body.get("success", True) is not False, f"{user} {action}: {body}"
    return body


def owners_under(path):
    """The owner of ``path`` and of everything under it."""
    owners = {path.stat().st_uid}
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            owners.add(os.lstat(os.path.join(root, name)).st_uid)
    return owners


def browser_learner_sees_the_assignment(hub, user, password, screenshot):
    """The learner logs in on the hub's page and opens Nbgrader > Assignment List; return
    what the page shows."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM),
                                             args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900},
                                ignore_https_errors=True)  # the self-signed certificate
        try:
            page.goto(f"{hub.url}/hub/login")
            page.fill("#username_input", user)
            page.fill("#password_input", password)
            page.click("#login_submit")
            # The hub starts the learner's server, then sends them to their JupyterLab.
            page.wait_for_url(re.compile(rf"/user/{user}/lab"), timeout=SERVER_START_S * 1000)
            page.locator("#jp-main-dock-panel").wait_for(timeout=120_000)
            page.locator(".lm-MenuBar-itemLabel", has_text="Nbgrader").click()
            items = page.locator(".lm-Menu-content .lm-Menu-item:visible "
                                 ".lm-Menu-itemLabel").all_inner_texts()
            page.locator(".lm-Menu-itemLabel", has_text="Assignment List").click()
            released = page.locator("#released_assignments_list")
            released.get_by_text(ASSIGNMENT).wait_for(timeout=60_000)
            page.wait_for_timeout(500)
            page.screenshot(path=str(screenshot))
            config = json.loads(page.locator("#jupyter-config-data").text_content())
            return {"url": page.url, "menu": items, "released": released.inner_text(),
                    "disabled": config.get("disabledExtensions", [])}
        except Exception:
            page.screenshot(path=str(screenshot.with_name(f"FAILED-{screenshot.name}")))
            raise
        finally:
            browser.close()


def learner_shell(state, user, script, timeout=120):
    """``script`` in bash as ``user`` in their home, with the class's environment and
    learner settings (as their JupyterLab's terminal has them)."""
    return subprocess.run(
        ["sudo", "-u", user, "-H", "env", f"PATH={state / 'env' / 'bin'}:/usr/bin:/bin",
         f"JUPYTER_CONFIG_PATH={state / 'config' / 'learner'}", "bash", "-c",
         f"cd && {script}"], capture_output=True, text=True, timeout=timeout, cwd="/")


def squat_the_exchange(state, learner):
    """The course's exchange folders are the grader's before any learner exists: a learner
    can neither take them over nor put a release of their own beside the instructor's."""
    course = state / "exchange" / COURSE_ID
    tries = {
        "squat the exchange: replace the course's folder": f"mv {course} {course}.x",
        "squat the exchange: put a release in outbound": f"mkdir {course}/outbound/{ASSIGNMENT}2",
        "squat the exchange: make another course's outbound": f"mkdir -p {course}/outbound2",
    }
    return {what: learner_shell(state, learner, command).returncode != 0
            for what, command in tries.items()}


def forge_submission(state, forger, victim):
    """`nbgrader submit --student=VICTIM`, in the forger's own terminal."""
    return learner_shell(state, forger, f"nbgrader submit {ASSIGNMENT} --course {COURSE_ID} "
                                        f"--student={victim}")


def run_cell(hub, user, token, kernel_id, code, timeout=120):
    """Run ``code`` in a kernel of the learner's server over its websocket, as JupyterLab
    does; the text the cell printed or raised."""
    scheme = "wss" if hub.tls else "ws"
    url = (f"{scheme}://127.0.0.1:{hub.settings['port']}/user/{user}/api/kernels/"
           f"{kernel_id}/channels")

    async def session():
        connection = await websocket_connect(HTTPRequest(
            url, headers={"Authorization": f"token {token}"}, ssl_options=hub.tls,
            request_timeout=timeout))
        msg_id = uuid.uuid4().hex
        connection.write_message(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": user,
                       "session": uuid.uuid4().hex, "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell",
            "content": {"code": code, "silent": False, "store_history": False,
                        "user_expressions": {}, "allow_stdin": False,
                        "stop_on_error": True}}))
        said = []
        while True:
            message = await connection.read_message()
            if message is None:
                return "".join(said) + "[the kernel's connection closed]"
            message = json.loads(message)
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = message["msg_type"], message["content"]
            if kind == "stream":
                said.append(content["text"])
            elif kind == "error":
                said.append(f"{content['ename']}: {content['evalue']}")
            elif kind == "status" and content["execution_state"] == "idle":
                connection.close()
                return "".join(said)

    return asyncio.run(asyncio.wait_for(session(), timeout + 10))


# Notebook 04's stack-dump steps, as a learner runs them in their own kernel on the class
# server: start the hanging job, wait until it is stuck, take every rank's stack (the ranks
# write their own: a learner account may not ptrace them), answer where each rank waits
# from that dump, and let the exercise's check judge the answer.
STACK_DUMP_CELL = """
import os, tempfile
os.chdir(tempfile.mkdtemp(dir=os.path.expanduser("~")))
from workshop_lib import labs, launch, stacks
buggy = labs.get("debugging").stub(path="debug_job.py")
job = launch.start([str(buggy), "--out", "runs/debug", "--dist-timeout", "20"], nproc=2,
                   env={"CUDA_VISIBLE_DEVICES": ""}, quiet=True)
print("STUCK", job.wait_until_stuck(timeout=240))
dumps = job.dump_stacks()
job.wait(timeout=120)
answer = {rank: stacks.where_waiting(text, "debug_job.py")["line"]
          for rank, text in dumps.items()}
print("VERDICT", labs.get("stuck_ranks").check(answer).ok)
"""


def start_kernel(hub, user, token):
    return hub.ok("POST", f"/user/{user}/api/kernels", token, json_body={})["id"]


# Run as the other learner: subscribe to every TCP port and ipc socket of a kernel, and
# count what arrives while the kernel's owner runs a cell.
EAVESDROP = """
import sys, time, zmq
context = zmq.Context()
sockets = []
for address in sys.argv[1:]:
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(address)
    sockets.append(sub)
poller = zmq.Poller()
for sub in sockets:
    poller.register(sub, zmq.POLLIN)
heard, deadline = [], time.monotonic() + 12
while time.monotonic() < deadline:
    for sub, _ in poller.poll(500):
        heard.append(b"".join(sub.recv_multipart()))
print(len(heard), any(b"kernel-secret" in message for message in heard))
"""


def kernel_attacks(hub, state, owner, token, other):
    """Another learner tries to read a kernel of ``owner`` while it runs a cell: its
    channels are ipc sockets in a folder only ``owner`` enters; the one TCP port ipykernel
    still opens (the pipe its forked children write into, PULL only) sends nothing."""
    kernel_id = start_kernel(hub, owner, token)
    assert "ok" in run_cell(hub, owner, token, kernel_id, "print('ok')")
    process = next(p for p in psutil.process_iter(["username", "cmdline"])
                   if p.info["username"] == owner
                   and any(f"kernel-{kernel_id}.json" in part for part in p.info["cmdline"]))
    connection_file = Path(next(part for part in process.info["cmdline"]
                                if part.endswith(f"kernel-{kernel_id}.json")))
    info = json.loads(connection_file.read_text())
    iopub = f"{info['ip']}-{info['iopub_port']}"
    tcp_ports = [c.laddr.port for c in process.net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN]
    addresses = [f"tcp://127.0.0.1:{port}" for port in tcp_ports] + [f"ipc://{iopub}"]
    eavesdropper = subprocess.Popen(
        ["sudo", "-u", other, "-H", str(state / "env" / "bin" / "python"), "-c", EAVESDROP,
         *addresses], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
    time.sleep(4)  # subscribed before the cell runs
    run_cell(hub, owner, token, kernel_id, "print('kernel-secret')")
    heard, _ = eavesdropper.communicate(timeout=60)
    connect = (f"python -c \"import socket; s = socket.socket(socket.AF_UNIX); "
               f"s.connect('{iopub}')\"")
    blocked = {
        "subscribe to another's kernel (its TCP ports and IOPub)": (
            info["transport"] == "ipc" and heard.split() == ["0", "False"]),
        "connect to another's kernel's IOPub socket": (
            learner_shell(state, other, connect).returncode != 0),
        "list another's kernel runtime folder": (
            learner_shell(state, other, f"ls {connection_file.parent}").returncode != 0),
    }
    hub.ok("DELETE", f"/user/{owner}/api/kernels/{kernel_id}", token)
    assert len(iopub) < 107, iopub
    return blocked


def instructor_opens(hub, instructor, password, url, screenshot):
    """The instructor, logged in through the hub's page in Chromium, opens ``url``; the
    page's title after its scripts had their chance."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM),
                                             args=CHROMIUM_ARGS)
        page = browser.new_page(ignore_https_errors=True)
        try:
            page.goto(f"{hub.url}/hub/login")
            page.fill("#username_input", instructor)
            page.fill("#password_input", password)
            page.click("#login_submit")
            page.wait_for_url(re.compile(rf"/services/{COURSE_ID}/"), timeout=120_000)
            page.goto(url)
            page.wait_for_timeout(3000)
            page.screenshot(path=str(screenshot))
            return page.title()
        finally:
            browser.close()


def planted_page_attacks(hub, state, learner, token, instructor, instructor_token,
                         instructor_password, folder):
    """A learner writes a JupyterLab extension into ~/.local/share/jupyter/labextensions
    whose page would mint a token with the instructor's login; their server does not serve
    it, and the instructor's login does not open learners' servers."""
    static = (state / "homes" / learner / ".local" / "share" / "jupyter" / "labextensions"
              / PLANTED / "static")
    page = ("<html><head><title>harmless</title></head><body><script>"
            "fetch('/hub/api/users/' + 'x', {credentials: 'include'})"
            ".then(() => { document.title = 'PLANTED PAGE RAN'; });"
            "document.title = 'PLANTED PAGE RAN';</script></body></html>")
    learner_shell(state, learner, f"mkdir -p {static} && cat > {static}/index.html <<'EOF'\n"
                                  f"{page}\nEOF\necho '{{\"name\": \"{PLANTED}\", "
                                  f"\"version\": \"1.0.0\", \"jupyterlab\": "
                                  f"{{\"_build\": {{\"load\": \"static/index.html\"}}}}}}' "
                                  f"> {static.parent}/package.json")
    assert (static / "index.html").exists()
    path = f"/user/{learner}/lab/extensions/{PLANTED}/static/index.html"
    title = instructor_opens(hub, instructor, instructor_password, hub.url + path,
                             folder / "instructor-opens-planted-page.png")
    learner_status = hub.request("GET", path, token)[0]
    return {
        "serve a page from ~/.local/share/jupyter/labextensions": learner_status == 404,
        "open a learner's server with the instructor's login": hub.request(
            "GET", f"/user/{learner}/api/status", instructor_token)[0] in (403, 404),
        "run a planted page in the instructor's browser": "PLANTED" not in title,
    }


def limit_attacks(hub, learner, token):
    """In the learner's own kernel: memory, processes and file size past the class's limits
    fail there, cleanly, and the hub and the learner's server keep serving."""
    kernel_id = start_kernel(hub, learner, token)
    memory = run_cell(hub, learner, token, kernel_id, "x = bytearray(4 * 2**30)")
    fork_bomb = run_cell(hub, learner, token, kernel_id, fork_bomb_cell())
    big_file = run_cell(hub, learner, token, kernel_id,
                        "open('big.bin', 'wb').write(bytes(65 * 2**20))")
    after = run_cell(hub, learner, token, kernel_id, "print('still here')")
    hub.ok("DELETE", f"/user/{learner}/api/kernels/{kernel_id}", token)
    (Path(pwd.getpwnam(learner).pw_dir) / "big.bin").unlink(missing_ok=True)
    serving = hub.request("GET", "/hub/api/")[0] == 200 and "still here" in after
    return {
        f"allocate past the memory limit ({LIMITS['--memory-limit']})":
            memory.startswith("MemoryError") and serving,
        f"fork bomb (limit {LIMITS['--nproc-limit']} processes)":
            "contained" in fork_bomb and serving,
        f"write a file past the size limit ({LIMITS['--file-size-limit']})":
            "File too large" in big_file and serving,
    }


# Run as a learner: bind a port of the loopback interface, as a process left waiting for a
# service's port while the hub restarts would.
BIND = """
import socket, sys
probe = socket.socket()
probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    probe.bind(("127.0.0.1", int(sys.argv[1])))
    print("BOUND", probe.getsockname()[1])
except OSError as error:
    print("REFUSED", error.errno)
"""


def address_attacks(state, learner, settings):
    """A learner's process tries to take each address that tokens and passwords are sent
    to (the hub's API, the proxy's, the formgrader's, the progress service's): the kernel
    refuses it (EACCES, 13), whether the service holds the port at that moment or not. The
    same code on a port any account may bind succeeds (the test sees an attack work)."""
    python = state / "env" / "bin" / "python"

    def bind(port):
        return learner_shell(state, learner, f"{python} -c {shlex.quote(BIND)} {port}").stdout

    assert bind(0).startswith("BOUND"), "a learner binds a port of their own"
    return {f"take the {name.replace('_', ' ')}'s address for a restart (port "
            f"{settings[name]})": bind(settings[name]).strip() == "REFUSED 13"
            for name in ("hub_port", "proxy_api_port", "formgrader_port", "progress_port")}


# In a learner's kernel: a listener of the learner's own where the progress service's
# address should be (a squatter's), and a verdict to report; whether the token reached it.
# With OWN_NAME_AS_OWNER the kernel is told the learner owns the service: the planted
# weakness, under which the token must arrive (the test sees the attack work).
SQUAT_CELL = """
import json, os, pwd, socket, tempfile, threading
from workshop_lib import progress
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen()
listener.settimeout(8)
heard = []
def accept():
    try:
        connection, _ = listener.accept()
        heard.append(connection.recv(65536).decode(errors="replace"))
        connection.close()
    except OSError:
        pass
saved = {name: os.environ.get(name) for name in (progress.URL_ENV, progress.OWNER_ENV,
                                                 progress.PATH_ENV)}
os.environ[progress.URL_ENV] = f"http://127.0.0.1:{listener.getsockname()[1]}/"
os.environ[progress.PATH_ENV] = tempfile.mkdtemp() + "/progress.jsonl"
if OWN_NAME_AS_OWNER:
    os.environ[progress.OWNER_ENV] = pwd.getpwuid(os.getuid()).pw_name
thread = threading.Thread(target=accept)
thread.start()
progress.record("exercise", "sampler", "02_from_one_gpu_to_many", True, "squatted")
progress.wait_for_reports(10)
sent = progress.send_pending()
thread.join()
for name, value in saved.items():
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
token = os.environ["JUPYTERHUB_API_TOKEN"]
print("RESULT " + json.dumps({"error": sent.error, "heard": any(token in h for h in heard)}))
"""


def squatter_attack(hub, learner, token):
    """The token a learner's kernel sends with its verdicts goes to no listener but the
    service's account's (or root's): one of the learner's own on the service's address
    hears nothing, and the verdict stays pending with the reason."""
    kernel_id = start_kernel(hub, learner, token)
    try:
        squatted = class_progress.result(run_cell(hub, learner, token, kernel_id,
                                                  "OWN_NAME_AS_OWNER = False\n" + SQUAT_CELL))
        planted = class_progress.result(run_cell(hub, learner, token, kernel_id,
                                                 "OWN_NAME_AS_OWNER = True\n" + SQUAT_CELL))
    finally:
        hub.ok("DELETE", f"/user/{learner}/api/kernels/{kernel_id}", token)
    assert planted["heard"], f"the planted weakness did not show: {planted}"
    return {"receive a kernel's token on a listener of one's own at the service's address":
            not squatted["heard"] and "token was not sent" in (squatted["error"] or "")}


def leave_a_process(state, learner, mark):
    """A learner's process that would outlive their server (a squatter waiting for a
    port); its pid."""
    subprocess.Popen(["sudo", "-u", learner, "--", "sleep", str(mark)], cwd="/",
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True)
    time.sleep(2)
    return [p.pid for p in psutil.process_iter(["username", "cmdline"])
            if p.info["username"] == learner and p.info["cmdline"] == ["sleep", str(mark)]]


# In a learner's kernel: three children that each fill MB of memory, in the learner's share
# with their kernel and server; how many the kernel's OOM killer ended, and how many
# filled theirs.
MEMORY_HOG_CELL = """
import os, signal, time
children, ended, ready = [], {}, 0
ready_out, ready_in = os.pipe()
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        os.close(ready_out)
        block = bytes([1]) * (MB * 2**20)  # every page written
        os.write(ready_in, b"x")
        signal.pause()
        os._exit(0)
    children.append(pid)
os.close(ready_in)
os.set_blocking(ready_out, False)
deadline = time.monotonic() + 120  # each child has filled its memory, or ended
while time.monotonic() < deadline and ready + len(ended) < 3:
    try:
        ready += len(os.read(ready_out, 2))
    except BlockingIOError:
        pass
    for pid in children:
        if pid not in ended:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                ended[pid] = status
    time.sleep(0.1)
for pid in children:
    if pid not in ended:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
killed = sum(os.WIFSIGNALED(s) and os.WTERMSIG(s) == signal.SIGKILL for s in ended.values())
print("KILLED", killed, "READY", ready)
"""


# In a learner's kernel: fill FOLDER (their home: None) with files of 50 MiB (under the
# file size limit); MiB written and the error that stopped it.
FILL_CELL = """
import os
home, written, stopped = FOLDER or os.path.expanduser("~"), 0, None
try:
    for i in range(FILES):
        with open(os.path.join(home, f"fill{i}.bin"), "wb") as fill:
            for _ in range(50):
                fill.write(bytes(2**20))
                written += 1
except OSError as error:
    stopped = error.errno
finally:
    for i in range(FILES):
        if os.path.exists(os.path.join(home, f"fill{i}.bin")):
            os.remove(os.path.join(home, f"fill{i}.bin"))
print("FILLED", written, stopped)
"""


def disk_attacks(hub, state, learner, token):
    """A learner fills their home, then the exchange: each is a filesystem of its own (256M
    and 160M here), so the write stops there with ENOSPC and the class folder's filesystem
    (the hub's database) keeps its space; 100 MiB fit in each (the test sees writing work).
    No quota within the exchange here: this host's kernel keeps none (`serve` says so)."""
    kernel_id = start_kernel(hub, learner, token)
    filled = {}
    try:
        for name, folder in (("home", None), ("exchange", str(state / "exchange"))):
            cell = f"FOLDER = {folder!r}\n" + FILL_CELL
            filled[name] = [run_cell(hub, learner, token, kernel_id, f"FILES = {n}\n" + cell)
                            for n in (8, 2)]
    finally:
        hub.ok("DELETE", f"/user/{learner}/api/kernels/{kernel_id}", token)
    found = {}
    for name, (full, fits) in filled.items():
        assert fits.split() == ["FILLED", "100", "None"], (name, fits)
        written, stopped = full.split()[1:3]
        limit = {"home": 256, "exchange": 160}[name]
        found[name] = stopped == str(errno.ENOSPC) and int(written) <= limit
    return {"fill the server's disk from a home (limit 256M)":
                os.path.ismount(state / "homes" / learner) and found["home"],
            "fill the server's disk through the exchange (limit 160M)":
                os.path.ismount(state / "exchange") and found["exchange"]}


# In a learner's kernel: open each stand-in GPU device; the error numbers.
OPEN_DEVICES_CELL = """
import json, os
found = {{}}
for gpu in ("0", "1"):
    try:
        os.close(os.open("{folder}/nvidia" + gpu, os.O_RDONLY))
        found[gpu] = 0
    except OSError as error:
        found[gpu] = error.errno
print(json.dumps(found))
"""


def cgroup_attacks(hub, learner, token):
    """The learner's share, whatever the number of processes: three children of 1.2 GB
    each pass the per-process limit (2G) but not the learner's 3G together, and the OOM
    killer ends one at least; three of 150 MB live (the test sees the attack work where it
    fits). The learner's server runs under a
    CPU quota of one CPU. The GPU that is not theirs (a device 195:N) cannot be opened; their
    own can (no driver here: ENXIO, past the group)."""
    devices = Path(tempfile.mkdtemp(prefix="gpus-", dir="/tmp"))
    devices.chmod(0o755)
    for gpu in ("0", "1"):
        subprocess.run(["mknod", "-m", "666", str(devices / f"nvidia{gpu}"), "c", "195", gpu],
                       check=True)
    kernel_id = start_kernel(hub, learner, token)
    try:
        hogs = run_cell(hub, learner, token, kernel_id, "MB = 1200\n" + MEMORY_HOG_CELL)
        fits = run_cell(hub, learner, token, kernel_id, "MB = 150\n" + MEMORY_HOG_CELL)
        # In the learner's kernel, so in their groups (a shell from sudo is not).
        opened = json.loads(run_cell(hub, learner, token, kernel_id, OPEN_DEVICES_CELL.format(
            folder=devices)).strip().splitlines()[-1])
    finally:
        hub.ok("DELETE", f"/user/{learner}/api/kernels/{kernel_id}", token)
        shutil.rmtree(devices)
    assert fits.split()[:2] == ["KILLED", "0"], fits
    (server,) = [p for p in psutil.process_iter(["username", "cmdline"])
                 if p.info["username"] == learner
                 and "jupyterhub-learner" in " ".join(p.info["cmdline"] or [])]
    groups = dict(line.split(":", 2)[1:] for line in Path(f"/proc/{server.pid}/cgroup")
                  .read_text().splitlines())
    cpu = next(path for names, path in groups.items() if "cpu" in names.split(","))
    quota = Path(f"/sys/fs/cgroup/cpu{cpu}/cpu.cfs_quota_us").read_text().strip()
    mine = server.environ()["CUDA_VISIBLE_DEVICES"]
    other = "1" if mine == "0" else "0"
    assert opened[mine] == errno.ENXIO, opened  # through the group, to a missing driver
    print(f"memory hogs: {hogs.strip()}; within the share: {fits.strip()}")
    return {"use more memory than the learner's share across processes":
                hogs.split()[0] == "KILLED" and int(hogs.split()[1]) >= 1,
            "use more than the learner's CPUs": quota == "100000",
            f"open a GPU that is not the learner's (theirs: {mine})":
                opened[other] == errno.EPERM}


def fork_bomb_cell():
    """Fork until the system says no, then end every child: what it printed says which."""
    return "\n".join([
        "import os, signal", "children = []", "try:", "    while True:",
        "        pid = os.fork()", "        if pid == 0:", "            signal.pause()",
        "            os._exit(0)", "        children.append(pid)",
        "except BlockingIOError:", "    print('contained after', len(children))",
        "finally:", "    for pid in children:", "        os.kill(pid, signal.SIGKILL)",
        "        os.waitpid(pid, 0)"])


def plain_http_off_loopback(state, init_args):
    """`init --ip 0.0.0.0` without TLS: refused in one line."""
    args = [a for a in init_args if a != "--self-signed" and a != "127.0.0.1"]
    result = subprocess.run([sys.executable, str(KIT), "--state", str(state), "init", *args,
                             "--ip", "0.0.0.0"], capture_output=True, text=True, timeout=120)
    return (result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1
            and "--insecure-http" in result.stderr)


def kernel_cells(hub, tokens):
    """``cell(user, code, timeout)``: run code in that learner's one kernel (started on
    first use), and ``shut_down()`` for after."""
    kernels = {}

    def cell(user, code, timeout):
        if user not in kernels:
            kernels[user] = start_kernel(hub, user, tokens[user])
        return run_cell(hub, user, tokens[user], kernels[user], code, timeout)

    def shut_down():
        for user, kernel_id in kernels.items():
            hub.request("DELETE", f"/user/{user}/api/kernels/{kernel_id}", tokens[user])

    return cell, shut_down


def progress_steps(hub, accounts, tokens, instructor, secret, folder):
    """tests/class_progress.py's day: three learners' checks on the instructor's board, the
    survey, a learner refused, the service stopped and back."""
    cell, shut_down = kernel_cells(hub, tokens)

    def keep(*screenshots):
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        for path in screenshots:
            shutil.copy(path, SCREENSHOTS / path.name)

    try:
        return class_progress.progress_day(hub, accounts, tokens, instructor, secret, folder,
                                           cell, keep)
    finally:
        shut_down()


@pytest.fixture(scope="module")
def class_day(classroom, tmp_path_factory):
    """The whole day on the local spawner, the hub stopped after it; what each step showed,
    for the tests below."""
    state, accounts = classroom["state"], classroom["accounts"]
    folder = tmp_path_factory.mktemp("class-day")
    secret = passwords(state)
    learners = accounts.learners
    day = {"state": state, "accounts": accounts, "timings": classroom["timings"]}
    start = time.monotonic()
    hub = Hub(state, classroom["serve"], folder / "hub.log")
    day["timings"]["hub start"] = time.monotonic() - start
    try:
        instructor = hub.token(accounts.instructor, secret["instructor_password"])
        tokens = {user: hub.token(user, secret[user]) for user in learners}
        assert all(tokens.values()), "each learner logs in with their own password"
        day["instructor as learner"] = hub.token(accounts.instructor, secret[learners[0]])
        day["attacks"] = attacks = {}
        attacks["log in as another learner with their password"] = (
            hub.token(learners[0], secret[learners[1]]) is None)
        attacks["log in as another learner with no password"] = (
            hub.token(learners[0], "") is None)
        attacks["log in as another learner with the instructors' password"] = (
            hub.token(learners[0], secret["instructor_password"]) is None)
        attacks.update(squat_the_exchange(state, learners[1]))
        attacks["serve plain HTTP off the loopback"] = plain_http_off_loopback(
            state, classroom["init_args"])
        day["formgrader status"] = {
            who: hub.request("GET", f"/services/{COURSE_ID}/formgrader/api/assignments",
                             token)[0]
            for who, token in (("instructor", instructor), ("learner", tokens[learners[0]]))}

        # The instructor releases the assessment through the formgrader.
        day["generate"] = hub.formgrader(f"assignment/{ASSIGNMENT}/assign", instructor,
                                         timeout=300)
        day["release"] = hub.formgrader(f"assignment/{ASSIGNMENT}/release", instructor)

        # Learner 1 logs in through the browser.
        start = time.monotonic()
        screenshot = folder / "learner-assignment-list.png"
        day["browser"] = browser_learner_sees_the_assignment(
            hub, learners[0], secret[learners[0]], screenshot)
        day["timings"]["browser"] = time.monotonic() - start
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(screenshot, SCREENSHOTS / screenshot.name)
        day["screenshot"] = screenshot

        # The two others start their servers; everybody fetches, works and submits.
        for user in learners[1:]:
            hub.start_server(user, tokens[user])
        for user in learners:
            hub.wait_ready(user, tokens[user])
        # Their kernels report checks to the progress service; the instructors' board.
        start = time.monotonic()
        day["progress"] = progress_steps(hub, accounts, tokens, instructor, secret, folder)
        day["timings"]["progress and board"] = time.monotonic() - start
        for user in learners:
            assignment_action(hub, user, tokens[user], "fetch")
        solution = solution_script()
        assert solution.count(MISTAKE[0]) == 1, "the solution no longer scales lr this way"
        work = {learners[0]: solution, learners[1]: solution.replace(*MISTAKE),
                learners[2]: None}
        for user, script in work.items():
            if script is not None:
                write_script_cell(hub, user, tokens[user], script)
            day.setdefault("submit", {})[user] = assignment_action(hub, user, tokens[user],
                                                                   "submit")
        # The mistaken learner submits their work again, under the solution's learner's
        # name: later than the real one, nbgrader's own collect would take it.
        day["forgery"] = forge_submission(state, learners[1], learners[0])
        attacks.update(kernel_attacks(hub, state, learners[0], tokens[learners[0]],
                                      learners[1]))
        attacks.update(planted_page_attacks(hub, state, learners[0], tokens[learners[0]],
                                            accounts.instructor, instructor,
                                            secret["instructor_password"], folder))
        attacks.update(limit_attacks(hub, learners[2], tokens[learners[2]]))
        attacks.update(cgroup_attacks(hub, learners[2], tokens[learners[2]]))
        attacks.update(disk_attacks(hub, state, learners[2], tokens[learners[2]]))
        attacks.update(address_attacks(state, learners[1], hub.settings))
        attacks.update(squatter_attack(hub, learners[0], tokens[learners[0]]))
        day["left process"] = leave_a_process(state, learners[2], LEFT_MARK)
        assert day["left process"], "the learner's process did not start"
        start = time.monotonic()
        day["stack dump"] = run_cell(hub, learners[1], tokens[learners[1]],
                                     start_kernel(hub, learners[1], tokens[learners[1]]),
                                     STACK_DUMP_CELL, timeout=420)
        day["timings"]["04's stack dump"] = time.monotonic() - start

        # The instructor collects, autogrades each submission and releases feedback.
        start = time.monotonic()
        day["collect"] = hub.formgrader(f"assignment/{ASSIGNMENT}/collect", instructor)
        attacks["forge a submission under another learner's name"] = (
            day["forgery"].returncode == 0 and "FORGED SUBMISSION" in day["collect"]["log"]
            and learners[0] in day["collect"]["log"])
        day["autograde"] = {user: hub.formgrader(f"submission/{ASSIGNMENT}/{user}/autograde",
                                                 instructor, timeout=AUTOGRADE_S)
                            for user in learners}
        day["timings"]["autograde"] = time.monotonic() - start
        day["generate_feedback"] = hub.formgrader(f"assignment/{ASSIGNMENT}/generate_feedback",
                                                  instructor, timeout=300)
        day["release_feedback"] = hub.formgrader(f"assignment/{ASSIGNMENT}/release_feedback",
                                                 instructor)
        for user in learners:
            assignment_action(hub, user, tokens[user], "fetch_feedback")

        # The grader's `make grades` (export_grades.py) in the course folder.
        course = Path(hub.settings["course_folder"])
        day["course"] = course
        day["make grades"] = as_user(accounts.grader, "make", "-C", str(course), "grades",
                                     f"VENV={state / 'env'}")
        with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
            day["scores"] = {
                submission.student.id: {
                    "total": (submission.score, submission.max_score),
                    "cells": {grade.name: (grade.score, grade.max_score)
                              for notebook in submission.notebooks
                              for grade in notebook.grades}}
                for submission in gradebook.assignment_submissions(ASSIGNMENT)}
        day["idle culler"] = [process.info for process in psutil.process_iter(
            ["pid", "ppid", "username", "cmdline"]) if "jupyterhub_idle_culler" in
            " ".join(process.info["cmdline"] or [])]
        # `serve` runs JupyterHub as its child (and ends the accounts' processes after it).
        day["hub pid"] = next(child.pid for child in psutil.Process(hub.process.pid).children()
                              if "jupyterhub" in " ".join(child.cmdline()))
    finally:
        start = time.monotonic()
        hub.stop()
        day["timings"]["hub stop"] = time.monotonic() - start
        day["hub log"] = hub.log()
        if "left process" in day:
            attacks["leave a process running after the hub stops"] = not [
                pid for pid in day["left process"] if psutil.pid_exists(pid)
                and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
        print("\nclass day timings (s): "
              + ", ".join(f"{k} {v:.0f}" for k, v in day["timings"].items()))
        print(f"hub log (end):\n{hub.log()[-3000:]}")
    return day


@pytest.mark.slow
def test_every_attack_from_a_learner_account_is_blocked(class_day):
    """The class's intrusion test: one line per attack."""
    attacks = class_day["attacks"]
    print("\nintrusion test of the class server:")
    for what, blocked in attacks.items():
        print(f"  {'blocked' if blocked else 'OPEN   '}  {what}")
    assert len(attacks) >= 15
    assert all(attacks.values()), [what for what, blocked in attacks.items() if not blocked]


@pytest.mark.slow
def test_learners_kernels_report_with_their_servers_token(class_day):
    """Each kernel inherits its server's token (JUPYTERHUB_API_TOKEN), owned by its learner,
    with access to the progress service, and the service's address."""
    settings = json.loads((class_day["state"] / "class.json").read_text())
    for user, said in class_day["progress"]["kernels"].items():
        assert said["token_owner"] == user
        assert "access:services!service=progress" in said["token_scopes"], said
        assert said["url"] == (f"http://127.0.0.1:{settings['progress_port']}"
                               f"/services/progress/")
        assert said["reported"] and said["pending"] == 0, said


@pytest.mark.slow
def test_three_learners_verdicts_are_on_the_instructors_board_within_10_s(class_day):
    progress = class_day["progress"]
    learners = class_day["accounts"].learners
    assert progress["instructor page"] == 200
    for user, expected in zip(learners, class_progress.EXPECTED, strict=True):
        assert progress["grid"][user] == expected, progress["grid"]
    late = set(learners) - set(progress["on board after"])
    assert not late, (f"not on the board {class_progress.SEEN_WITHIN_S} s after their "
                      f"checks: {late}; the page showed {progress['grid']}")
    print("\nverdicts on the instructor's board after (s): "
          + ", ".join(f"{user} {s:.1f}" for user, s in progress["on board after"].items()))
    assert (class_progress.SCREENSHOTS_OF_BOARD <= {p.name for p in SCREENSHOTS.iterdir()})


@pytest.mark.slow
def test_the_board_shows_the_common_not_yet_reason_and_who_is_stuck(class_day):
    progress, learners = class_day["progress"], class_day["accounts"].learners
    reasons = progress["board"]["reasons"]
    assert reasons["sampler"][0]["learners"] == 3
    assert reasons["sampler"][0]["reason"].startswith("answer every question first")
    assert reasons["sbatch_header"][0]["learners"] == 2
    assert "would not fit the job" in reasons["sbatch_header"][0]["reason"]
    shown = progress["reasons shown"]
    assert "3 learners" in shown and "answer every question first" in shown
    assert progress["board"]["stuck"] == [{"learner": learners[2], "why": [
        "NOT YET 3 times in a row on sbatch_header"]}]
    assert f"{learners[2]}: NOT YET 3 times in a row on sbatch_header" in progress["stuck shown"]
    lines = progress["instructor csv"].splitlines()
    assert lines[0].startswith("learner,notebook,exercise,latest,attempts")
    assert f"{learners[2]},06_beyond_one_machine,sbatch_header,NOT YET,3,no," in \
        progress["instructor csv"]


@pytest.mark.slow
def test_the_survey_is_aggregated_on_the_board(class_day):
    progress, learners = class_day["progress"], class_day["accounts"].learners
    for said in progress["survey said"].values():
        assert "reached the class's progress service" in said, said
    survey = progress["after survey"]
    assert survey["answered"] == 2 and survey["learners"] == learners[:2]
    assert survey["ratings"]["overall"] == {"count": 2, "mean": 4.0, "distribution": {
        "1": 0, "2": 0, "3": 1, "4": 0, "5": 1}}
    assert survey["comments"]["change"] == [{"learner": learners[1],
                                             "text": "more time for notebook 03"}]
    assert progress["survey row"].split() == ["overall", "2", "4.00", "0", "0", "1", "0", "1"]
    assert progress["survey csv"].splitlines()[0].startswith("learner,")


@pytest.mark.slow
def test_a_learner_reads_no_board_and_writes_only_their_own_records(class_day):
    progress, learners = class_day["progress"], class_day["accounts"].learners
    victim, attacker = learners[0], learners[1]
    refused = {"page": 403, "board.json": 403, "board.csv": 403, "survey.csv": 403}
    assert progress["learner's browser"]["status"] == 403, progress["learner's browser"]
    assert "the instructors' only" in progress["learner's browser"]["text"]
    assert progress["own token"] == refused
    # ... while their own token reports their own records, once each.
    assert [said for said in progress["own token post"]] == [
        (200, {"stored": 1, "rejected": []}), (200, {"stored": 0, "rejected": []})]
    attack = progress["attack"]
    assert {what: attack[what] for what in refused} == refused, "with the server's token"
    # The record naming the victim, with the victim's id, was stored as the attacker's own.
    assert attack["forged"] == [200, {"stored": 1, "rejected": []}]
    before, after = progress["board"]["cells"], progress["after attack"]["cells"]
    assert after[victim] == before[victim]
    assert after[attacker]["sampler"]["attempts"] == before[attacker]["sampler"]["attempts"] + 1
    # Its reason, a planted tag, is text on the instructor's page: nothing of it ran.
    assert progress["planted tags on the page"] == 0
    assert progress["page title"] == "Class progress"


@pytest.mark.slow
def test_one_learner_stalls_or_floods_the_progress_service_for_nobody(class_day):
    """A learner's kernel holds 200 idle connections to the progress service (a slow-loris):
    past the per-account cap the service closes them at once, the rest after its idle
    timeout, and meanwhile another learner's verdict reaches it and the board answers. Then
    it sends 1,200 records: the service keeps at most its cap for one learner and says why
    it refused the rest. (Without the guard a plain server closes none: the planted
    weakness of tests/test_class_progress.py, the same measure.)"""
    stall, learners = class_day["progress"]["stall"], class_day["accounts"].learners
    sys.path.insert(0, str(KIT.parent))
    try:
        from progress import guard, store
    finally:
        sys.path.pop(0)
    held = stall["held"]
    assert held["opened"] == class_progress.STALL_CONNECTIONS, held
    # The cap, plus those opened before the socket tables showed their owner (0.2 s).
    assert held["closed at once"] >= class_progress.STALL_CONNECTIONS - guard.PER_ACCOUNT - 40
    assert stall["released"]["closed later"] == class_progress.STALL_CONNECTIONS
    assert stall["other's check"] == {"ok": True, "pending": 0}, stall["other's check"]
    assert learners[0] in stall["board while held"]
    answers = stall["flood"]
    assert [status for status, *_ in answers] == [200, 200, 200], answers
    assert sum(stored for _, stored, *_ in answers) <= store.RECORDS_PER_LEARNER
    assert stall["kept"] <= store.RECORDS_PER_LEARNER, stall["kept"]
    refused = {reason for *_, reasons in answers for reason in reasons}
    assert refused == {f"{learners[1]} already has {store.RECORDS_PER_LEARNER} records"}
    assert learners[1] in stall["board after flood"]["learners"]


@pytest.mark.slow
def test_no_verdict_is_lost_while_the_service_is_down(class_day):
    down, learner = class_day["progress"]["down"], class_day["accounts"].learners[2]
    assert down["stopped"] == 1
    assert down["checked while down"] == {"ok": True, "pending": 1}
    assert down["board while down"] is None, "the service answered while stopped"
    sent = down["sent"]
    assert sent["returncode"] == 0 and sent["pending"] == 0, sent
    assert down["board"]["cells"][learner]["sbatch_header"]["ok"] is True
    assert down["board"]["cells"][learner]["sbatch_header"]["attempts"] == 4


@pytest.mark.slow
def test_notebook_04s_stack_dump_works_from_a_learner_account(class_day):
    """Each rank wrote its own stack (faulthandler's header, no tracer), and the answer read
    from that dump passes 04's stuck-ranks check, in the learner's own kernel."""
    said = class_day["stack dump"]
    assert "STUCK True" in said and "VERDICT True" in said, said[-3000:]
    assert said.count("most recent call first") >= 2, "each rank dumped its own stack"
    assert "py-spy" not in said


@pytest.mark.slow
def test_the_formgrader_is_the_instructors_only(class_day):
    assert class_day["formgrader status"] == {"instructor": 200, "learner": 403}
    assert class_day["instructor as learner"] is None, (
        "the class password does not log anybody in under an instructor's name")


@pytest.mark.slow
def test_the_instructor_releases_through_the_formgrader(class_day):
    assert class_day["generate"]["success"], class_day["generate"]["log"][-2000:]
    assert class_day["release"]["success"], class_day["release"]["log"][-2000:]
    assert (class_day["state"] / "exchange" / COURSE_ID / "outbound" / ASSIGNMENT
            / NOTEBOOK).is_file()


@pytest.mark.slow
def test_a_learner_sees_the_assignment_and_no_instructor_panel(class_day):
    browser = class_day["browser"]
    assert browser["url"].rstrip("/").endswith("/lab/tree/notebooks"), browser["url"]
    assert ASSIGNMENT in browser["released"]
    assert browser["menu"] == ["Assignment List"], browser["menu"]
    assert set(INSTRUCTOR_PLUGINS) <= set(browser["disabled"]), browser["disabled"]
    assert (SCREENSHOTS / class_day["screenshot"].name).stat().st_size > 10_000


@pytest.mark.slow
def test_every_home_gets_the_notebooks_and_the_learners_own_fetch(class_day):
    state = class_day["state"]
    for user in class_day["accounts"].learners:
        home = state / "homes" / user
        notebooks = sorted(p.name for p in (home / "notebooks").glob("*.ipynb"))
        assert notebooks == sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb"))
        assert (home / ASSIGNMENT / NOTEBOOK).is_file()
        assert not (home / "deploy" / "classroom").exists()


@pytest.mark.slow
def test_autograde_scores_each_learners_work(class_day):
    solution, mistake, untouched = class_day["accounts"].learners
    for user in (solution, mistake, untouched):
        assert class_day["autograde"][user]["success"], class_day["autograde"][user]["log"][
            -3000:]
    scores = class_day["scores"]
    assert set(scores) == {solution, mistake, untouched}
    total, max_score = scores[solution]["total"]
    assert total == max_score > 0
    assert scores[untouched]["total"][0] == 0
    lost = {cell for cell, (got, most) in scores[mistake]["cells"].items() if got < most}
    assert MISTAKE_REQUIREMENT in lost, scores[mistake]
    assert scores[mistake]["total"][0] < max_score


@pytest.mark.slow
def test_grades_csv_says_who_passed(class_day):
    solution, mistake, untouched = class_day["accounts"].learners
    result = class_day["make grades"]
    assert result.returncode == 0, result.stdout + result.stderr
    with open(class_day["course"] / "grades.csv") as f:
        rows = {row["student_id"]: row for row in csv.DictReader(f)}
    assert set(rows) == {solution, mistake, untouched}
    for user, row in rows.items():
        assert float(row["score"]) == class_day["scores"][user]["total"][0]
    assert rows[solution]["passed"] == "yes"
    assert rows[untouched]["passed"] == "no"


def feedback_score(path):
    """The score at the top of nbgrader's feedback page: ``(score, max_score)``."""
    text = re.sub(r"<[^>]+>", " ", path.read_text())
    found = re.search(r"\(Score: ([\d.]+) / ([\d.]+)\)", text)
    return float(found[1]), float(found[2])


@pytest.mark.slow
def test_the_grader_generates_each_learners_feedback(class_day):
    assert class_day["generate_feedback"]["success"], class_day["generate_feedback"]["log"][
        -3000:]
    for user in class_day["accounts"].learners:
        page = class_day["course"] / "feedback" / user / ASSIGNMENT / f"{ASSIGNMENT}.html"
        assert feedback_score(page) == class_day["scores"][user]["total"]


@pytest.mark.slow
def test_each_learner_fetches_their_own_feedback(class_day):
    assert class_day["release_feedback"]["success"], class_day["release_feedback"]
    state = class_day["state"]
    for user in class_day["accounts"].learners:
        feedback = list((state / "homes" / user / ASSIGNMENT / "feedback").glob(
            f"*/{ASSIGNMENT}.html"))
        assert len(feedback) == 1, f"{user}: {feedback}"
        assert feedback_score(feedback[0]) == class_day["scores"][user]["total"]
        assert owners_under(feedback[0].parent) == {pwd.getpwnam(user).pw_uid}


@pytest.mark.slow
def test_files_belong_to_their_learners(class_day):
    state = class_day["state"]
    for user in class_day["accounts"].learners:
        uid = pwd.getpwnam(user).pw_uid
        home = state / "homes" / user
        assert owners_under(home) == {uid}, f"{user}'s home has files of other accounts"
        assert stat.S_IMODE(home.stat().st_mode) == 0o700, f"{user}'s home is open to others"
    inbound = state / "exchange" / COURSE_ID / "inbound"
    owned = {path: pwd.getpwuid(path.stat().st_uid).pw_name for path in inbound.iterdir()}
    # The one forgery of the intrusion test stays in the exchange, uncollected.
    forged = [path for path, owner in owned.items() if not path.name.startswith(owner + "+")]
    assert len(forged) == 1, owned
    assert {owner for path, owner in owned.items() if path not in forged} == set(
        class_day["accounts"].learners)
    for path, user in owned.items():
        assert owners_under(path) == {pwd.getpwnam(user).pw_uid}, path


@pytest.mark.slow
def test_the_exchange_and_homes_have_the_documented_modes(class_day):
    state = class_day["state"]
    exchange = state / "exchange"
    modes = {path: stat.S_IMODE(path.stat().st_mode) for path in (
        exchange, exchange / COURSE_ID, exchange / COURSE_ID / "outbound",
        exchange / COURSE_ID / "inbound", exchange / COURSE_ID / "feedback",
        state / "grader", class_day["course"])}
    assert modes[exchange] == 0o1777
    assert modes[exchange / COURSE_ID] == 0o755
    assert modes[exchange / COURSE_ID / "outbound"] == 0o755
    assert modes[exchange / COURSE_ID / "inbound"] == 0o2733  # write and enter, never list
    assert modes[exchange / COURSE_ID / "feedback"] == 0o711
    assert modes[state / "grader"] & 0o077 == 0 and modes[class_day["course"]] & 0o077 == 0


@pytest.mark.slow
def test_a_learner_cannot_reach_the_others_or_the_instructor(class_day):
    """Tried as the learner's own account, the way their terminal would."""
    state, accounts = class_day["state"], class_day["accounts"]
    learner, other = accounts.learners[1], accounts.learners[0]
    inbound = state / "exchange" / COURSE_ID / "inbound"
    tries = {
        "list the submissions": ["ls", str(inbound)],
        "list another home": ["ls", str(state / "homes" / other)],
        "read another's notebook": ["cat", str(state / "homes" / other / ASSIGNMENT
                                               / NOTEBOOK)],
        "list the course folder": ["ls", str(class_day["course"])],
        "read the gradebook": ["cat", str(class_day["course"] / "gradebook.db")],
        "read the passwords": ["cat", str(state / "secrets" / "learner_passwords")],
        "read the hand-out sheet": ["cat", str(state / "secrets" / "handout.txt")],
    }
    allowed = {what: result.stdout[:200] for what, command in tries.items()
               if (result := as_user(learner, *command)).returncode == 0}
    assert allowed == {}, f"{learner} could: {allowed}"
    # ... while their own submission went in, and the release is theirs to read.
    assert as_user(learner, "ls", str(state / "exchange" / COURSE_ID / "outbound"
                                      / ASSIGNMENT)).returncode == 0


@pytest.mark.slow
def test_the_hub_stops_the_formgrader_and_the_servers_at_the_first_signal(class_day):
    """The hub stops its services and servers with SIGINT, then after 30 s SIGTERM. Started
    with SIGINT ignored, as a background job is, they would ignore it too, and the
    formgrader would hang on SIGTERM: `serve` gives them SIGINT back."""
    log = class_day["hub log"]
    assert "received signal 15" not in log  # jupyter_server's word for a SIGTERM
    assert log.count("Interrupted...") == 4, "the formgrader and three learners' servers"


@pytest.mark.slow
def test_the_idle_culler_runs_as_a_hub_service(class_day):
    cullers = [c for c in class_day["idle culler"] if c["ppid"] == class_day["hub pid"]]
    assert len(cullers) == 1, class_day["idle culler"]
    assert cullers[0]["username"] == "root"


def server_processes(user):
    """The learner's single-user server process (the Python one in their SLURM job step;
    srun, which started it, has the same command line)."""
    found = []
    for process in psutil.process_iter(["username", "cmdline"]):
        command = process.info["cmdline"] or []
        if process.info["username"] == user and len(command) > 2 \
                and Path(command[0]).name.startswith("python") \
                and Path(command[1]).name == "batchspawner-singleuser" \
                and Path(command[2]).name == "jupyterhub-learner":
            found.append(process)
    return found


def visible_devices(user):
    """CUDA_VISIBLE_DEVICES of the learner's server, as SLURM set it in their job."""
    (process,) = server_processes(user)
    return process.environ().get("CUDA_VISIBLE_DEVICES")


def listening_addresses(user):
    """The addresses the learner's server listens on."""
    return {connection.laddr.ip for process in server_processes(user)
            for connection in process.net_connections(kind="tcp")
            if connection.status == psutil.CONN_LISTEN}


def jobs(cluster):
    """``{user: (job state, reason)}`` from squeue."""
    lines = cluster.command("squeue", "--noheader", "--format=%u %T %r").stdout.splitlines()
    return {user: (state, reason) for user, state, reason in map(str.split, lines)}


# A job_submit.lua that refuses nothing: the cluster before its administrator installs the
# class's (the planted weakness of the GPU limit).
PERMIT_EVERY_JOB = """
function slurm_job_submit(job_desc, part_list, submit_uid) return slurm.SUCCESS end
function slurm_job_modify(job_desc, job_rec, part_list, modify_uid) return slurm.SUCCESS end
return slurm.SUCCESS
"""


def learner_sbatch(cluster, user, *options):
    """A learner's own ``sbatch`` of a job that would hold what it asks for 10 minutes; an
    accepted one is cancelled at once (the test's queue stays as the hub left it)."""
    result = as_user(user, "env", f"SLURM_CONF={cluster.folder / 'slurm.conf'}", "sbatch",
                     "--parsable", "--output=/dev/null", *options, "--wrap", "sleep 600")
    if result.returncode == 0:
        cluster.command("scancel", result.stdout.strip().split(";")[0])
    return result


def slurm_gpus():
    spec = importlib.util.spec_from_file_location("slurm_gpus", KIT.parent / "slurm_gpus.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def slurm_day(classroom, class_day):
    """The same class with each learner's server a SLURM job asking for one GPU, on one
    node with two (fake) GPUs: learners 1 and 2 start, 3 waits, 1 stops, 3 starts."""
    reason = slurm.missing()
    if reason:
        skip_or_fail(reason)
    state, accounts = classroom["state"], classroom["accounts"]
    first, second, third = accounts.learners
    # sbatch runs as each learner: the cluster's folder (slurm.conf) must be open to them.
    folder = Path(tempfile.mkdtemp(prefix="ddp-classroom-slurm-", dir="/tmp"))
    folder.chmod(0o755)
    day = {"timings": {}}
    # The first learner's own edit of a notebook, and a notebook they deleted: their next
    # server keeps the one and copies the other back.
    notebooks = state / "homes" / first / "notebooks"
    edited, deleted = sorted(notebooks.glob("*.ipynb"))[:2]
    edited.write_text(edited.read_text().replace('"cells": [', '"cells": [ ', 1))
    day["edited"], day["deleted"] = (edited, edited.read_bytes()), deleted
    deleted.unlink()
    try:
        with slurm.Cluster(folder, nodes=1, cpus=4, gpus=2, memory_mb=4096,
                           job_submit_lua=PERMIT_EVERY_JOB) as cluster:
            kit(state, "init", *classroom["init_args"], "--spawner", "slurm",
                "--gpus-per-learner", "1", "--slurm-conf", str(folder / "slurm.conf"),
                "--exechost", "127.0.0.1", "--start-timeout", "300",
                "--cpus-per-gpu", "2", "--mem-per-gpu", "1G",
                "--runtime", "0:30:00")  # the test cluster's partition allows 60 min
            # Before the class's job_submit.lua is installed, a learner's own job takes both
            # GPUs (held, so it runs nothing), and the kit's check says so; then installed.
            settings = json.loads((state / "class.json").read_text())
            day["no limit: two GPUs"] = learner_sbatch(cluster, first, "--hold",
                                                       "--gres=gpu:2")
            day["no limit: said"] = slurm_gpus().problem(state, settings["slurm"], first)
            shutil.copy(state / "config" / "job_submit.lua", folder / "job_submit.lua")
            day["limit: said"] = slurm_gpus().problem(state, settings["slurm"], first)
            # A learner's process left running while the hub is down, as one waiting for a
            # port would be: `serve` ends it before it starts the hub.
            left = leave_a_process(state, third, LEFT_MARK + 1)
            assert left, "the learner's process did not start"
            start = time.monotonic()
            hub = Hub(state, classroom["serve"], folder / "hub.log")
            day["timings"]["hub start"] = time.monotonic() - start
            day["left before the hub started"] = [pid for pid in left if psutil.pid_exists(pid)]
            try:
                secret = passwords(state)
                tokens = {user: hub.token(user, secret[user]) for user in accounts.learners}
                start = time.monotonic()
                for user in (first, second):
                    hub.start_server(user, tokens[user])
                for user in (first, second):
                    hub.wait_ready(user, tokens[user])
                day["timings"]["two servers"] = time.monotonic() - start
                day["devices"] = {user: visible_devices(user) for user in (first, second)}
                day["progress url"] = {user: server_processes(user)[0].environ().get(
                    "CLASS_PROGRESS_URL") for user in (first, second)}
                day["listening"] = {user: listening_addresses(user) for user in (first, second)}
                # The first learner's server holds their GPU: their own jobs ask for more.
                day["own jobs"] = {" ".join(options): learner_sbatch(cluster, first, *options)
                                   for options in (["--gres=gpu:1"], ["--gres=gpu:2"],
                                                   ["--gpus=1"], ["--array=0-1", "--gres=gpu:1"],
                                                   ["--gres=gpu:1", "--hold"])}
                hub.start_server(third, tokens[third])
                deadline = time.monotonic() + 60
                while third not in jobs(cluster):
                    assert time.monotonic() < deadline, f"no job for {third}: {jobs(cluster)}"
                    time.sleep(1)
                time.sleep(5)  # the queue has had its chance to start it
                day["queue while full"] = jobs(cluster)
                day["third pending"] = hub.server(third, tokens[third])
                start = time.monotonic()
                hub.ok("DELETE", f"/hub/api/users/{first}/server", tokens[first])
                hub.wait_ready(third, tokens[third])
                day["timings"]["third after one stops"] = time.monotonic() - start
                day["devices"][third] = visible_devices(third)
                day["queue after"] = jobs(cluster)
                day["third status"] = hub.request("GET", f"/user/{third}/api/status",
                                                  tokens[third])[0]
            finally:
                start = time.monotonic()
                hub.stop()
                day["timings"]["hub stop"] = time.monotonic() - start
                day["hub log"] = hub.log()
                print("\nSLURM class timings (s): "
                      + ", ".join(f"{k} {v:.0f}" for k, v in day["timings"].items()))
                print(f"hub log (end):\n{hub.log()[-3000:]}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return day


@pytest.mark.slow
def test_slurm_learners_servers_are_their_jobs_with_their_own_gpu(slurm_day, classroom):
    first, second, third = classroom["accounts"].learners
    queue = slurm_day["queue while full"]
    assert queue[first][0] == queue[second][0] == "RUNNING", queue
    devices = slurm_day["devices"]
    assert {devices[first], devices[second]} == {"0", "1"}, devices
    # The one-machine cluster's servers listen on the loopback interface only.
    assert slurm_day["listening"] == {first: {"127.0.0.1"}, second: {"127.0.0.1"}}


@pytest.mark.slow
def test_a_learners_own_sbatch_cannot_hold_more_gpus_than_theirs(slurm_day):
    """Under SLURM each learner holds at most their GPUs over all their jobs: the class's
    job_submit.lua refuses the rest with the reason. Without it (the planted weakness) the
    same learner's job for both GPUs is taken, and the kit's check at `serve` says so."""
    assert slurm_day["no limit: two GPUs"].returncode == 0, slurm_day["no limit: two GPUs"]
    assert "GPUs under SLURM" in (slurm_day["no limit: said"] or ""), slurm_day["no limit: said"]
    assert slurm_day["limit: said"] is None, slurm_day["limit: said"]
    for options, result in slurm_day["own jobs"].items():
        assert result.returncode != 0 and "ddp-workshop:" in result.stderr, (options, result)
    assert "at most 1 GPU(s)" in slurm_day["own jobs"]["--gres=gpu:1"].stderr
    assert "NOT ENFORCED on this host: GPUs" not in slurm_day["hub log"]


@pytest.mark.slow
def test_serve_ends_the_learners_processes_before_the_hub_starts(slurm_day, classroom):
    """The README's restart step: a process a learner left waiting for a service's port is
    gone before the hub binds anything, and `serve` says what it ended."""
    assert slurm_day["left before the hub started"] == []
    third = classroom["accounts"].learners[2]
    assert re.search(rf"before the hub starts: ended \d+ processes of .*{third}",
                     slurm_day["hub log"]), slurm_day["hub log"][:2000]


@pytest.mark.slow
def test_a_new_server_keeps_the_learners_files_and_restores_deleted_ones(slurm_day):
    edited, content = slurm_day["edited"]
    assert edited.read_bytes() == content
    deleted = slurm_day["deleted"]
    assert deleted.read_bytes() == (REPO / "notebooks" / deleted.name).read_bytes()


@pytest.mark.slow
def test_slurm_learners_servers_have_the_progress_services_address(slurm_day, classroom):
    port = json.loads((classroom["state"] / "class.json").read_text())["progress_port"]
    assert set(slurm_day["progress url"].values()) == {
        f"http://127.0.0.1:{port}/services/progress/"}, slurm_day["progress url"]


@pytest.mark.slow
def test_slurm_third_learner_waits_in_the_queue_then_starts(slurm_day, classroom):
    first, second, third = classroom["accounts"].learners
    queue = slurm_day["queue while full"]
    assert queue[third] == ("PENDING", "Resources"), queue
    assert slurm_day["third pending"].get("pending") == "spawn", slurm_day["third pending"]
    assert not slurm_day["third pending"].get("ready")
    after = slurm_day["queue after"]
    assert first not in after and after[third][0] == "RUNNING", after
    devices = slurm_day["devices"]
    assert devices[third] == devices[first] != devices[second], devices
    assert slurm_day["third status"] == 200


CLASS_SIZE = 30


def start_when_let_in(hub, user, token, timeout=SERVER_START_S):
    """Ask for the learner's server until the hub takes the request: past
    concurrent_spawn_limit it answers 429 and the learner's page tries again."""
    deadline = time.monotonic() + timeout
    while True:
        status, body = hub.request("POST", f"/hub/api/users/{user}/server", token)
        if status in (201, 202):
            return
        assert status == 429 and time.monotonic() < deadline, f"{user}: {status} {body}"
        time.sleep(2)


@pytest.fixture(scope="module")
def class_of_30(classroom, class_day):
    """The whole class at once: CLASS_SIZE learner accounts log in (their own passwords,
    over HTTPS), start their servers and run a cell, all together; the times it took."""
    state, accounts = classroom["state"], classroom["accounts"]
    # The local spawner again after SLURM's; the survey anonymous from now on.
    kit(state, "init", *classroom["init_args"], "--anonymous-survey")
    kit(state, "accounts", "add", str(CLASS_SIZE), "--prefix", accounts.learner_prefix)
    names = load_kit("kit_accounts").learner_names(accounts.learner_prefix, CLASS_SIZE)
    secret = passwords(state)
    folder = Path(tempfile.mkdtemp(prefix="ddp-classroom-30-"))
    result = {"names": names, "timings": {},
              "class day forgery": (accounts.learners[1], accounts.learners[0])}
    hub = Hub(state, classroom["serve"], folder / "hub.log")
    try:
        with ThreadPoolExecutor(CLASS_SIZE) as pool:
            start = time.monotonic()
            tokens = dict(zip(names, pool.map(lambda user: hub.token(user, secret[user]),
                                              names), strict=True))
            result["timings"]["all logged in"] = time.monotonic() - start
            assert all(tokens.values()), [user for user, token in tokens.items() if not token]

            def ready(user):
                start_when_let_in(hub, user, tokens[user])
                hub.wait_ready(user, tokens[user])
                return time.monotonic() - start

            result["ready after"] = dict(zip(names, pool.map(ready, names), strict=True))
            result["timings"]["all servers ready"] = time.monotonic() - start

            kernels = {}

            def a_cell(user):
                kernel_id = kernels[user] = start_kernel(hub, user, tokens[user])
                return run_cell(hub, user, tokens[user], kernel_id,
                                "import os; print(os.getuid())")

            start = time.monotonic()
            result["cells"] = dict(zip(names, pool.map(a_cell, names), strict=True))
            result["timings"]["a cell each"] = time.monotonic() - start

            # Every kernel reports a verdict at once, each with its server's own token.
            board_token = hub.token(accounts.instructor, secret["instructor_password"])
            result["reports"] = class_progress.class_reports(
                hub, names, board_token, lambda user, code, timeout: run_cell(
                    hub, user, tokens[user], kernels[user], code, timeout))
            result["timings"]["30 reports on the board"] = \
                result["reports"]["all on the board after"]
            # Three learners answer the (now anonymous) survey from their kernels.
            for user in names[-ANONYMOUS_ANSWERS:]:
                result.setdefault("anonymous answers", {})[user] = run_cell(
                    hub, user, tokens[user], kernels[user],
                    "from workshop_lib import survey\n"
                    f"survey.send_survey({{'overall': 4}}, {{'change': '{ANONYMOUS_MARK}'}})",
                    60)
            result["anonymous survey"] = {
                "board": class_progress.board(hub, board_token)["survey"],
                "csv": hub.request("GET", class_progress.BOARD + "survey.csv", board_token)[1],
                "database": database_rows(state / "progress" / "progress.sqlite")}

            # Each learner fetches (the class day's three have it already), writes their
            # work and submits, all at once; the instructor collects.
            work = class_work(names, solution_script())
            result["work"] = {user: kind for user, (kind, _) in work.items()}

            def submit(user):
                if user not in accounts.learners:
                    assignment_action(hub, user, tokens[user], "fetch")
                kind, script = work[user]
                if script is not None:
                    write_script_cell(hub, user, tokens[user], script)
                return assignment_action(hub, user, tokens[user], "submit")

            start = time.monotonic()
            result["submit"] = dict(zip(names, pool.map(submit, names), strict=True))
            result["timings"]["all submitted"] = time.monotonic() - start
        instructor = hub.token(accounts.instructor, passwords(state)["instructor_password"])
        start = time.monotonic()
        result["collect"] = hub.formgrader(f"assignment/{ASSIGNMENT}/collect", instructor,
                                           timeout=300)
        result["timings"]["collect"] = time.monotonic() - start
        course = Path(hub.settings["course_folder"])
        result["collected"] = sorted(path.parent.parent.name for path in
                                     (course / "submitted").glob(f"*/{ASSIGNMENT}/{NOTEBOOK}"))
        result["hub answers"] = hub.request("GET", "/hub/api/")[0]
    finally:
        start = time.monotonic()
        hub.stop()
        result["timings"]["hub stop"] = time.monotonic() - start
        print(f"\nclass of {CLASS_SIZE} timings (s): "
              + ", ".join(f"{k} {v:.0f}" for k, v in result["timings"].items()))
        shutil.rmtree(folder, ignore_errors=True)
    return result


@pytest.mark.slow
def test_a_class_of_30_logs_in_starts_and_runs_a_cell_at_once(class_of_30):
    names = class_of_30["names"]
    assert set(class_of_30["ready after"]) == set(names)
    uids = {user: str(pwd.getpwnam(user).pw_uid) for user in names}
    ran = {user: said.strip() for user, said in class_of_30["cells"].items()}
    assert ran == uids, "each cell ran in its own learner's kernel, as that learner"
    assert class_of_30["hub answers"] == 200


@pytest.mark.slow
def test_the_class_of_30_submits_and_every_submission_is_collected(class_of_30):
    names = class_of_30["names"]
    assert all(body.get("success", True) for body in class_of_30["submit"].values())
    assert class_of_30["collect"]["success"], class_of_30["collect"]["log"][-3000:]
    # The class day's one forgery (the intrusion test's) stays in the exchange, refused
    # again; the class's own 30 are no forgeries.
    forger, victim = class_of_30["class day forgery"]
    forged = [line for line in class_of_30["collect"]["log"].splitlines()
              if "FORGED SUBMISSION" in line]
    assert all(f"claims to be {victim}'s but belongs to {forger}" in line for line in forged)
    assert class_of_30["collected"] == sorted(names), "nothing lost between submit and collect"


def spread(values):
    """``median (min-max)`` of some seconds."""
    ordered = sorted(values)
    return f"{ordered[len(ordered) // 2]:.0f} ({ordered[0]:.0f}-{ordered[-1]:.0f})"


def class_work(names, solution):
    """What each learner of the class submits, in turn: the solution, the known mistake,
    the untouched release."""
    kinds = [("solution", solution), ("mistake", solution.replace(*MISTAKE)),
             ("untouched", None)]
    return {user: kinds[i % len(kinds)] for i, user in enumerate(names)}


@pytest.fixture(scope="module")
def class_of_30_graded(classroom, class_of_30):
    """The grader's `make autograde`, one submission at a time (as the formgrader's button
    does), each learner's script in the sandbox; each submission's seconds and the scores."""
    state, grader = classroom["state"], classroom["accounts"].grader
    course = Path(json.loads((state / "class.json").read_text())["course_folder"])
    seconds, logs = {}, {}
    for user in class_of_30["names"]:
        start = time.monotonic()
        result = as_user(grader, "make", "-C", str(course), "autograde",
                         f"VENV={state / 'env'}", f"NBGRADER_ARGS=--student {user} --force",
                         timeout=AUTOGRADE_S)
        seconds[user] = time.monotonic() - start
        logs[user] = result.stdout + result.stderr
        assert result.returncode == 0, f"autograde {user}:\n{logs[user][-3000:]}"
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        scores = {submission.student.id: {
            "total": (submission.score, submission.max_score),
            "lost": sorted(grade.name for notebook in submission.notebooks
                           for grade in notebook.grades if grade.score < grade.max_score)}
            for submission in gradebook.assignment_submissions(ASSIGNMENT)}
    kinds = class_of_30["work"]
    by_kind = ", ".join(f"{kind} {spread(s for user, s in seconds.items() if kinds[user] == kind)}"
                        for kind in sorted(set(kinds.values())))
    print(f"\nclass of {CLASS_SIZE} graded: {sum(seconds.values()):.0f} s in all; seconds per "
          f"submission, median (min-max): all {spread(seconds.values())}; {by_kind}")
    return {"seconds": seconds, "scores": scores, "logs": logs}


@pytest.mark.slow
@pytest.mark.whole_class
def test_the_class_of_30_is_autograded_in_the_sandbox_each_on_their_own_work(
        class_of_30, class_of_30_graded):
    work, scores = class_of_30["work"], class_of_30_graded["scores"]
    assert set(scores) >= set(work), "every collected submission has a grade"
    for user, kind in work.items():
        assert "Sandbox: each learner's script runs in bubblewrap" in \
            class_of_30_graded["logs"][user], class_of_30_graded["logs"][user][-2000:]
        total, most = scores[user]["total"]
        if kind == "solution":
            assert total == most > 0, (user, scores[user])
        elif kind == "mistake":
            assert MISTAKE_REQUIREMENT in scores[user]["lost"] and total < most, \
                (user, scores[user])
        else:
            assert total == 0, (user, scores[user])


@pytest.mark.slow
def test_30_learners_reporting_at_once_are_all_on_the_board(class_of_30):
    reports = class_of_30["reports"]
    assert reports["missing"] == [], f"not on the board: {reports['missing']}"
    assert set(reports["kernels"]) == set(class_of_30["names"])
    for user, said in reports["kernels"].items():
        assert said["delivered"] and said["pending"] == 0, (user, said)
    print(f"\n{CLASS_SIZE} learners reporting at once: all on the board after "
          f"{reports['all on the board after']:.1f} s (the slowest kernel's report "
          f"{reports['slowest report']:.2f} s)")


ANONYMOUS_ANSWERS = 3
ANONYMOUS_MARK = "anonymous-answer-7a31"


def database_rows(path):
    """Every row of every table of the progress service's database, as text: what the
    grader account (an instructor's kernel on the formgrader) reads there."""
    import sqlite3

    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = [name for (name,) in db.execute("SELECT name FROM sqlite_master "
                                                  "WHERE type = 'table'")]
        return [" ".join(map(str, row)) for table in tables
                for row in db.execute(f"SELECT * FROM {table}")]
    finally:
        db.close()


@pytest.mark.slow
def test_an_anonymous_survey_names_nobody_on_the_board_its_csv_or_its_database(
        class_of_30, classroom):
    """`init --anonymous-survey` (the class of 30's): three learners answer; the board and
    survey.csv count three answers and name nobody, and no row of the service's database
    holds a learner's name beside their answer. The class day's named answers are found
    linked there (the test sees a link where there is one)."""
    survey, names = class_of_30["anonymous survey"], class_of_30["names"]
    for user, said in class_of_30["anonymous answers"].items():
        assert "reached the class's progress service" in said, (user, said)
    board = survey["board"]
    assert board["anonymous"] and board["answered"] == ANONYMOUS_ANSWERS, board
    assert board["learners"] == [] and board["comments"]["change"] == [ANONYMOUS_MARK] * 3
    header = survey["csv"].splitlines()[0].split(",")
    assert "learner" not in header and "overall" in header, header
    for name in names:
        assert name not in json.dumps(board) and name not in survey["csv"]
    rows = survey["database"]
    assert [row for row in rows if ANONYMOUS_MARK in row and
            any(name in row for name in names)] == []
    assert len([row for row in rows if ANONYMOUS_MARK in row]) == ANONYMOUS_ANSWERS
    named = class_progress.SURVEYS[0][1]["most_useful"]
    first = classroom["accounts"].learners[0]
    assert [row for row in rows if named in row and first in row], "the planted link"


# The kit's parts that start nothing: fast.

def test_make_classroom_runs_the_kit_in_order(tmp_path):
    accounts = Accounts()
    env, init, add, serve = make_classroom(tmp_path / "class", accounts, ["--port", "8100"])
    assert f"--course-env {sys.prefix}" in env
    assert init.endswith("init --port 8100")
    assert add.endswith(f"accounts add 3 --prefix {accounts.learner_prefix}")


def load_kit(module="kit_serve"):
    """One of the class kit's modules beside classroom.py, imported as classroom.py imports
    it (kit_serve: the hub's checks; kit: what every command shares)."""
    sys.path.insert(0, str(KIT.parent))
    try:
        return importlib.import_module(module)
    finally:
        sys.path.remove(str(KIT.parent))


def test_serve_names_each_limit_this_host_cannot_enforce(capsys, monkeypatch, tmp_path):
    """`make classroom` (its `serve`) says at start, one line each, which learners' limits
    this host cannot hold: what limits.py finds here, whatever this host has, and under
    SLURM the GPUs a learner's own sbatch can take."""
    kit = load_kit()
    spec = importlib.util.spec_from_file_location("class_limits", KIT.parent / "limits.py")
    limits = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(limits)
    shares = {"memory_bytes": 2**30, "cpus": 1, "nproc": 100}
    local = {"spawner": "local", "gpus_per_learner": 1, "gpu_ids": ["0", "1"],
             "limits": shares}
    for home_bytes in (0, 2**30):
        kit.say_unenforced({**local, "home_bytes": home_bytes})
        said = [line.removeprefix("NOT ENFORCED on this host: ")
                for line in capsys.readouterr().out.splitlines()]
        disk_problem = kit.disks().problem() if home_bytes else "init --home-size 0"
        assert said == [*limits.Cgroups(shares).unenforced(gpus_shared=True),
                        *([f"disk: the homes share the class folder's filesystem "
                           f"({disk_problem})"] if disk_problem else [])], said
    # Under SLURM it asks the cluster as a learner (slurm_gpus.py): no sbatch answers here.
    monkeypatch.setenv("PATH", str(tmp_path))
    slurm_settings = {"spawner": "slurm", "limits": shares, "home_bytes": 0,
                      "slurm": {"gpus_per_learner": 1, "slurm_conf": "/nonexistent.conf"}}
    kit.say_unenforced(slurm_settings)
    assert "GPUs under SLURM: not asked yet" in capsys.readouterr().out
    with tempfile.TemporaryDirectory() as state:
        Path(state, "learners.txt").write_text("nobody\n")
        kit.say_unenforced(slurm_settings, Path(state))
    assert "NOT ENFORCED on this host: GPUs under SLURM: " in capsys.readouterr().out
    # The exchange's quotas: here a plain folder, so none (disks.py names why).
    with tempfile.TemporaryDirectory() as state:
        (Path(state) / "exchange").mkdir()
        kit.say_unenforced({**local, "home_bytes": 2**30, "exchange_quota_bytes": 2**20},
                           Path(state))
    assert ("disk: no learner's quota in the exchange (the exchange is not a filesystem of "
            "its own" in capsys.readouterr().out)


def test_a_class_folder_under_a_private_one_is_refused(tmp_path):
    """pytest's temporary folders, like root's home, are closed to other accounts: a class
    there would start and then fail every learner's server."""
    kit_module = load_kit("kit")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    assert kit_module.closed_folders(private / "class") == [private] + [
        folder for folder in private.parents if not folder.stat().st_mode & stat.S_IXOTH]
    if os.geteuid() == 0:  # the command refuses before anything is written
        result = subprocess.run([sys.executable, str(KIT), "--state", str(private / "class"),
                                 "init"], capture_output=True, text=True, timeout=60)
        assert result.returncode == 1
        assert result.stderr.startswith(f"classroom: {private} is closed to other accounts")
        assert len(result.stderr.strip().splitlines()) == 1
        assert not (private / "class").exists()


def test_the_learners_lab_keeps_the_assignment_list_and_drops_instructor_panels():
    page_config = json.loads((KIT.parent / "learner" / "labconfig" / "page_config.json")
                             .read_text())
    disabled = {name for name, off in page_config["disabledExtensions"].items() if off}
    assert disabled == set(INSTRUCTOR_PLUGINS)


def test_the_class_pins_exact_versions():
    pins = load_kit("kit_env").classroom_pins()
    assert pins and all(re.fullmatch(r"[\w-]+==[\w.]+", pin) for pin in pins), pins
    assert {pin.split("==")[0] for pin in pins} == {"jupyterhub", "batchspawner",
                                                     "jupyterhub-idle-culler"}


def test_console_scripts_move_to_the_class_python_and_other_files_stay(tmp_path):
    """The course environment's scripts start its own Python, which learners cannot run:
    the class environment's copies start the class's Python, whichever path (with or
    without symbolic links) the course environment was built through."""
    kit_module = load_kit("kit_env")
    course_bins = {"/work/main/.venv/bin", "/real/main/.venv/bin"}
    for interpreter in ("/work/main/.venv/bin/python", "/real/main/.venv/bin/python3.11"):
        script = tmp_path / "jupyter"
        script.write_text(f"#!{interpreter}\nimport sys\n")
        target = tmp_path / "copy"
        target.unlink(missing_ok=True)
        assert kit_module.rewrite_script(script, target, course_bins, "/srv/class/env/bin/python")
        assert target.read_text() == "#!/srv/class/env/bin/python\nimport sys\n"
        assert os.access(target, os.X_OK)
    binary, shell = tmp_path / "ruff", tmp_path / "activate"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00")
    shell.write_text("#!/bin/sh\necho /work/main/.venv/bin/python\n")
    for other in (binary, shell):
        assert not kit_module.rewrite_script(other, tmp_path / "no", course_bins, "/x/python")
    assert not (tmp_path / "no").exists()


def tls_args(**given):
    defaults = {"ip": "127.0.0.1", "ssl_cert": "", "ssl_key": "", "self_signed": "",
                "insecure_http": False}
    return argparse.Namespace(**{**defaults, **given})


def test_plain_http_is_refused_off_the_loopback_unless_asked_for(tmp_path):
    kit_module = load_kit("kit_init")
    assert kit_module.tls_files(tmp_path, tls_args()) == (None, None)
    with pytest.raises(kit_module.KitError, match="--insecure-http"):
        kit_module.tls_files(tmp_path, tls_args(ip="0.0.0.0"))
    assert kit_module.tls_files(tmp_path, tls_args(ip="0.0.0.0", insecure_http=True)) == (
        None, None)
    with pytest.raises(kit_module.KitError, match="go together"):
        kit_module.tls_files(tmp_path, tls_args(ip="0.0.0.0", ssl_cert="/x.crt"))


@pytest.mark.skipif(not shutil.which("openssl"), reason="needs openssl")
def test_self_signed_makes_a_certificate_for_the_name_only_root_reads_its_key(tmp_path):
    kit_module = load_kit("kit_init")
    cert, key = kit_module.tls_files(tmp_path, tls_args(ip="0.0.0.0",
                                                        self_signed="class.example.org"))
    shown = subprocess.run(["openssl", "x509", "-in", cert, "-noout", "-subject", "-ext",
                            "subjectAltName"], capture_output=True, text=True, check=True)
    assert "class.example.org" in shown.stdout and "127.0.0.1" in shown.stdout
    assert stat.S_IMODE(Path(key).stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "secrets").stat().st_mode) == 0o700
    # Kept for the same name: the class's browsers accepted it once.
    again = kit_module.tls_files(tmp_path, tls_args(self_signed="class.example.org"))
    assert again == (cert, key) and Path(cert).read_bytes() == Path(again[0]).read_bytes()


def test_the_handout_has_one_card_per_learner_and_only_root_reads_it(tmp_path):
    kit_module = load_kit("kit_accounts")
    kit_module.save_learner_passwords(tmp_path, {"learner01": "abcdEFGH3467",
                                                 "learner02": "qrstUVWX9467"})
    sheet = kit_module.write_handout(tmp_path, {"ip": "10.0.0.5", "port": 8000,
                                                "ssl_cert": "/x.crt"})
    text = sheet.read_text()
    assert text.count("account:") == 2 and "https://10.0.0.5:8000/" in text
    assert "learner02" in text and "qrstUVWX9467" in text
    for path in (sheet, tmp_path / "secrets" / "learner_passwords"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert kit_module.learner_passwords(tmp_path)["learner01"] == "abcdEFGH3467"


def test_sizes_are_read_with_their_unit():
    kit_module = load_kit("kit")
    assert kit_module.parse_size("8G") == 8 * 2**30
    assert kit_module.parse_size("64m") == 64 * 2**20
    assert kit_module.parse_size("0") == 0
    with pytest.raises(kit_module.KitError, match="not a size"):
        kit_module.parse_size("lots")


@pytest.mark.skipif(os.geteuid() != 0, reason="makes folders of other accounts: needs root")
def test_init_refuses_a_course_exchange_folder_another_account_made_first(tmp_path):
    """A learner who made exchange/<course> before `init` would own the release and read
    every submission: init names the folder and stops. Two system accounts stand in for
    the grader (daemon) and the squatter (nobody)."""
    kit_module = load_kit("kit_init")
    course = tmp_path / "exchange" / COURSE_ID
    course.mkdir(parents=True)
    nobody = pwd.getpwnam("nobody")
    os.chown(course, nobody.pw_uid, nobody.pw_gid)
    with pytest.raises(kit_module.KitError, match=f"{course} belongs to uid {nobody.pw_uid}"):
        kit_module.make_exchange(tmp_path, "daemon", COURSE_ID)
    course.rmdir()
    kit_module.make_exchange(tmp_path, "daemon", COURSE_ID)
    daemon = pwd.getpwnam("daemon").pw_uid
    for name, mode in kit_module.EXCHANGE_MODES.items():
        folder = course / name
        assert (folder.stat().st_uid, stat.S_IMODE(folder.stat().st_mode)) == (daemon, mode)


def test_internal_ports_any_account_could_bind_are_refused_saying_the_fix(monkeypatch):
    """A port from the host's first unprivileged port on could be taken by a learner's
    process while the hub restarts: refused in one line; where the host lets every account
    bind every port (containers often do), the line gives the sysctl."""
    kit = load_kit()
    ports = dict(kit.INTERNAL_PORTS)
    sys.path.insert(0, str(KIT.parent))
    try:
        import listen
    finally:
        sys.path.remove(str(KIT.parent))
    if listen.unprivileged_start() > max(ports.values()):  # the usual 1024
        kit.check_internal_ports(ports)  # the defaults pass
        with pytest.raises(kit.KitError, match="--hub-port 8081: any account .* give one "
                                               "below"):
            kit.check_internal_ports({**ports, "hub_port": 8081})
    monkeypatch.setattr(listen, "unprivileged_start", lambda: 0)
    with pytest.raises(kit.KitError, match="ip_unprivileged_port_start=1024"):
        kit.check_internal_ports(ports)
