"""Notebook 08 executes from the records of an executed day and states the learner's
takeaways with their numbers.

The day is made as a learner makes it: the real checks judge stubs and reference answers
(``labs.check``, which records each verdict in the record file ``DDP_WORKSHOP_PROGRESS``
names; the challenge's trained verdict is the one notebook 03's execution recorded earlier
in the session, where there is one), notebook 02's comparison is two real runs (one
process trained here, the two-rank run the suite shares), and the assessment's checks
record a result. No verdict is typed by hand. Then the notebook runs under papermill on
those records, and each takeaway must state the numbers the records hold; with a record
taken away, the sentence saying it is missing appears instead.
"""
import contextlib
import io
import json
import os
import shutil

import pytest

from conftest import REPO, execute_notebook, notebook_text_outputs
from workshop_lib import labs, progress, runlog, survey
from workshop_lib.findings import looking_back as nb08
from workshop_lib.labs import from_one_gpu_to_many, when_things_go_wrong

pytestmark = pytest.mark.slow  # papermill, the challenge's training runs, a torchrun run

CHALLENGE_EPOCHS = 16  # the reference holds its target from epoch 12 (measured: 0.983)


@contextlib.contextmanager
def record_file(path):
    """``DDP_WORKSHOP_PROGRESS`` pointed at ``path`` while the block runs."""
    before = os.environ.get(progress.PATH_ENV)
    os.environ[progress.PATH_ENV] = str(path)
    try:
        yield path
    finally:
        if before is None:
            os.environ.pop(progress.PATH_ENV, None)
        else:
            os.environ[progress.PATH_ENV] = before


def quietly(key, answer, **context):
    with contextlib.redirect_stdout(io.StringIO()):
        return labs.check(key, answer, **context)


def a_day(folder, ddp_run, earlier_challenge=None):
    """Records of a day, made by the real checks, and notebook 02's comparison runs under
    ``folder/runs``: {key: the verdicts in order}. ``earlier_challenge``: the record of the
    challenge's check that notebook 03's execution in this test session made (its training
    is the costly part), or None to run that check here."""
    from workshop_lib import train

    made = {}
    for key in ("sgd", "stuck_ranks"):  # the stub first, as a learner starts
        made[key] = [quietly(key, labs.get(key).stub()), quietly(key, labs.solution(key))]
    made["debugging"] = [quietly("debugging", labs.get("debugging").stub(
        path=folder / "my_debug_job.py"))]  # refused before a launch: still the hung job
    made["challenge"] = [quietly("challenge", labs.get("challenge").stub())]
    if earlier_challenge is not None:  # notebook 03's own verdict, as its execution recorded it
        made["challenge"].append(labs.Verdict(earlier_challenge["ok"], earlier_challenge["reason"],
                                              earlier_challenge["details"]))
        progress.record("exercise", "challenge", earlier_challenge["notebook"],
                        earlier_challenge["ok"], earlier_challenge["reason"],
                        earlier_challenge["details"])
    else:
        made["challenge"].append(quietly("challenge", labs.solution("challenge"),
                                         runs_dir=str(folder / "challenge"),
                                         epochs=CHALLENGE_EPOCHS))
    # The assessment's checks (the learner's copy), on a script that is not there: a real
    # result, recorded, and nothing launched.
    checks = from_one_gpu_to_many.engine()
    checks.RUN_DIR = folder / "grading_run"
    with contextlib.redirect_stdout(io.StringIO()):
        checks.report(checks.launch(str(folder / "no_such_script.py"), nproc=2, on_gpu=False))
    # Notebook 02's comparison: one process at the two-rank run's batch per process.
    runs = folder / "runs" / nb08.COMPARISON[0]
    shutil.copytree(ddp_run[0], runs / "scaled" / "seed0")
    with contextlib.redirect_stdout(io.StringIO()):
        train.main(["--device", "cpu", "--dataset", "digits", "--epochs", "5",
                    "--batch-size", "32", "--no-progress",
                    "--out", str(runs / "one_device" / "seed0")])
    return made


def notebook_03s_challenge():
    """The latest trained verdict of the challenge in this session's record file (the
    suite's, conftest.py: tests/test_notebook_03.py's execution writes it), or None."""
    trained = [r for r in progress.records() if r["key"] == "challenge"
               and "leaderboard" in r["details"]]
    return trained[-1] if trained else None


@pytest.fixture(scope="module")
def day(tmp_path_factory, ddp_run):
    folder = tmp_path_factory.mktemp("08_day")
    earlier = notebook_03s_challenge()
    with record_file(folder / "progress.jsonl") as path:
        made = a_day(folder, ddp_run, earlier)
        (folder / "08").mkdir()
        notebook = execute_notebook("08_looking_back.ipynb", folder / "08", record=path,
                                    day_runs=str(folder / "runs"),
                                    assessment_folder=str(folder / "ddp_refactor"))
    return folder, progress.records(path), made, notebook_text_outputs(notebook), notebook


def test_the_records_are_the_checks_own(day):
    _, records, made, _, _ = day
    by_key = {key: [r for r in records if r["key"] == key] for key in made}
    for key, verdicts in made.items():
        assert [(r["ok"], r["reason"]) for r in by_key[key]] == \
            [(v.ok, progress.first_line(v.reason)) for v in verdicts], key
    (result,) = [r for r in records if r["kind"] == "assessment"]
    assert not result["ok"] and result["details"]["points"] == 0


