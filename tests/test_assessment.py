"""The assessment's round trip on the real nbgrader CLI, the way an instructor runs it.

A copy of assessment/ gets its release and gradebook (`make release`), then one
submission per case: the instructor's solution, a correct solution in another style, the
untouched release, five typical mistakes, and a job that never finishes. `make autograde`
grades them, each with one real torchrun launch of the learner's script; the scores are
read from nbgrader's gradebook, because nbgrader exits 0 even when tests fail.
"""
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import nbformat
import pytest
from nbgrader.api import Gradebook

from conftest import REPO

ASSESSMENT = REPO / "assessment"
ASSIGNMENT = "ddp_refactor"
NOTEBOOK = f"{ASSIGNMENT}.ipynb"
SUBMISSIONS = Path(__file__).resolve().parent / "assessment_submissions"
SCRIPT_CELL = "ddp_script"
FIRST_TEST = "runs_and_reaches_target_accuracy"
EDITED_TEST = "shards_reshuffled_each_epoch"
# The hanging submission runs under short limits, so that the test does not wait 5 min.
HANG_LAUNCH_LIMIT_S = 15
HANG_CELL_TIMEOUT_S = 30

# Typical mistakes, each as edits of the instructor's solution, and the test cells (by
# nbgrader grade_id) that each must fail: all the others must give full points.
MISTAKES = {
    "no_sampler": ([
        ("""    train_sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank,
                                       shuffle=True, seed=seed)
    train_loader = DataLoader(train_set, batch_size=batch_size, sampler=train_sampler)
""", """    train_sampler = None
    generator = torch.Generator().manual_seed(seed)
    train_loader = DataLoader(train_set, batch_size=batch_size, shuffle=True,
                              generator=generator)
"""),
        ("        train_sampler.set_epoch(epoch)\n", ""),
    ], {"shards_disjoint_and_cover"}),
    "no_set_epoch": ([
        ("        train_sampler.set_epoch(epoch)\n", ""),
    ], {"shards_reshuffled_each_epoch"}),
    "checkpoint_every_rank": ([
        ("""            log.flush()
            torch.save({"epoch": epoch, "model": model.module.state_dict(),
                        "optimizer": optimizer.state_dict()}, args.out / "checkpoint.pt")
""", """            log.flush()
        torch.save({"epoch": epoch, "model": model.module.state_dict(),
                    "optimizer": optimizer.state_dict()}, args.out / "checkpoint.pt")
"""),
    ], {"rank0_only_logs_and_writes"}),
    "metrics_not_reduced": ([
        ("""        dist.all_reduce(train_sums)
        dist.all_reduce(val_sums)
""", ""),
    ], {"validation_metrics_are_global"}),
    "not_wrapped": ([
        ("""    model = DDP(model, device_ids=[device] if device.type == "cuda" else None)
""", ""),
        ("model.module.state_dict()", "model.state_dict()"),
    ], {"parameters_identical_on_all_ranks"}),
}
NEVER_FINISHES = [  # the epoch counter is never incremented
    ("""    for epoch in range(1, args.epochs + 1):
""", """    epoch = 1
    while epoch <= args.epochs:
"""),
]
# A learner's own cell that waits for a file no run writes: stopped by the cell timeout.
WAITING_CELL = """import time
from pathlib import Path

while not (Path("runs") / "ddp" / "done").exists():
    time.sleep(1)"""
# What a learner might put in place of a test cell that fails for them.
EDITED_TEST_SOURCE = '"""Requirement 3 (1 point)."""\nprint("PASS")'


def grade_id(cell):
    return cell.metadata.get("nbgrader", {}).get("grade_id")


def cell_by_id(notebook, cell_id):
    return next(cell for cell in notebook.cells if grade_id(cell) == cell_id)


def without_solution_markers(source):
    return "\n".join(line for line in source.split("\n")
                     if "### BEGIN SOLUTION" not in line and "### END SOLUTION" not in line)


def solution_script():
    """The instructor's script cell, as a learner who wrote the same would submit it."""
    source = nbformat.read(ASSESSMENT / "source" / ASSIGNMENT / NOTEBOOK, as_version=4)
    return without_solution_markers(cell_by_id(source, SCRIPT_CELL).source)


