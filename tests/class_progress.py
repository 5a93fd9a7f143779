"""The progress service and the instructors' board on the class server, as the class test's
day drives them (tests/test_classroom.py calls these inside the hubs it starts already):

- ``progress_day``: three learners' kernels run real ``labs.check`` calls (the sampler
  and SLURM-header exercises: cheap checks, no launch) while the instructor's Chromium
  shows the board; each learner's verdicts must be on it within 10 s of their last check.
  Then a learner's kernel tries the board and another learner's record with its server's
  token, two learners send the survey, a learner's browser and own token are refused the
  board, and the service stops answering while a learner checks: the verdict comes through
  once it answers again;
- ``class_reports``: a class of 30 reports at once, each kernel with its own token; the
  time until all are on the board.

Each step returns what it saw; the tests in test_classroom.py assert on it.
"""
import datetime
import json
import re
import signal
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import psutil
from test_browser import CHROMIUM, CHROMIUM_ARGS

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # test_classroom's fixtures skip (or under CI fail) without it
    sync_playwright = None

BOARD = "/services/progress/"
SEEN_WITHIN_S = 10  # the promise: a verdict on the board within 10 s
# What each learner checks, in order, with the stub (NOT YET) or the reference (PASS).
PLANS = (
    [("sampler", "stub"), ("sampler", "solution"), ("sbatch_header", "solution")],
    [("sampler", "stub"), ("sbatch_header", "stub")],
    [("sampler", "stub"), ("sbatch_header", "stub"), ("sbatch_header", "stub"),
     ("sbatch_header", "stub")],
)
# The board's cells those give: "PASS (2)" is the latest verdict and how many were sent.
EXPECTED = (
    {"sampler": "PASS (2)", "sbatch_header": "PASS (1)"},
    {"sampler": "NOT YET (1)", "sbatch_header": "NOT YET (1)"},
    {"sampler": "NOT YET (1)", "sbatch_header": "NOT YET (3)"},
)
SURVEYS = (
    ({"overall": 5, "explanations": 4, "exercises": 5, "pace": 3, "environment": 4},
     {"most_useful": "the hung job's stacks"}),
    ({"overall": 3, "explanations": 4, "exercises": 4, "pace": 4, "environment": 2},
     {"change": "more time for notebook 03"}),
)
SCREENSHOTS_OF_BOARD = {"instructor-board.png", "learner-refused-board.png"}
PLANTED_REASON = "<img src=x onerror=\"document.title='BOARD SCRIPT RAN'\">"

CHECK_CELL = """
import json, os, time, urllib.request
from workshop_lib import labs, progress
said = {"url": os.environ.get("CLASS_PROGRESS_URL")}
whoami = urllib.request.Request(os.environ["JUPYTERHUB_API_URL"] + "/user", headers={
    "Authorization": "token " + os.environ["JUPYTERHUB_API_TOKEN"]})
with urllib.request.urlopen(whoami, timeout=10) as answer:
    model = json.load(answer)
said["token_owner"], said["token_scopes"] = model["name"], model["scopes"]
said["verdicts"] = []
for key, which in PLAN:
    exercise = labs.get(key)
    answer = exercise.solution() if which == "solution" else exercise.stub()
    verdict = labs.check(key, answer)
    said["verdicts"].append([key, verdict.ok, verdict.reason])
said["checked_at"] = time.time()
said["reported"] = progress.wait_for_reports(10)
said["pending"] = len(progress.pending())
said["ids"] = [entry["id"] for entry in progress.records()]
print("RESULT " + json.dumps(said))
"""

# As a learner's own code could: the board, its JSON and CSV with the server's token, and
# a record that names another learner and carries that learner's record id.
ATTACK_CELL = """
import json, os, time, urllib.error, urllib.request
from datetime import datetime, timezone
base, token = os.environ["CLASS_PROGRESS_URL"], os.environ["JUPYTERHUB_API_TOKEN"]
def call(method, path, body=None):
    request = urllib.request.Request(base + path, method=method, headers={
        "Authorization": "token " + token, "Content-Type": "application/json"},
        data=None if body is None else json.dumps(body).encode())
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, None
said = {path or "page": call("GET", path)[0]
        for path in ("", "board.json", "board.csv", "survey.csv")}
forged = {"id": OTHER_ID, "learner": OTHER, "kind": "exercise", "key": "sampler",
          "notebook": "02_from_one_gpu_to_many", "ok": False, "reason": REASON,
          "time": datetime.now(timezone.utc).isoformat(), "attempt": 9, "details": {}}
said["forged"] = call("POST", "api/records", {"records": [forged]})
print("RESULT " + json.dumps(said))
"""

