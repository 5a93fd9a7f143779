"""One day table: the README and notebook 00 show ``day.table()``, built from the sessions
in ``workshop_lib/day.py`` and the notebooks' own titles, and every notebook is a session."""
import shutil

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

    assert day.write(tmp_path) == [day.README, day.WELCOME]
    assert readme.read_text() == (REPO / day.README).read_text()
    assert (tmp_path / day.WELCOME).read_text() == (REPO / day.WELCOME).read_text()
    assert day.write(tmp_path) == []
