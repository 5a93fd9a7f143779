"""The package's module map lists every module (and nothing that is gone)."""
import re
import subprocess

import workshop_lib
from conftest import REPO

PACKAGE = REPO / "workshop_lib"


def test_the_module_map_lists_every_module():
    listed = set(re.findall(r"^- ``(\w+)``", workshop_lib.__doc__, re.M))
    present = {p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__")}
    present |= {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert listed == present, (f"missing from the map: {sorted(present - listed)}; "
                               f"listed but gone: {sorted(listed - present)}")


def test_no_module_is_longer_than_one_sitting():
    """400 lines: a module a maintainer reads in one sitting (findings.py once had 999)."""
    long = {str(p.relative_to(REPO)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 400}
    assert not long, f"split these by idea: {long}"


def test_findings_has_one_module_per_notebook_named_like_it():
    slugs = {p.stem[3:] for p in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    modules = {p.stem for p in (PACKAGE / "findings").glob("*.py")} - {"__init__", "base"}
    assert modules == slugs


LEFTOVER = re.compile(r"\.(orig|rej|bak|swp)$|~$")  # what merges and editors leave behind


def test_no_merge_or_editor_leftover_is_tracked():
    """A leftover copy (findings/worked_example.py.orig was committed once) is read as if it
    were code and drifts from the module it copies."""
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split("\n")
    assert not [f for f in tracked if LEFTOVER.search(f)]
    assert LEFTOVER.search("workshop_lib/findings/worked_example.py.orig")