SURVEY_CELL = """
from workshop_lib import survey
survey.send_survey(RATINGS, COMMENTS)
"""

DOWN_CELL = """
import json
from workshop_lib import labs, progress
verdict = labs.check("sbatch_header", labs.get("sbatch_header").solution())
progress.wait_for_reports(10)
print("RESULT " + json.dumps({"ok": verdict.ok, "pending": len(progress.pending())}))
"""

SEND_CELL = """
import json, subprocess, sys
from workshop_lib import progress
sent = subprocess.run([sys.executable, "-m", "workshop_lib.labs", "progress", "--send"],
                      capture_output=True, text=True, timeout=120)
print("RESULT " + json.dumps({"returncode": sent.returncode, "said": sent.stdout[-1500:],
                              "errors": sent.stderr[-1500:], "pending": len(progress.pending())}))
"""

# A learner's own code stalling the service: CONNECTIONS connections that send nothing (a
# slow-loris), held in the kernel; how many the service closed at once. STALL_END_CELL:
# how many it closed after its idle timeout, then the rest closed.
STALL_CELL = """
import json, os, socket, time
from urllib.parse import urlsplit
_address = urlsplit(os.environ["CLASS_PROGRESS_URL"])
_held = []
for _ in range(CONNECTIONS):
    try:
        _held.append(socket.create_connection((_address.hostname, _address.port), timeout=5))
    except OSError:
        break
time.sleep(1)
def _closed(connection):
    connection.settimeout(0.05)
    try:
        return connection.recv(1) == b""
    except socket.timeout:
        return False
    except OSError:
        return True
print("RESULT " + json.dumps({"opened": len(_held), "closed at once": sum(map(_closed, _held))}))
"""
STALL_END_CELL = """
time.sleep(WAIT_S)
said = {"closed later": sum(map(_closed, _held))}
for connection in _held:
    connection.close()
print("RESULT " + json.dumps(said))
"""
# A learner's own code flooding the service with records: POSTS requests of PER_POST
# records each; per request the status, how many were stored, how many refused and why.
FLOOD_CELL = """
import json, os, urllib.error, urllib.request, uuid
from datetime import datetime, timezone
base, token = os.environ["CLASS_PROGRESS_URL"], os.environ["JUPYTERHUB_API_TOKEN"]
answers = []
for _ in range(POSTS):
    records = [{"id": uuid.uuid4().hex, "kind": "exercise", "key": "sampler",
                "notebook": "02_from_one_gpu_to_many", "ok": False, "reason": REASON,
                "time": datetime.now(timezone.utc).isoformat(), "attempt": 1,
                "details": {"n": n}} for n in range(PER_POST)]
    request = urllib.request.Request(base + "api/records", method="POST", headers={
        "Authorization": "token " + token, "Content-Type": "application/json"},
        data=json.dumps({"records": records}).encode())
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            body = json.load(answer)
            answers.append([answer.status, body["stored"], len(body["rejected"]),
                            sorted({r["reason"] for r in body["rejected"]})])
    except urllib.error.HTTPError as error:
        answers.append([error.code, 0, 0, []])
print("RESULT " + json.dumps(answers))
"""
STALL_CONNECTIONS = 200
FLOOD_REASON = "flooding the progress service"

# The board's grid as the page shows it: {learner: {exercise: cell text}}.
GRID_STATE = """() => {
  const state = {};
  for (const row of document.querySelectorAll("#grid tr[data-learner]")) {
    const cells = {};
    for (const cell of row.querySelectorAll("td[data-key]")) {
      cells[cell.dataset.key] = cell.textContent;
    }
    state[row.dataset.learner] = cells;
  }
  return state;
}"""


def result(said):
    """The JSON a cell printed after RESULT (the cell's whole output in the error)."""
    found = re.search(r"^RESULT (.*)$", said, re.M)
    assert found, f"the cell did not finish:\n{said[-3000:]}"
    return json.loads(found[1])


def with_values(cell, **values):
    return "".join(f"{name} = {value!r}\n" for name, value in values.items()) + cell


def in_a_thread(cell):
    """``cell``, run in a thread of its own: the browser's driver holds this thread's event
    loop, and a kernel's websocket needs one."""
    def run(*args):
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(cell, *args).result()
    return run


def board(hub, token):
    return hub.ok("GET", BOARD + "board.json", token)


def login(page, hub, user, password):
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", password)
    page.click("#login_submit")
    page.wait_for_url(lambda url: "/hub/login" not in url, timeout=120_000)


def new_page(playwright):
    browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
    return browser, browser.new_page(viewport={"width": 1400, "height": 1000},
                                     ignore_https_errors=True)


def service_processes(grader):
    return [process for process in psutil.process_iter(["username", "cmdline"])
            if process.info["username"] == grader
            and "progress.service" in " ".join(process.info["cmdline"] or [])]


