"""The learner's progress (workshop_lib.progress): real ``labs.check`` verdicts recorded where
the learner works, shown back to them, and reported to a real HTTP service standing in for
the class server's, through its downtime and its silences; and the assessment's result
recorded when the learner runs it, never when nbgrader grades it."""
import contextlib
import io
import json
import math
import os
import re
import stat
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import nbformat
import pytest

from conftest import REPO, free_port, run_course_command
from workshop_lib import labs, notebook, progress, survey
from workshop_lib.labs import Verdict
from workshop_lib.labs.__main__ import main as labs_main

EXERCISES = labs.catalogue()
CHEAP = "sgd"  # numpy only: its check takes milliseconds
CHEAP_NOTEBOOK = EXERCISES[CHEAP]
TOKEN = "learner-token-1"
SOURCE = REPO / "assessment" / "source" / "ddp_refactor"


@pytest.fixture
def learner(tmp_path, monkeypatch):
    """A learner's record file in a home folder not made yet, and no class server."""
    path = tmp_path / "home" / ".ddp-workshop" / "progress.jsonl"
    monkeypatch.setenv(progress.PATH_ENV, str(path))
    monkeypatch.delenv(progress.URL_ENV, raising=False)
    monkeypatch.delenv(progress.TOKEN_ENV, raising=False)
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    yield path
    assert progress.wait_for_reports(60), "a report was still running at the test's end"


def check(answer_of):
    """labs.check on the cheap exercise's stub or solution, as a notebook cell calls it;
    the verdict and what the cell printed."""
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        verdict = labs.check(CHEAP, getattr(labs.get(CHEAP), answer_of)())
    return verdict, printed.getvalue()


# -- recorded where the learner works ------------------------------------------------------

def test_each_verdict_of_labs_check_is_recorded_with_its_attempt(learner):
    on_stub, printed = check("stub")
    assert printed.startswith("NOT YET: ") and not on_stub.ok
    on_solution, _ = check("solution")
    assert on_solution.ok

    first, second = progress.records()
    assert [(r["kind"], r["key"], r["notebook"], r["ok"], r["attempt"])
            for r in (first, second)] == [("exercise", CHEAP, CHEAP_NOTEBOOK, False, 1),
                                          ("exercise", CHEAP, CHEAP_NOTEBOOK, True, 2)]
    assert first["reason"] == on_stub.reason[:200] and second["reason"] == on_solution.reason
    for entry in (first, second):
        assert re.fullmatch(r"[0-9a-f]{32}", entry["id"])
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", entry["time"])
    assert first["id"] != second["id"]
    # Only the learner reads them.
    assert stat.S_IMODE(learner.stat().st_mode) == 0o600
    assert stat.S_IMODE(learner.parent.stat().st_mode) == 0o700

    seen = progress.summary(progress.records())[CHEAP]
    assert (seen["ok"], seen["attempts"], seen["first_pass"]) == (True, 2, second["time"])


def test_the_progress_line_counts_the_latest_verdicts(learner):
    mine = [key for key, stem in EXERCISES.items() if stem == CHEAP_NOTEBOOK]
    total = len(EXERCISES)
    assert progress.progress_line(CHEAP_NOTEBOOK, EXERCISES) == (
        f"Your progress: 0 of {total} exercises passed (this notebook: 0 of {len(mine)})")
    check("stub")
    assert progress.progress_line(CHEAP_NOTEBOOK, EXERCISES) == (
        f"Your progress: 0 of {total} exercises passed (this notebook: 0 of {len(mine)}; "
        f"NOT YET: {CHEAP})")
    check("solution")
    assert progress.progress_line(CHEAP_NOTEBOOK, EXERCISES) == (
        f"Your progress: 1 of {total} exercises passed (this notebook: 1 of {len(mine)})")
    check("stub")  # a later NOT YET is where the learner stands now
    assert progress.progress_line(None, EXERCISES) == (
        f"Your progress: 0 of {total} exercises passed (NOT YET: {CHEAP})")


def test_setup_finds_the_notebook_the_kernel_runs(learner, monkeypatch):
    check("solution")
    monkeypatch.setenv(notebook.SESSION_ENV, f"notebooks/{CHEAP_NOTEBOOK}-Copy1.ipynb")
    assert "(this notebook: 1 of 1)" in notebook.learner_progress()
    monkeypatch.delenv(notebook.SESSION_ENV)  # papermill: no notebook known
    assert notebook.learner_progress() == (f"Your progress: 1 of {len(EXERCISES)} exercises "
                                           f"passed")


