"""The documents hold for their readers: a README a newcomer reads in one sitting, with the
two commands on its first screen, and every command, path and flag the documents name
exists in the repository."""
import re

import pytest

from conftest import REPO

DOCUMENTS = ("README.md", "INSTRUCTORS.md", "CONTRIBUTING.md")
README_MOST_LINES = 120
FIRST_SCREEN = 24  # lines: a terminal's height
# Named in the documents, made by work of the same round that lands separately: each entry
# leaves this list when what it names exists (the test says so).
PENDING = set()
# Paths the commands make (git-ignored): named, never committed.
MADE_BY_COMMANDS = (".venv", "build/", "runs/", "workspace/", "data/", "<out>/")
TARGET = re.compile(r"^([A-Za-z][\w-]*):", re.M)


def code_spans(text):
    """Every inline code span and every line of a fenced block."""
    fenced = re.findall(r"^```\w*\n(.*?)^```", text, re.M | re.S)
    prose = re.sub(r"^```\w*\n.*?^```", "", text, flags=re.M | re.S)
    inline = [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", prose)
              if "\n\n" not in span]  # a span may wrap, within a paragraph
    return inline + [line for block in fenced for line in block.splitlines()]


def make_targets():
    return {t for makefile in ("Makefile", "assessment/Makefile")
            for t in TARGET.findall((REPO / makefile).read_text())}


def named_paths(span):
    """Words of a code span that name a file or folder of the repository."""
    for word in re.split(r"[\s,()=]+", span):
        word = word.rstrip(".:;'\"").lstrip("'\"")
        if (("/" in word or re.search(r"\.(md|py|ipynb|yml|yaml|toml|sbatch)$", word))
                and not re.search(r"[<>*$]|NN|^-|://|^\.\.", word)
                and not word.startswith(("torch.", "workshop_lib.", "nbgrader."))):
            yield word


def exists(path):
    """A path from the repository's root (a module may leave out its ``.py``: a package
    then, or a module); a bare file name, anywhere up to two folders down."""
    if "/" in path.rstrip("/"):
        return any((REPO / p).exists() for p in (path, path + ".py"))
    return any(any(REPO.glob(f"{depth}{path}")) for depth in ("", "*/", "*/*/"))


def module_flags(span):
    """(module, flag) for every ``--flag`` given to ``python -m workshop_lib.X`` (and to
    a ``-m workshop_lib.Y`` it launches)."""
    for module, args in re.findall(r"-m (workshop_lib[\w.]*)((?:\s+(?!-m\b)\S+)*)", span):
        for flag in re.findall(r"(?<!\S)(--[a-z][\w-]*)", args):
            yield module, flag


def modules_named(span):
    """(module, its sub-command or "") for every ``python -m workshop_lib...``."""
    yield from re.findall(r"-m (workshop_lib[\w.]*)(?: ([a-z][\w-]*))?", span)


def source_of(module):
    path = REPO / module.replace(".", "/")
    files = list(path.rglob("*.py")) if path.is_dir() else [path.with_suffix(".py")]
    return "".join(f.read_text() for f in files if f.is_file())


def references():
    """{what a document names (a make target, a path, a module's flag): (the documents
    naming it, whether it exists)}."""
    found = {}

    def note(name, document, exists):
        documents, _ = found.get(name, (set(), exists))
        found[name] = (documents | {document}, exists)

    targets, common = make_targets(), (REPO / "workshop_lib/cli.py").read_text()
    known_flags = set(re.findall(r"--[a-z][\w-]*", "".join(
        p.read_text() for folder in ("workshop_lib", "deploy", "assessment", "jupyter")
        for p in (REPO / folder).rglob("*")
        if p.is_file() and p.suffix in ("", ".py", ".sbatch", ".yaml"))
        + (REPO / "Makefile").read_text() + (REPO / ".ci/run").read_text()))
    for document in DOCUMENTS:
        for span in code_spans((REPO / document).read_text()):
            for target in re.findall(r"\bmake ([a-z][\w-]*)", span):
                note(f"make {target}", document, target in targets)
            for path in named_paths(span):
                if not path.startswith(MADE_BY_COMMANDS):
                    note(path, document, exists(path))
            for module, command in modules_named(span):
                note(f"python -m {module} {command}".strip(), document,
                     exists(module.replace(".", "/"))
                     and (not command or f'"{command}"' in source_of(module)))
            for flag in set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", span)):
                note(flag, document, flag in known_flags)
            for module, flag in module_flags(span):
                text = source_of(module)
                note(f"{module} {flag}", document, f'"{flag}"' in text or (
                    f'"{flag}"' in common and "add_common_args" in text))
    return found


def test_the_readme_is_short_and_opens_with_the_two_commands():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MOST_LINES, f"README.md has {len(lines)} lines"
    first_screen = "\n".join(lines[:FIRST_SCREEN])
    for command in ("make lab", "make test"):
        assert re.search(rf"^{command}\b", first_screen, re.M), f"{command} on the first screen"


@pytest.mark.parametrize("document", DOCUMENTS)
def test_the_document_exists(document):
    assert (REPO / document).is_file()


def test_every_command_path_and_flag_the_documents_name_exists():
    found = references()
    missing = {name: documents for name, (documents, exists) in found.items() if not exists}
    unexpected = sorted(set(missing) - PENDING)
    assert not unexpected, "named in the documents but not in the repository: " + "; ".join(
        f"{name} ({', '.join(sorted(missing[name]))})" for name in unexpected)
    arrived = sorted(name for name in PENDING if name in found and name not in missing)
    assert not arrived, f"now in the repository: take {arrived} out of PENDING"
    assert len(found) > 40, "the documents' references were read"


def test_the_reference_reader_sees_what_is_missing():
    text = ("Run `make nothing-here`, `python -m workshop_lib.day --no-such-flag` on "
            "`tests/none.py`.")
    spans = code_spans(text)
    assert [p for s in spans for p in named_paths(s)] == ["tests/none.py"]
    assert list(module_flags(spans[1])) == [("workshop_lib.day", "--no-such-flag")]
    assert "nothing-here" not in make_targets() and "test-fast" in make_targets()
