"""One day table: the README and notebook 00 show ``day.table()``, built from the sessions
in ``workshop_lib/day.py`` and the notebooks' own titles, and every notebook is a session."""
import shutil
from pathlib import Path

import nbformat
import pytest

from conftest import REPO
from workshop_lib import day

FIX = "run `python -m workshop_lib.day --write`"


def test_every_notebook_is_a_session_of_the_day_once_in_order():
    notebooks = sorted(f"notebooks/{p.name}" for p in (REPO / "notebooks").glob("[0-9]*.ipynb"))
    sessions = [s.notebook for s in day.SESSIONS]
    assert len(sessions) == len(set(sessions)), "a session listed twice"
    assert sorted(n for n in sessions if n.startswith("notebooks/")) == notebooks, \
        "every notebook, and only those, is a session in workshop_lib/day.py"
    assert [n for n in sessions if n.startswith("notebooks/")] == notebooks, \
        "the notebooks in their numbered order"
    assert all((REPO / n).is_file() for n in sessions)


def test_the_titles_are_the_notebooks_own_headings():
    first = day.SESSIONS[0]
    assert day.title(first) == "00 · Welcome: your environment"
    assert all(day.title(s) for s in day.SESSIONS)


def test_the_readme_shows_the_day_table():
    assert day.table_in_readme() == day.table(), f"the README's day table is stale: {FIX}"


def test_notebook_00_shows_the_day_table():
    assert day.table_in_welcome() == day.table(), f"notebook 00's day table is stale: {FIX}"


def test_time_on_the_day_reads_as_minutes_or_a_second_day():
    assert day.time_on_the_day(day.Session("x", "y", (45, 45))) == "45 min"
    assert day.time_on_the_day(day.Session("x", "y", (60, 90))) == "60-90 min"
    assert "second day" in day.time_on_the_day(day.Session("x", "y", None))


def test_table_span_finds_the_table_below_its_heading_only():
    text = ("# T\n\n| a |\n|---|\n\n## The day\n\nSome words.\n\n"
            "| b | c |\n|---|---|\n| 1 | 2 |\nAfter.\n")
    start, end = day.table_span(text, "## The day")
    assert text[start:end] == "| b | c |\n|---|---|\n| 1 | 2 |"
    assert text[slice(*day.table_span(text))] == "| a |\n|---|"
    with pytest.raises(ValueError):
        day.table_span(text, "## Missing")


def test_write_replaces_only_the_two_tables(tmp_path):
    """On a copy with stale tables, --write puts the current one in both places and leaves
    every other line and cell as it was."""
    for path in (day.README, day.WELCOME, *(s.notebook for s in day.SESSIONS)):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / path, tmp_path / path)
    readme = tmp_path / day.README
    readme.write_text(readme.read_text().replace(day.table(), "| stale |\n|---|"))
    notebook = nbformat.read(tmp_path / day.WELCOME, as_version=4)
    day.welcome_cell(notebook).source = day.welcome_cell(notebook).source.replace(
        day.table(), "| stale |\n|---|\n| row |")
    nbformat.write(notebook, tmp_path / day.WELCOME)

    nb02 = "notebooks/02_from_one_gpu_to_many.ipynb"
    notebook = nbformat.read(tmp_path / nb02, as_version=4)
    cell = day.welcome_cell(notebook)
    cell.source = cell.source.replace(day.budget_line(day.SESSIONS[2]), "**Time budget**: stale")
    nbformat.write(notebook, tmp_path / nb02)
    readme.write_text(readme.read_text().replace(day.day_line(), f"{day.DAY_MARK} stale"))

    assert day.write(tmp_path) == [day.README, day.WELCOME, nb02]
    assert readme.read_text() == (REPO / day.README).read_text()
    assert (tmp_path / day.WELCOME).read_text() == (REPO / day.WELCOME).read_text()
    assert (tmp_path / nb02).read_text() == (REPO / nb02).read_text()
    assert day.write(tmp_path) == []


def test_write_adds_a_missing_budget_line_under_the_title(tmp_path):
    for path in (day.README, *(s.notebook for s in day.SESSIONS)):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / path, tmp_path / path)
    session = day.SESSIONS[3]
    notebook = nbformat.read(tmp_path / session.notebook, as_version=4)
    cell = day.welcome_cell(notebook)
    cell.source = cell.source.replace(f"\n\n{day.budget_line(session)}", "")
    nbformat.write(notebook, tmp_path / session.notebook)
    assert day.opening_line(tmp_path, session) is None
    assert day.write(tmp_path) == [session.notebook]
    assert (tmp_path / session.notebook).read_text() == (REPO / session.notebook).read_text()