def test_the_learners_table_and_json_come_from_their_records(learner):
    check("stub")
    check("solution")
    shown = run_course_command(["-m", "workshop_lib.labs", "progress"])
    assert shown.returncode == 0, shown.stderr
    rows = {line.split()[1]: line.split()[2:] for line in shown.stdout.splitlines()[1:]
            if line.split() and line.split()[0] in EXERCISES.values()}
    assert rows[CHEAP] == ["PASS", "2"]
    assert all(rows[key] == ["-", "0"] for key in EXERCISES if key != CHEAP)
    assert progress.progress_line(exercises=EXERCISES) in shown.stdout
    assert str(learner) in shown.stdout

    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert labs_main(["progress", "--json"]) == 0
    summary = json.loads(printed.getvalue())
    assert list(summary) == [CHEAP]
    assert summary[CHEAP]["attempts"] == 2 and summary[CHEAP]["ok"] is True


def test_a_torn_last_line_loses_that_record_only(learner):
    check("stub")
    with open(learner, "a") as file:
        file.write('{"id": "cut", "kind": "exerc')  # a write cut short
    assert [r["attempt"] for r in progress.records()] == [1]
    check("solution")
    assert [r["attempt"] for r in progress.records()] == [1, 2]
    assert learner.read_text().splitlines()[1] == '{"id": "cut", "kind": "exerc'


def test_details_are_kept_json_safe_and_small(learner):
    class Opaque:
        pass

    exercise = labs.get(CHEAP)
    details = {"run": Path("/runs/x"), "speedup": 1.5, "nan": math.nan, "steps": (1, 2),
               "model": Opaque(), "nested": {"a": {"b": [True, None, "x"]}},
               "long": "y" * 100_000, "many": list(range(1000))}
    entry = progress.record_verdict(exercise, Verdict(True, "fine\nsecond line", details))
    stored = progress.records()[-1]["details"]
    assert stored == entry["details"]
    assert stored["run"] == "/runs/x" and stored["speedup"] == 1.5
    assert stored["steps"] == [1, 2] and stored["nested"] == {"a": {"b": [True, None, "x"]}}
    assert "nan" not in stored and "model" not in stored
    assert len(json.dumps(stored)) <= progress.DETAILS_BYTES
    assert progress.records()[-1]["reason"] == "fine"


def test_a_record_that_cannot_be_written_costs_the_cell_one_line(learner, monkeypatch):
    blocker = learner.parent.parent / "not-a-folder"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("")
    monkeypatch.setenv(progress.PATH_ENV, str(blocker / "progress.jsonl"))
    verdict, printed = check("solution")
    assert verdict.ok
    assert printed.splitlines()[0].startswith("PASS: ")
    assert len(printed.splitlines()) == 2
    assert printed.splitlines()[1].startswith("(your progress was not recorded: ")


def test_the_survey_is_a_record_and_bad_ratings_are_refused(learner):
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        entry = survey.send_survey({"pace": 4, "material": 5},
                                     {"best": "the hang demo", "worse": "  "})
    assert (entry["kind"], entry["key"], entry["ok"]) == ("survey", "survey", True)
    ballot = entry["details"].pop("ballot")
    assert entry["details"] == {"ratings": {"pace": 4, "material": 5},
                                "comments": {"best": "the hang demo"}}
    # The same ballot every time (an anonymous survey counts the learner once), theirs only.
    assert re.fullmatch(r"[0-9a-f]{32}", ballot) and survey.ballot() == ballot
    assert (progress.record_path().with_name("ballot").stat().st_mode & 0o777) == 0o600
    entry["details"]["ballot"] = ballot
    assert progress.records()[-1] == entry
    assert str(learner) in printed.getvalue()
    assert progress.summary(progress.records()) == {}  # not a verdict
    for bad in ({"pace": 6}, {"pace": "4"}, {"pace": True}):
        with pytest.raises(ValueError, match="whole number from 1 to 5"):
            survey.send_survey(bad, {})
    with pytest.raises(ValueError, match="name it with letters, digits"):
        survey.send_survey({"pace": 3}, {"what <b>?": "text"})
    assert len(progress.records()) == 1


