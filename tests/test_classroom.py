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
  list the others' submissions, read another home or the grader's course folder.

The SLURM variant runs the same hub with batchspawner on a one-node test SLURM with two fake
GPUs (tests/slurm.py): two learners' servers run as their jobs with disjoint
CUDA_VISIBLE_DEVICES, the third waits in the queue and starts when one stops.

Needs root (accounts), Debian's python3.11, npm, sudo, Chromium, SLURM and munge (.ci/run
installs them); without them it is skipped, saying why, except under CI, where that fails.
The accounts it creates have a unique prefix and are removed at the end, with the folder.
"""
import csv
import importlib.util
import json
import os
import pwd
import re
import secrets
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import nbformat
import psutil
import pytest
import slurm
from nbgrader.api import Gradebook
from test_browser import CHROMIUM, CHROMIUM_ARGS

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


def as_user(user, *command):
    """Run ``command`` as ``user`` (sudo, as a learner's own shell would)."""
    return subprocess.run(["sudo", "-u", user, "--", *command], capture_output=True,
                          text=True, timeout=60, cwd="/")


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
        self.url = f"http://127.0.0.1:{self.settings['port']}"
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
            with urllib.request.urlopen(request, timeout=timeout) as response:
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
        init_args = ["--grader", accounts.grader, "--instructors", accounts.instructor,
                     "--port", str(free_port()), "--hub-port", str(free_port()),
                     "--proxy-api-port", str(free_port()),
                     "--formgrader-port", str(free_port())]
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
        kit = load_kit()
        left = [name for name in (accounts.grader, *accounts.learners) if kit.user_exists(name)]
        assert not left, f"accounts left behind: {left}"
        shutil.rmtree(state, ignore_errors=True)


def passwords(state):
    return {name: (state / "secrets" / name).read_text().strip()
            for name in ("class_password", "instructor_password")}


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
        page = browser.new_page(viewport={"width": 1400, "height": 900})
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
        tokens = {user: hub.token(user, secret["class_password"]) for user in learners}
        day["instructor as learner"] = hub.token(accounts.instructor,
                                                 secret["class_password"])
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
            hub, learners[0], secret["class_password"], screenshot)
        day["timings"]["browser"] = time.monotonic() - start
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(screenshot, SCREENSHOTS / screenshot.name)
        day["screenshot"] = screenshot

        # The two others start their servers; everybody fetches, works and submits.
        for user in learners[1:]:
            hub.start_server(user, tokens[user])
        for user in learners:
            hub.wait_ready(user, tokens[user])
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

        # The instructor collects, autogrades each submission and releases feedback.
        start = time.monotonic()
        day["collect"] = hub.formgrader(f"assignment/{ASSIGNMENT}/collect", instructor)
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
        day["hub pid"] = hub.process.pid
    finally:
        start = time.monotonic()
        hub.stop()
        day["timings"]["hub stop"] = time.monotonic() - start
        day["hub log"] = hub.log()
        print("\nclass day timings (s): "
              + ", ".join(f"{k} {v:.0f}" for k, v in day["timings"].items()))
        print(f"hub log (end):\n{hub.log()[-3000:]}")
    return day


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
    submissions = {path.name.split("+")[0]: path for path in inbound.iterdir()}
    assert set(submissions) == set(class_day["accounts"].learners)
    for user, path in submissions.items():
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
        "read the passwords": ["cat", str(state / "secrets" / "class_password")],
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
        with slurm.Cluster(folder, nodes=1, cpus=4, gpus=2) as cluster:
            kit(state, "init", *classroom["init_args"], "--spawner", "slurm",
                "--gpus-per-learner", "1", "--slurm-conf", str(folder / "slurm.conf"),
                "--exechost", "127.0.0.1", "--start-timeout", "300",
                "--runtime", "0:30:00")  # the test cluster's partition allows 60 min
            start = time.monotonic()
            hub = Hub(state, classroom["serve"], folder / "hub.log")
            day["timings"]["hub start"] = time.monotonic() - start
            try:
                secret = passwords(state)["class_password"]
                tokens = {user: hub.token(user, secret) for user in accounts.learners}
                start = time.monotonic()
                for user in (first, second):
                    hub.start_server(user, tokens[user])
                for user in (first, second):
                    hub.wait_ready(user, tokens[user])
                day["timings"]["two servers"] = time.monotonic() - start
                day["devices"] = {user: visible_devices(user) for user in (first, second)}
                day["listening"] = {user: listening_addresses(user) for user in (first, second)}
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
def test_a_new_server_keeps_the_learners_files_and_restores_deleted_ones(slurm_day):
    edited, content = slurm_day["edited"]
    assert edited.read_bytes() == content
    deleted = slurm_day["deleted"]
    assert deleted.read_bytes() == (REPO / "notebooks" / deleted.name).read_bytes()


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


# The kit's parts that start nothing: fast.

def test_make_classroom_runs_the_kit_in_order(tmp_path):
    accounts = Accounts()
    env, init, add, serve = make_classroom(tmp_path / "class", accounts, ["--port", "8100"])
    assert f"--course-env {sys.prefix}" in env
    assert init.endswith("init --port 8100")
    assert add.endswith(f"accounts add 3 --prefix {accounts.learner_prefix}")


def load_kit():
    spec = importlib.util.spec_from_file_location("classroom_kit", KIT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_class_folder_under_a_private_one_is_refused(tmp_path):
    """pytest's temporary folders, like root's home, are closed to other accounts: a class
    there would start and then fail every learner's server."""
    kit_module = load_kit()
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
    pins = load_kit().classroom_pins()
    assert pins and all(re.fullmatch(r"[\w-]+==[\w.]+", pin) for pin in pins), pins
    assert {pin.split("==")[0] for pin in pins} == {"jupyterhub", "batchspawner",
                                                     "jupyterhub-idle-culler"}


def test_console_scripts_move_to_the_class_python_and_other_files_stay(tmp_path):
    """The course environment's scripts start its own Python, which learners cannot run:
    the class environment's copies start the class's Python, whichever path (with or
    without symbolic links) the course environment was built through."""
    kit_module = load_kit()
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