def with_edits(script, edits, name):
    for old, new in edits:
        assert script.count(old) == 1, f"{name}: the solution no longer contains {old!r}"
        script = script.replace(old, new)
    return script


def submit(course, student, script=None, edit=None):
    """Write submitted/<student>/: the release notebook with the script cell replaced."""
    notebook = nbformat.read(course / "release" / ASSIGNMENT / NOTEBOOK, as_version=4)
    if script is not None:
        cell_by_id(notebook, SCRIPT_CELL).source = script
    if edit:
        edit(notebook)
    folder = course / "submitted" / student / ASSIGNMENT
    folder.mkdir(parents=True)
    nbformat.write(notebook, folder / NOTEBOOK)


def make(course, target, *args, env=None, timeout=1200):
    venv = Path(sys.executable).parent.parent
    result = subprocess.run(["make", "-C", str(course), target, f"VENV={venv}", *args],
                            capture_output=True, text=True, timeout=timeout,
                            env={**os.environ, **(env or {})})
    assert result.returncode == 0, f"make {target} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


def execution_seconds(notebook_path):
    """Wall time of one graded notebook, from the cell timings nbclient records."""
    notebook = nbformat.read(notebook_path, as_version=4)
    stamps = [datetime.fromisoformat(t.replace("Z", "+00:00"))
              for cell in notebook.cells
              for key, t in cell.metadata.get("execution", {}).items()
              if key in ("iopub.execute_input", "shell.execute_reply")]
    return (max(stamps) - min(stamps)).total_seconds()


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """A copy of assessment/ after the whole instructor workflow; also prints the score
    table (shown with pytest -s, or when a test fails)."""
    course = tmp_path_factory.mktemp("course") / "assessment"
    shutil.copytree(ASSESSMENT, course, ignore=shutil.ignore_patterns(
        "gradebook.db", "submitted", "autograded", "feedback", "grades.csv",
        "autograde.log", "runs", "grading_run", "train_digits*.py", "__pycache__"))
    shutil.rmtree(course / "release")  # made afresh: test_committed_release compares
    make(course, "release")

    solution = solution_script()
    submit(course, "solution", solution)
    alt_style = (SUBMISSIONS / "alt_style.py").read_text()
    submit(course, "alt_style", f"%%writefile train_digits_ddp.py\n{alt_style}")
    submit(course, "untouched_release")
    for name, (edits, _) in MISTAKES.items():
        edit = None
        if name == "no_set_epoch":  # ... and the learner "fixed" the test that fails
            def edit(notebook):
                cell_by_id(notebook, EDITED_TEST).source = EDITED_TEST_SOURCE
        submit(course, name, with_edits(solution, edits, name), edit)

    start = time.perf_counter()
    autograde_log = make(course, "autograde")
    autograde_s = time.perf_counter() - start

    def add_waiting_cell(notebook):
        at = notebook.cells.index(cell_by_id(notebook, SCRIPT_CELL)) + 1
        notebook.cells.insert(at, nbformat.v4.new_code_cell(WAITING_CELL))

    submit(course, "never_finishes", with_edits(solution, NEVER_FINISHES, "never_finishes"),
           add_waiting_cell)
    # `make autograde` again grades only the new submission.
    start = time.perf_counter()
    hang_log = make(course, "autograde", f"NBGRADER_ARGS=--Execute.timeout={HANG_CELL_TIMEOUT_S}",
                    env={"DDP_CHECKS_TIME_LIMIT_S": str(HANG_LAUNCH_LIMIT_S)})
    hang_s = time.perf_counter() - start

    make(course, "feedback")
    make(course, "grades")

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        scores = {}
        for submission in gradebook.assignment_submissions(ASSIGNMENT):
            notebook = submission.notebooks[0]
            scores[submission.student.id] = {
                "total": (submission.score, submission.max_score),
                "cells": {grade.name: (grade.score, grade.max_score)
                          for grade in notebook.grades},
            }
    seconds = {student: execution_seconds(course / "autograded" / student / ASSIGNMENT
                                          / NOTEBOOK) for student in scores}
    print(f"\nautograde of {len(scores) - 1} submissions: {autograde_s:.0f} s; "
          f"of never_finishes: {hang_s:.0f} s")
    for student, result in sorted(scores.items()):
        lost = [f"{cell} -{mx - got:g}" for cell, (got, mx) in result["cells"].items()
                if got < mx]
        print(f"{student:22} {result['total'][0]:4g}/{result['total'][1]:g}  "
              f"{seconds[student]:5.1f} s  {', '.join(lost) or 'full marks'}")
    return {"path": course, "scores": scores, "seconds": seconds, "hang_s": hang_s,
            "autograde_log": autograde_log, "hang_log": hang_log}