# -- reported to the class server -----------------------------------------------------------

class QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        """A client that gave up before the answer: nothing to report."""


class ProgressService:
    """A stand-in for the class's progress service, over real HTTP: it takes only its
    learner's token, keeps one copy of each record id, and counts every id it is sent."""

    PATH = "/services/progress/api/records"

    def __init__(self, port=None):
        self.port = port or free_port()
        self.received, self.stored = [], {}
        self.answering = threading.Event()  # cleared: each request waits, unanswered
        self.answering.set()
        self.arrived = threading.Event()
        self.answered = 0
        self.server = None

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}/services/progress/"

    def start(self):
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                service.arrived.set()
                service.answering.wait()
                if (self.path != service.PATH
                        or self.headers.get("Authorization") != f"token {TOKEN}"):
                    return self.answer(403, {"error": "not your token"})
                sent = json.loads(body)["records"]
                service.received += [entry["id"] for entry in sent]
                new = {entry["id"]: entry for entry in sent if entry["id"] not in service.stored}
                service.stored.update(new)
                self.answer(200, {"stored": len(new)})
                service.answered += 1

            def answer(self, code, payload):
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = QuietServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self):
        self.answering.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


@pytest.fixture
def service(learner, monkeypatch):
    """The class server's environment in the kernel, and a service not started yet."""
    service = ProgressService()
    monkeypatch.setenv(progress.URL_ENV, service.url)
    monkeypatch.setenv(progress.TOKEN_ENV, TOKEN)
    yield service
    service.stop()
    progress.wait_for_reports(60)


def test_each_record_reaches_the_service_with_the_learners_token(service):
    service.start()
    verdict, _ = check("solution")
    assert progress.wait_for_reports(60)
    entry = progress.records()[-1]
    assert service.stored == {entry["id"]: entry}
    assert progress.pending() == []


def test_a_service_that_refuses_the_token_leaves_the_records_pending(service, monkeypatch):
    service.start()
    monkeypatch.setenv(progress.TOKEN_ENV, "someone-elses")
    check("stub")
    assert progress.wait_for_reports(60)
    assert service.stored == {} and len(progress.pending()) == 1
    assert progress.send_pending().error == "HTTP 403 Forbidden"


def test_a_service_that_is_down_loses_nothing_and_gets_each_record_once(service):
    check("stub")
    check("stub")
    assert progress.wait_for_reports(60)
    assert len(progress.pending()) == 2  # nobody listening: kept
    service.start()
    check("solution")  # the next record takes the earlier ones along
    assert progress.wait_for_reports(60)
    ids = [entry["id"] for entry in progress.records()]
    assert sorted(service.received) == sorted(ids) and list(service.stored) == ids
    assert progress.pending() == [] and progress.send_pending().sent == 0
    check("solution")
    assert progress.wait_for_reports(60)
    assert sorted(service.received) == sorted(entry["id"] for entry in progress.records())


def test_the_learner_can_send_what_is_pending_from_the_command_line(service):
    check("stub")
    assert progress.wait_for_reports(60) and len(progress.pending()) == 1
    service.start()
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert labs_main(["progress", "--send"]) == 0
    assert "sent 1 record(s) to the class server; 0 still pending" in printed.getvalue()
    assert list(service.stored) == [progress.records()[0]["id"]]


def test_a_hanging_service_never_holds_the_cell(service, monkeypatch):
    # Long enough that a check that waited for the service could not return before it.
    monkeypatch.setattr(progress, "TIMEOUT_S", 600)
    service.answering.clear()
    service.start()
    verdict, printed = check("solution")
    assert verdict.ok and printed.startswith("PASS: ")
    assert service.arrived.wait(60), "the record was never sent"
    # The check has returned while its report is still open and unanswered.
    assert not progress.wait_for_reports(0) and service.answered == 0
    service.answering.set()
    assert progress.wait_for_reports(60)
    assert list(service.stored) == [progress.records()[0]["id"]] and progress.pending() == []


def test_a_report_gives_up_after_its_timeout_and_keeps_the_record(service, monkeypatch):
    monkeypatch.setattr(progress, "TIMEOUT_S", 0.5)
    service.answering.clear()
    service.start()
    check("stub")
    assert progress.wait_for_reports(60)  # given up: the service still has not answered
    assert service.answered == 0 and len(progress.pending()) == 1
    service.answering.set()
    assert progress.send_pending().sent == 1
    assert list(service.stored) == [progress.records()[0]["id"]]