def test_the_takeaways_state_the_learners_numbers(day):
    folder, records, made, text, _ = day
    found = nb08.takeaways(records, folder / "runs")
    assert all(finding.text in text for finding in found), "the notebook prints them"
    # The speed-up, from the two runs' records: epochs after the first, averaged.
    one = runlog.read(folder / "runs/02_ddp/one_device/seed0")
    two = runlog.read(folder / "runs/02_ddp/scaled/seed0")
    t1, t2 = (sum(r.column("epoch_s")[1:]) / (len(r.epochs) - 1) for r in (one, two))
    assert f"{t1 / t2:.2f}x" in found["speedup"].text
    n = two.start["world_size"]
    assert f"on {n}" in found["speedup"].text
    assert f"a scaling efficiency E = S/N of {t1 / t2 / n:.0%}" in found["speedup"].text
    assert "ceiling" not in found["speedup"].text or "no ceiling" in found["speedup"].text
    # The challenge: the batch, the target and, on a PASS, the flags that rescued it.
    challenge = made["challenge"][-1]
    held = found["accuracy_held"]
    assert f"global batch {challenge.details['large_batch']}" in held.text
    assert f"{challenge.details['target']:.3f}" in held.text
    assert held.holds == challenge.ok
    if challenge.ok:
        assert challenge.details["runs"][challenge.details["winner"]] in held.text
    # The hang: the lines the check found, with their code.
    lines = made["stuck_ranks"][-1].details["lines"]
    for rank, line in lines.items():
        code = when_things_go_wrong.stub_lines()[line - 1].split("#")[0].strip()
        assert f"rank {rank} in line {line} ({code})" in found["hang"].text
    assert f"{when_things_go_wrong.DIST_TIMEOUT_S} s collective timeout" in found["hang"].text
    assert "does not pass yet" in found["fix"].text and not found["fix"].holds
    # The assessment: its points and what it did not meet.
    result = next(r for r in records if r["kind"] == "assessment")["details"]
    assert f"{result['points']} of {result['max_points']} points" in found["assessment"].text
    assert "runs_and_reaches_target_accuracy" in found["assessment"].text


def test_the_notebook_draws_the_day_checks_the_self_check_and_waits_for_the_survey(day):
    _, records, _, text, notebook = day
    assert any("image/png" in out.get("data", {}) for cell in notebook.cells
               for out in cell.get("outputs", []))
    assert "PASS: all 7 answers right" in text
    assert "NOT SENT: rate every question first" in text
    overview = nb08.overview([r for r in records if r["key"] != "self_check"],
                             nb08.day_exercises())
    assert overview.text in text and "sgd" in overview.text and "never checked" in text
    assert not any(r["kind"] == "survey" for r in records)


def test_a_missing_record_is_said_to_be_missing(day, tmp_path):
    folder, records, _, _, _ = day
    without = [r for r in records if r["key"] not in ("challenge", "stuck_ranks")
               and r["kind"] != "assessment"]
    found = nb08.takeaways(without, tmp_path)
    assert "You have no record of notebook 03's exercise" in found["accuracy_held"].text
    assert "You have no record of notebook 04's exercise" in found["hang"].text
    assert "You have no record of the assessment yet" in found["assessment"].text
    assert "You have no record of notebook 02's comparison" in found["speedup"].text
    assert all(f.holds is None for f in found)
    # With the records kept, none of them says so.
    assert not any("You have no record" in f.text
                   for f in nb08.takeaways(records, folder / "runs")
                   if f.key != "fix")


def test_the_survey_goes_to_the_record_and_the_assessment_folder(tmp_path, capsys):
    ratings = dict.fromkeys(survey.RATINGS, 4) | {"pace": 3}
    comments = {"most_useful": "the hang", "change": "", "other": ""}
    folder = tmp_path / "ddp_refactor"
    folder.mkdir()
    with record_file(tmp_path / "progress.jsonl") as path:
        assert survey.submit({**ratings, "pace": None}, comments, folder) is None
        assert survey.submit({**ratings, "pace": 6}, comments, folder) is None
        assert progress.records(path) == [] and not (folder / "survey.json").exists()
        entry = survey.submit(ratings, comments, folder)
        (recorded,) = progress.records(path)
    said = capsys.readouterr().out
    assert "NOT SENT: rate every question first: pace" in said
    assert "NOT SENT: pace is 6" in said and "submit the assessment" in said
    assert recorded == entry and recorded["kind"] == "survey"
    written = json.loads((folder / "survey.json").read_text())
    assert written["ratings"] == ratings and written["comments"] == {"most_useful": "the hang"}


def test_the_comparison_is_read_where_notebook_02_writes_it():
    import ast

    import nbformat

    notebook = nbformat.read(REPO / "notebooks/02_from_one_gpu_to_many.ipynb", as_version=4)
    (cell,) = [c for c in notebook.cells if "parameters" in c.metadata.get("tags", [])]
    values = {node.targets[0].id: ast.literal_eval(node.value)
              for node in ast.parse(cell.source).body if isinstance(node, ast.Assign)}
    assert values["runs_dir"] == "runs/" + nb08.COMPARISON[0]
