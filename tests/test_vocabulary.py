"""The day's vocabulary comes before its first use: reading the core day's notebooks in
teaching order (``day.SESSIONS``), the first cell that uses a term is the one that defines
it (the term in bold) or comes after it. Each notebook's opening cell (the day table and the
session's overview) names what is coming and is not read as a use."""
import json
import re

import pytest

from conftest import REPO
from workshop_lib import day

# term -> how a use is spelled (a definition is the term itself in bold, plural allowed)
TERMS = {
    "rank": r"\branks?\b",
    "world size": r"\bworld[ _]size\b",
    "local rank": r"\blocal[ _]rank\b",
    "bucket": r"\bbuckets?\b",
}


def core_day_cells():
    """(notebook, index, source) of every markdown cell of the core day after its opening."""
    for session in day.SESSIONS:
        if session.minutes is None or not session.notebook.startswith("notebooks/"):
            continue  # a second day's notebook, or the assessment
        cells = json.loads((REPO / session.notebook).read_text())["cells"]
        for index, cell in enumerate(cells):
            if cell["cell_type"] == "markdown" and index > 0:
                yield session.notebook, index, "".join(cell["source"])


def first(pattern, cells):
    return next(((nb, i) for nb, i, source in cells if re.search(pattern, source, re.I)),
                None)


@pytest.mark.parametrize("term", TERMS)
def test_a_term_is_defined_before_its_first_use(term):
    cells = list(core_day_cells())
    used = first(TERMS[term], cells)
    defined = first(r"\*\*" + re.escape(term) + r"s?\*\*", cells)
    assert defined is not None, f"{term!r} is never defined (in bold) in the core day"
    assert used is not None and defined == used, \
        f"{term!r} is used in {used} before its definition in {defined}"


def test_the_reader_sees_a_use_before_a_definition():
    cells = [("a", 1, "every rank waits"), ("a", 2, "a **rank** is a process")]
    assert first(TERMS["rank"], cells) == ("a", 1)
    assert first(r"\*\*rank\*\*", cells) == ("a", 2)


def core_day_notebooks():
    return [s.notebook for s in day.SESSIONS
            if s.minutes is not None and s.notebook.startswith("notebooks/")]


def code_sources(notebook):
    cells = json.loads((REPO / notebook).read_text())["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]


@pytest.mark.parametrize("notebook", core_day_notebooks())
def test_every_notebook_of_the_core_day_draws_a_figure(notebook):
    assert any(re.search(r"\bplots\.(plot|draw)_\w+\(", source)
               for source in code_sources(notebook)), f"{notebook} draws no figure"


def test_02_draws_the_ddp_step_before_its_conversion_exercise():
    sources = code_sources("notebooks/02_from_one_gpu_to_many.ipynb")
    drawn = next(i for i, s in enumerate(sources) if "plots.draw_ddp_step(" in s)
    exercise = next(i for i, s in enumerate(sources) if s.startswith("%%writefile my_train_ddp"))
    assert drawn < exercise