def test_nothing_is_sent_without_both_variables(service, monkeypatch):
    service.start()
    monkeypatch.delenv(progress.TOKEN_ENV)  # a workstation with an URL set by hand
    check("solution")
    assert progress.report_pending() is None and progress.class_server() is None
    assert not service.arrived.is_set() and len(progress.records()) == 1


def test_the_survey_says_it_reached_the_class_server(service):
    service.start()
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        entry = survey.send_survey({"pace": 3}, {"best": "hangs"})
    assert "reached the class's progress service" in printed.getvalue()
    assert service.stored[entry["id"]]["details"]["ratings"] == {"pace": 3}


# -- the assessment: the learner's result, never the grader's -----------------------------

def assessment_checks():
    import importlib.util

    spec = importlib.util.spec_from_file_location("progress_ddp_checks",
                                                  SOURCE / "ddp_checks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def not_graded_run(checks):
    """A launch whose script was never written: every requirement not met."""
    return checks.Run(script="train_digits_ddp.py", config=checks.Config(), nproc=2,
                      on_gpu=False, time_limit_s=60, missing_script=True)


@pytest.mark.parametrize("execution", ["", "validate"])
def test_the_learners_own_result_is_recorded(learner, monkeypatch, execution):
    if execution:
        monkeypatch.setenv("NBGRADER_EXECUTION", execution)  # what Validate sets
    checks = assessment_checks()
    with contextlib.redirect_stdout(io.StringIO()):
        assert checks.report(not_graded_run(checks)) == (0, False)
    (entry,) = progress.records()
    assert (entry["kind"], entry["key"], entry["notebook"], entry["ok"]) == (
        "assessment", "ddp_refactor", "ddp_refactor", False)
    assert entry["reason"].startswith("0 of 12 points: NOT PASSED; not met: ")
    assert entry["details"]["not_met"] == list(checks.REQUIREMENTS)
    assert entry["details"]["validate"] is (execution == "validate")
    # The CLI's table shows it next to the exercises.
    assert progress.summary(progress.records())["ddp_refactor"]["attempts"] == 1


def test_grading_records_nothing(learner, monkeypatch):
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")  # what nbgrader autograde sets
    checks = assessment_checks()
    with contextlib.redirect_stdout(io.StringIO()):
        checks.report(not_graded_run(checks))
    assert not learner.exists()


@pytest.mark.slow
def test_real_nbgrader_validate_records_and_autograde_does_not(learner, tmp_path):
    """nbgrader itself runs a notebook whose cell reports the assessment's result: its
    validate (the learner's button) records it, its autograde (the grader) does not."""
    course = tmp_path / "course"
    cell = ("import importlib.util\n"
            f"spec = importlib.util.spec_from_file_location('ddp_checks', "
            f"{str(SOURCE / 'ddp_checks.py')!r})\n"
            "checks = importlib.util.module_from_spec(spec)\n"
            "spec.loader.exec_module(checks)\n"
            "checks.report(checks.Run(script='x.py', config=checks.Config(), nproc=2, "
            "on_gpu=False, time_limit_s=60, missing_script=True))")
    notebook_file = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell)])
    notebook_file.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                            "language": "python"}
    for folder in ("source/a", "submitted/learner/a"):
        (course / folder).mkdir(parents=True)
        nbformat.write(notebook_file, course / folder / "a.ipynb")
    (course / "nbgrader_config.py").write_text(
        "c = get_config()\nc.CourseDirectory.course_id = 'progress'\n"
        "c.CourseDirectory.db_students = [{'id': 'learner'}]\n")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}"
                                 f"{os.environ['PATH']}"}
    nbgrader = [str(Path(sys.executable).parent / "nbgrader")]

    def run(*args):
        done = subprocess.run([*nbgrader, *args], cwd=course, env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    run("db", "student", "add", "learner")
    run("generate_assignment", "a", "--force")
    run("autograde", "a", "--force")
    assert "0 of 12 points" in (course / "autograded/learner/a/a.ipynb").read_text()
    assert not learner.exists(), "grading recorded a result"
    run("validate", str(course / "submitted/learner/a/a.ipynb"))
    (entry,) = progress.records()
    assert entry["kind"] == "assessment" and entry["details"]["validate"] is True
