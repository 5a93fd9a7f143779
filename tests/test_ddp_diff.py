"""Notebook 02's answer is the exercise's own diff (its stub -> its solution), every hunk
named by a DDP step; the course's twin-script diff stays available as optional reading."""
import json

from conftest import REPO
from workshop_lib import ddp_diff
from workshop_lib.labs import from_one_gpu_to_many as lab02

NOTEBOOK = REPO / "notebooks/02_from_one_gpu_to_many.ipynb"


def test_every_hunk_of_the_exercise_diff_is_named_by_a_step():
    for context in (0, 1):
        rendered = ddp_diff.exercise_hunks(context)
        unnamed = [lines for steps, lines in rendered if not steps]
        assert rendered and not unnamed, f"hunks of the exercise no step names: {unnamed}"
        named = {step for steps, _ in rendered for step in steps}
        assert named == set(ddp_diff.EXERCISE_STEPS), "every step of the exercise shown"


def test_the_diff_is_the_exercises_stub_to_its_solution():
    """Applying the hunks to the stub's code gives the solution's code, and the files are
    the ones the conversion exercise hands out and accepts."""
    stub, solution = ddp_diff.EXERCISE
    assert stub == lab02.FILES / "conversion_stub.py"
    assert solution == lab02.FILES / "conversion_solution.py"
    before = ddp_diff.code_lines(stub, skip_docstring=True)
    after = ddp_diff.code_lines(solution, skip_docstring=True)
    removed = [text for _, lines in ddp_diff.exercise_hunks() for tag, text in lines
               if tag == "-"]
    added = [text for _, lines in ddp_diff.exercise_hunks() for tag, text in lines
             if tag == "+"]
    kept = [line for line in before if line not in removed]
    assert all(line in before for line in removed) and all(line in after for line in added)
    assert len(before) - len(removed) + len(added) == len(after)
    assert set(kept) | set(added) == set(after)
    # ~30 changed lines: an answer a novice reads in a few minutes
    assert len(removed) + len(added) <= 60


def test_notebook_02_shows_the_exercise_diff_and_only_names_the_course_diff():
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    markdown = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    assert any("ddp_diff.show_exercise()" in source for source in code)
    assert not any("ddp_diff.show()" in source for source in code), \
        "the course's own diff is optional reading, not rendered in the 90 minutes"
    assert "python -m workshop_lib.ddp_diff --course" in markdown


def test_the_command_prints_either_diff(capsys):
    assert ddp_diff.main([]) == 0
    exercise = capsys.readouterr().out
    assert "DistributedSampler(train_set" in exercise and "TensorLoader" not in exercise
    assert ddp_diff.main(["--course"]) == 0
    course = capsys.readouterr().out
    assert course.strip() == ddp_diff.render_text(ddp_diff.hunks())
    assert "init_process_group" in course and course != exercise