def failing_cells(course, student):
    return {cell for cell, (got, mx) in course["scores"][student]["cells"].items()
            if got < mx}


def assert_only_failing(course, student, expected):
    cells = course["scores"][student]["cells"]
    assert failing_cells(course, student) == expected
    assert all(got == 0 for cell, (got, mx) in cells.items() if cell in expected)
    total, max_total = course["scores"][student]["total"]
    assert total == max_total - sum(cells[cell][1] for cell in expected)


def feedback_text(course, student):
    """The words of a learner's feedback page (without its markup, styles and scripts)."""
    html = (course["path"] / "feedback" / student / ASSIGNMENT
            / f"{ASSIGNMENT}.html").read_text()
    html = re.sub(r"<(style|script)\b.*?</\1>", " ", html, flags=re.S)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def graded_notebook(course, student):
    return nbformat.read(course["path"] / "autograded" / student / ASSIGNMENT / NOTEBOOK,
                         as_version=4)


def test_instructor_solution_gets_full_marks(course):
    assert course["scores"]["solution"]["total"] == (10, 10)
    assert_only_failing(course, "solution", set())


def test_correct_solution_in_another_style_gets_full_marks(course):
    assert_only_failing(course, "alt_style", set())


def test_untouched_release_scores_zero_quickly_with_the_reason(course):
    assert course["scores"]["untouched_release"]["total"][0] == 0
    assert failing_cells(course, "untouched_release") == set(
        course["scores"]["solution"]["cells"])
    assert course["seconds"]["untouched_release"] < 120
    feedback = feedback_text(course, "untouched_release")
    assert "stopped with NotImplementedError" in feedback
    assert "still needs your code" in feedback


@pytest.mark.parametrize("mistake", MISTAKES)
def test_each_mistake_loses_exactly_its_requirement(course, mistake):
    assert_only_failing(course, mistake, MISTAKES[mistake][1])


def test_feedback_says_why_a_requirement_is_not_met(course):
    assert "set_epoch(epoch)" in feedback_text(course, "no_set_epoch")
    assert "overlapping data" in feedback_text(course, "no_sampler")
    assert "rank 1 wrote out/checkpoint.pt" in feedback_text(course, "checkpoint_every_rank")
    assert "dist.all_reduce" in feedback_text(course, "metrics_not_reduced")
    assert "parameters differ" in feedback_text(course, "not_wrapped")
    for student in course["scores"]:  # in test cells: the reason alone, no traceback
        for cell in graded_notebook(course, student).cells:
            if cell.metadata.get("nbgrader", {}).get("grade"):
                for output in cell.outputs:
                    if output.output_type == "error":
                        assert output.ename == "RequirementNotMet"
                        assert len(output.traceback) == 1, output.traceback


def test_edited_test_cell_is_restored_and_flagged(course):
    graded = graded_notebook(course, "no_set_epoch")
    source = nbformat.read(ASSESSMENT / "source" / ASSIGNMENT / NOTEBOOK, as_version=4)
    assert cell_by_id(graded, EDITED_TEST).source == cell_by_id(source, EDITED_TEST).source
    assert course["scores"]["no_set_epoch"]["cells"][EDITED_TEST][0] == 0
    log = course["autograde_log"]
    assert f"Attribute 'checksum' for cell {EDITED_TEST} has changed" in log
    flagged = [line for line in log.splitlines() if "edited locked cell" in line]
    assert flagged == [f"no_set_epoch: edited locked cell {EDITED_TEST!r} in {NOTEBOOK} "
                       f"(put back to the original before grading)"]