def watch_the_checks(page, learners, check, timeout=420):
    """Run each learner's checks (in threads) while the instructor's page polls; when each
    learner's cells first showed their final state, and what their kernel said."""
    seen_at, said = {}, {}
    with ThreadPoolExecutor(len(learners)) as pool:
        running = {user: pool.submit(check, user, plan)
                   for user, plan in zip(learners, PLANS, strict=True)}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = page.evaluate(GRID_STATE)
            now = time.time()
            for user, expected in zip(learners, EXPECTED, strict=True):
                if user not in seen_at and state.get(user, {}) == expected:
                    seen_at[user] = now
            for user, future in running.items():
                if future.done() and user not in said:
                    said[user] = result(future.result())
            late = [user for user in said if user not in seen_at
                    and now > said[user]["checked_at"] + SEEN_WITHIN_S]
            if len(said) == len(learners) and (len(seen_at) == len(learners) or late):
                break
            page.wait_for_timeout(250)
    return seen_at, said, page.evaluate(GRID_STATE)


def progress_day(hub, accounts, tokens, instructor_token, secret, folder, cell,
                 screenshots):
    """The day's progress steps (module docstring); ``cell(user, code, timeout)`` runs
    code in that learner's kernel. Returns what each step showed."""
    learners, grader = accounts.learners, accounts.grader
    seen = {"timings": {}}
    cell = in_a_thread(cell)

    def check(user, plan):
        return cell(user, with_values(CHECK_CELL, PLAN=plan), 420)

    with sync_playwright() as playwright:
        browser, page = new_page(playwright)
        try:
            login(page, hub, accounts.instructor, secret["instructor_password"])
            seen["instructor page"] = page.goto(hub.url + BOARD).status
            page.locator("#grid tr").first.wait_for(timeout=30_000)
            start = time.monotonic()
            seen_at, said, seen["grid"] = watch_the_checks(page, learners, check)
            seen["timings"]["three learners' checks"] = time.monotonic() - start
            seen["kernels"] = said
            seen["on board after"] = {user: seen_at[user] - said[user]["checked_at"]
                                      for user in seen_at}
            seen["board"] = board(hub, instructor_token)

            # Learner 2's own code: the board with their server's token, and a record that
            # names learner 1 and reuses one of learner 1's ids, its reason a planted tag.
            victim, attacker = learners[0], learners[1]
            seen["attack"] = result(cell(attacker, with_values(
                ATTACK_CELL, OTHER=victim, OTHER_ID=said[victim]["ids"][0],
                REASON=PLANTED_REASON), 60))
            page.get_by_text(PLANTED_REASON).first.wait_for(timeout=SEEN_WITHIN_S * 1000)
            seen["after attack"] = board(hub, instructor_token)
            seen["planted tags on the page"] = page.locator("#reasons img, #grid img").count()
            seen["page title"] = page.title()

            for user, (ratings, comments) in zip(learners[:2], SURVEYS, strict=True):
                seen.setdefault("survey said", {})[user] = cell(user, with_values(
                    SURVEY_CELL, RATINGS=ratings, COMMENTS=comments), 60)
            page.locator("#ratings tr[data-rating=overall] td", has_text="4.00").wait_for(
                timeout=SEEN_WITHIN_S * 1000)
            seen["after survey"] = board(hub, instructor_token)["survey"]
            seen["survey row"] = page.locator("#ratings tr[data-rating=overall]").inner_text()
            seen["reasons shown"] = page.locator("#reasons").inner_text()
            seen["stuck shown"] = page.locator("#stuck").inner_text()
            page.screenshot(path=str(folder / "instructor-board.png"), full_page=True)
        except Exception:
            page.screenshot(path=str(folder / "FAILED-instructor-board.png"), full_page=True)
            raise
        finally:
            browser.close()
        seen["learner's browser"] = learner_opens_the_board(
            playwright, hub, learners[2], secret[learners[2]], folder)
    screenshots(folder / "instructor-board.png", folder / "learner-refused-board.png")
    seen["own token"] = {path or "page": hub.request("GET", BOARD + path, tokens[learners[2]])[0]
                         for path in ("", "board.json", "board.csv", "survey.csv")}
    # A script of the learner's with their own API token (not the server's) reports too.
    own = {"id": uuid.uuid4().hex, "kind": "exercise", "key": "sampler",
           "notebook": "02_from_one_gpu_to_many", "ok": False, "reason": "sent by a script",
           "time": datetime.datetime.now(datetime.UTC).isoformat(), "attempt": 2,
           "details": {}}
    seen["own token post"] = [hub.request("POST", BOARD + "api/records", tokens[learners[2]],
                                          json_body={"records": [own]}) for _ in range(2)]
    seen["instructor csv"] = hub.request("GET", BOARD + "board.csv", instructor_token)[1]
    seen["survey csv"] = hub.request("GET", BOARD + "survey.csv", instructor_token)[1]
    seen["stall"] = stall_and_flood(hub, learners[1], learners[0], instructor_token, cell)
    seen["down"] = service_down(hub, grader, learners[2], instructor_token, cell)
    return seen