def test_every_notebook_opens_with_its_time_budget():
    for session in day.SESSIONS:
        if session.notebook.startswith("notebooks/"):
            assert day.opening_line(REPO, session) == day.budget_line(session), \
                f"{session.notebook}'s budget line is stale: {FIX}"


def test_the_readme_says_how_the_budgets_fit_the_day():
    assert day.day_line_in_readme() == day.day_line(), f"the README's day line: {FIX}"


def test_each_budget_fits_its_slot_and_the_slots_fit_the_day():
    """Reading + exercises + the runs, on the CPU profile and on GPUs, within the session's
    slot; the day's slots and its breaks within the day."""
    for session in day.SESSIONS:
        assert session.budget, f"{session.notebook} has no budget"
        if session.minutes:
            assert session.budget.fits(session.minutes), (
                f"{session.notebook}: {session.budget.minutes('cpu')} min on the CPU, "
                f"{session.budget.minutes('gpu')} on GPUs, in a slot of {session.minutes}")
    slots = sum(s.minutes[1] for s in day.the_day())
    assert slots + day.BREAK_MINUTES == day.DAY_MINUTES
    assert sum(s.budget.minutes("cpu") for s in day.the_day()) <= slots


def test_the_day_table_schedules_its_breaks_and_ends_with_the_day():
    """Lunch and two shorter breaks, at their times; no more than 2.5 h of sessions without
    a pause; the last session ends by the day's end."""
    rows = [row.split(" | ") for row in day.table().splitlines()[2:]]
    assert [row[1] for row in rows if row[1] in ("Break", "Lunch")] == ["Break", "Lunch", "Break"]
    end = next(row[0].strip("| ") for row in rows if row[1] == "End of the day")
    assert end == day.clock(day.DAY_STARTS + day.DAY_MINUTES) == "17:00"
    stretch, longest = 0, 0
    breaks = {notebook for notebook, _, _ in day.BREAKS}
    for session in day.the_day():
        stretch += session.minutes[1]
        longest = max(longest, stretch)
        stretch = 0 if session.notebook in breaks else stretch
    assert longest <= 150, f"{longest} min of sessions without a break"
    assert day.clock(9 * 60 + 5) == "9:05"


def test_a_budget_fits_only_when_its_parts_sum_within_the_slot():
    budget = day.Budget(reading=20, exercises=45, cpu_run=25, gpu_run=8)
    assert budget.minutes("cpu") == 90 and budget.minutes("gpu") == 73
    assert budget.fits((90, 90)) and not budget.fits((60, 89))
    assert not day.Budget(reading=20, exercises=45, cpu_run=5, gpu_run=26).fits((90, 90))


def test_the_optional_parts_are_headed_with_their_minutes_in_the_notebook():
    """A part outside the slot says so, with the time the budget gives it."""
    import json
    for session in day.SESSIONS:
        if not session.budget.optional:
            continue
        cells = json.loads((REPO / session.notebook).read_text())["cells"]
        headings = [line for c in cells if c["cell_type"] == "markdown"
                    for line in "".join(c["source"]).splitlines() if line.startswith("#")]
        for heading, minutes in session.budget.optional:
            assert any(line.endswith(f"Optional (about {minutes} min): {heading}")
                       for line in headings), (session.notebook, heading)


def test_the_last_notebook_before_the_assessment_ends_with_the_recap_and_where_it_lives(
        monkeypatch):
    import json
    monkeypatch.syspath_prepend(str(REPO / "jupyter" / "learner"))
    import make_workspace

    last = day.last_notebook_before_the_assessment()
    assert last.notebook == "notebooks/05_worked_example.ipynb"
    code = ["".join(c["source"]) for c in json.loads((REPO / last.notebook).read_text())["cells"]
            if c["cell_type"] == "code"]
    assert "day.recap()" in code[-1], "the recap is the day's last cell"
    recap = day.recap()
    for session in day.SESSIONS:
        assert day.title(session) in recap or session.notebook.startswith("assessment/")
    # the path the learner is told is where make lab's workspace puts the assessment
    workspace = make_workspace.learner_files()
    assert workspace[Path(day.ASSESSMENT_IN_WORKSPACE)] == \
        REPO / next(s.notebook for s in day.SESSIONS if s.notebook.startswith("assessment/"))
    assert day.ASSESSMENT_IN_WORKSPACE in recap