def test_never_finishing_submission_is_stopped_and_graded(course):
    assert course["scores"]["never_finishes"]["total"][0] == 0
    # One launch stopped at its limit, one cell interrupted at the cell timeout.
    assert course["hang_s"] < HANG_LAUNCH_LIMIT_S + HANG_CELL_TIMEOUT_S + 90
    feedback = feedback_text(course, "never_finishes")
    assert f"did not finish within {HANG_LAUNCH_LIMIT_S} s and was stopped" in feedback
    graded = graded_notebook(course, "never_finishes")
    waiting = next(cell for cell in graded.cells if cell.source == WAITING_CELL)
    assert any(output.output_type == "error" for output in waiting.outputs)
    # Nothing of the stopped job is left running.
    job = str(course["path"] / "autograded" / "never_finishes")
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            assert job not in cmdline.read_bytes().decode(errors="replace")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            pass


def test_grades_csv_matches_the_gradebook(course):
    with open(course["path"] / "grades.csv") as f:
        rows = {row["student_id"]: row for row in csv.DictReader(f)}
    assert set(rows) == set(course["scores"])
    for student, result in course["scores"].items():
        assert float(rows[student]["score"]) == result["total"][0]
        assert float(rows[student]["max_score"]) == 10


def test_committed_release_is_generated_from_source(course):
    """release/ is what `make release` makes from source/: regenerate it after editing."""
    fresh = course["path"] / "release" / ASSIGNMENT
    committed = ASSESSMENT / "release" / ASSIGNMENT
    names = sorted(p.name for p in fresh.iterdir())
    assert names == sorted(p.name for p in committed.iterdir()
                           if p.name not in {"runs", "grading_run"}
                           and not p.name.startswith("train_digits"))
    for name in names:
        assert (fresh / name).read_bytes() == (committed / name).read_bytes(), name


def secrets():
    """Lines that exist only in the solution or hidden-test regions of source/."""
    source = nbformat.read(ASSESSMENT / "source" / ASSIGNMENT / NOTEBOOK, as_version=4)
    inside, outside = set(), set()
    for cell in source.cells:
        region = None
        for line in cell.source.split("\n"):
            if "### BEGIN" in line:
                region = line
            elif "### END" in line:
                region = None
            else:
                (inside if region else outside).add(line.strip())
    return {line for line in inside - outside if len(line) > 8}


def test_release_holds_nothing_of_the_solution_or_hidden_tests(course):
    hidden = secrets()
    assert any("seed=20240917" in line for line in hidden)  # the graded run's settings
    assert any("DistributedSampler(" in line for line in hidden)
    source = ASSESSMENT / "source" / ASSIGNMENT
    for release in (ASSESSMENT / "release", course["path"] / "release"):
        files = [p for p in release.rglob("*") if p.is_file()]
        assert {p.name for p in files} == {NOTEBOOK, "ddp_checks.py", "digits_data.py"}
        for path in files:
            text = path.read_text()
            assert "BEGIN SOLUTION" not in text and "HIDDEN TESTS" not in text
            assert "20240917" not in text
            if path.suffix == ".ipynb":  # the cells' text, not its JSON escaping
                cells = nbformat.reads(text, as_version=4).cells
                lines = {line.strip() for c in cells for line in c.source.split("\n")}
                assert not hidden & lines, f"{path} holds {sorted(hidden & lines)}"
            else:  # the provided files, as they are in source/
                assert text == (source / path.name).read_text()
    assert not (ASSESSMENT / "release" / "gradebook.db").exists()


def test_assessment_notebooks_are_committed_without_outputs():
    for folder in ("source", "release"):
        notebook = ASSESSMENT / folder / ASSIGNMENT / NOTEBOOK
        cells = json.loads(notebook.read_text())["cells"]
        assert all(not c.get("outputs") and not c.get("execution_count")
                   for c in cells if c["cell_type"] == "code"), notebook