def stall_and_flood(hub, attacker, other, instructor_token, cell):
    """The attacker's kernel holds STALL_CONNECTIONS idle connections to the service while
    another learner checks and the instructor reads the board; then it sends more records
    than the service keeps for one learner. What each side saw; the flood's records are
    removed after (the class of 30 reuses the names), as an instructor could."""
    import sqlite3

    seen = {"held": result(cell(attacker, with_values(
        STALL_CELL, CONNECTIONS=STALL_CONNECTIONS), 120))}
    seen["other's check"] = result(cell(other, DOWN_CELL, 120))
    seen["board while held"] = board(hub, instructor_token)["learners"]
    seen["released"] = result(cell(attacker, with_values(STALL_END_CELL, WAIT_S=12), 60))
    seen["flood"] = result(cell(attacker, with_values(
        FLOOD_CELL, POSTS=3, PER_POST=400, REASON=FLOOD_REASON), 300))
    start = time.monotonic()
    seen["board after flood"] = board(hub, instructor_token)
    seen["board after flood s"] = time.monotonic() - start
    database = sqlite3.connect(hub.state / "progress" / "progress.sqlite", timeout=30)
    try:
        with database:
            seen["kept"] = database.execute("SELECT count(*) FROM records WHERE learner = ?",
                                            (attacker,)).fetchone()[0]
            database.execute("DELETE FROM records WHERE learner = ? AND reason = ?",
                             (attacker, FLOOD_REASON))
    finally:
        database.close()
    print(f"\nprogress service: {seen['held']['opened']} idle connections held, "
          f"{seen['held']['closed at once']} closed at once; board after the flood "
          f"{seen['board after flood s']:.2f} s")
    return seen


def learner_opens_the_board(playwright, hub, user, password, folder):
    """A learner logged in through the hub's page opens the board: the status and text."""
    browser, page = new_page(playwright)
    try:
        login(page, hub, user, password)
        response = page.goto(hub.url + BOARD)
        page.screenshot(path=str(folder / "learner-refused-board.png"))
        return {"status": response.status, "text": page.inner_text("body")[:300]}
    finally:
        browser.close()


def service_down(hub, grader, learner, instructor_token, cell):
    """Stop the service (SIGSTOP: it holds its port and answers nothing, as a hung or
    unreachable service does; the hub sees it alive, so nothing restarts it) while the
    learner checks: the verdict stays pending in their kernel. Then let it go on and send
    the pending records from the learner's kernel (`python -m workshop_lib.labs progress
    --send`): what each step showed."""
    down = {}
    stopped = service_processes(grader)
    for process in stopped:
        process.send_signal(signal.SIGSTOP)
    try:
        down["stopped"] = len(stopped)
        down["checked while down"] = result(cell(learner, DOWN_CELL, 120))
        down["board while down"] = hub.request("GET", BOARD + "board.json", instructor_token,
                                               timeout=5)[0]
    finally:
        for process in stopped:
            process.send_signal(signal.SIGCONT)
    down["sent"] = result(cell(learner, SEND_CELL, 180))
    down["board"] = board(hub, instructor_token)
    return down


REPORT_CELL = """
import json, time
from workshop_lib import progress
start = time.monotonic()
progress.record("exercise", "welcome", "00_welcome", True, "reported at once")
print("RESULT " + json.dumps({"delivered": progress.wait_for_reports(60),
                              "pending": len(progress.pending()),
                              "took": time.monotonic() - start}))
"""


def class_reports(hub, names, instructor_token, cell, timeout=300):
    """Every learner's kernel reports one verdict at the same moment (each with its own
    server's token); the seconds until the board had them all, and each kernel's word."""
    with ThreadPoolExecutor(len(names)) as pool:
        start = time.monotonic()
        said = dict(zip(names, pool.map(lambda user: result(cell(user, REPORT_CELL, 120)),
                                        names), strict=True))
    while True:
        cells = board(hub, instructor_token)["cells"]
        missing = [user for user in names if "welcome" not in cells.get(user, {})]
        if not missing or time.monotonic() - start > timeout:
            break
        time.sleep(0.5)
    return {"all on the board after": time.monotonic() - start, "missing": missing,
            "kernels": said, "slowest report": max(s["took"] for s in said.values())}
