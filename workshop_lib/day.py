"""The day: the course's sessions in teaching order, and the one table that shows them.

The README (section "The day") and notebook 00's opening cell show the same table, and
``tests/test_day.py`` keeps both equal to ``table()``. Each session's title is its
notebook's own first heading, read from the file, so a title is changed in one place, the
notebook; what the learner does there and the time it takes on the day are kept here.
After changing a row, a notebook's title, or adding a notebook:

    python -m workshop_lib.day            # print the table
    python -m workshop_lib.day --write    # write it into README.md and notebook 00
"""
import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from workshop_lib import cli
from workshop_lib.errors import CourseError, exit_cleanly_on_course_error

REPO = Path(__file__).resolve().parent.parent
README = "README.md"
README_SECTION = "## The day"
WELCOME = "notebooks/00_welcome.ipynb"


@dataclass(frozen=True)
class Session:
    notebook: str       # the session's notebook, from the repository root
    you_do: str         # what the learner does there, in a few words
    minutes: tuple[int, int] | None  # time on the day, (fewest, most); None: a second day


SESSIONS = (
    Session("notebooks/00_welcome.ipynb",
            "check the machine, the course profile and the dataset; launch a first DDP job "
            "and record what each of its processes did", (30, 30)),
    Session("notebooks/01_sgd_and_batch_size.ipynb",
            "write mini-batch SGD on a problem you can see; then throughput, accuracy and "
            "time to accuracy as the batch grows", (60, 60)),
    Session("notebooks/02_from_one_gpu_to_many.ipynb",
            "make a single-device script a DDP job and launch it with torchrun; predict what "
            "each rank sees; measure the same accuracy in less time; build DDP from two "
            "collectives", (90, 90)),
    Session("notebooks/03_keeping_accuracy_at_scale.ipynb",
            "lose accuracy at a large batch and win it back (linear and square-root rules, "
            "warmup, LARS); BatchNorm across ranks; the large-batch challenge", (60, 60)),
    Session("notebooks/04_when_things_go_wrong.ipynb",
            "crash a rank, hang a collective, kill a rank and resume from the checkpoint; "
            "debug a hanging job", (45, 45)),
    Session("notebooks/05_worked_example.ipynb",
            "mixed precision, memory and its remedies, gradient accumulation, DataParallel "
            "against DDP, a step's profile; fit global batch 256 where only 64 fits",
            (60, 60)),
    Session("assessment/release/ddp_refactor/ddp_refactor.ipynb",
            "convert another single-device script yourself; graded by what your job does",
            (60, 90)),
    Session("notebooks/06_beyond_one_machine.ipynb",
            "data as record shards, two nodes and a lost node, SLURM and Kubernetes jobs",
            None),
    Session("notebooks/07_inside_ddp.ipynb",
            "build overlap, buckets and ZeRO-1 yourself; what comes next: communication "
            "hooks, torch.compile, FSDP", None),
)


def title(session, root=REPO):
    """The session notebook's first heading, without its ``#``."""
    cells = json.loads((root / session.notebook).read_text())["cells"]
    for cell in cells:
        if cell["cell_type"] == "markdown":
            for line in "".join(cell["source"]).splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    raise ValueError(f"{session.notebook} has no '# Title' heading: give its first "
                     f"markdown cell one")


def time_on_the_day(session):
    if session.minutes is None:
        return "a second day, or early finishers"
    fewest, most = session.minutes
    return f"{fewest} min" if fewest == most else f"{fewest}-{most} min"


def table(root=REPO):
    """The day table, as Markdown."""
    rows = ["| session | what you do | time |", "|---|---|---|"]
    rows += [f"| {title(s, root)} | {s.you_do} | {time_on_the_day(s)} |" for s in SESSIONS]
    return "\n".join(rows)


def table_span(text, after=""):
    """(start, end) of the first Markdown table in ``text`` below the line ``after`` (from
    the top when empty): its lines, without the newline after the last."""
    lines = text.split("\n")
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)
    first = 0
    if after:
        if after not in lines:
            raise ValueError(f"no line {after!r}")
        first = lines.index(after) + 1
    for top in range(first, len(lines)):
        if lines[top].startswith("|"):
            bottom = top
            while bottom + 1 < len(lines) and lines[bottom + 1].startswith("|"):
                bottom += 1
            return starts[top], starts[bottom] + len(lines[bottom])
    raise ValueError(f"no table below {after!r}" if after else "no table")


def table_in_readme(root=REPO):
    text = (root / README).read_text()
    start, end = table_span(text, README_SECTION)
    return text[start:end]


def welcome_cell(notebook):
    """Notebook 00's opening cell: the markdown cell that holds its title and the day."""
    return next(cell for cell in notebook.cells if cell.cell_type == "markdown")


def table_in_welcome(root=REPO):
    cells = json.loads((root / WELCOME).read_text())["cells"]
    source = "".join(next(c for c in cells if c["cell_type"] == "markdown")["source"])
    start, end = table_span(source)
    return source[start:end]


def write(root=REPO):
    """Replace the day table in the README and in notebook 00's opening cell (that cell
    only); return the files that changed."""
    import nbformat

    new = table(root)
    changed = []
    readme = root / README
    text = readme.read_text()
    start, end = table_span(text, README_SECTION)
    if text[start:end] != new:
        readme.write_text(text[:start] + new + text[end:])
        changed.append(README)
    notebook = nbformat.read(root / WELCOME, as_version=4)
    cell = welcome_cell(notebook)
    start, end = table_span(cell.source)
    if cell.source[start:end] != new:
        cell.source = cell.source[:start] + new + cell.source[end:]
        nbformat.write(notebook, root / WELCOME)
        changed.append(WELCOME)
    return changed


@exit_cleanly_on_course_error
def main(argv=None):
    parser = cli.ArgumentParser(prog="python -m workshop_lib.day", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true",
                        help=f"write the table into {README} and {WELCOME}")
    args = parser.parse_args(argv)
    try:
        if not args.write:
            print(table())
            return 0
        changed = write()
    except ValueError as error:
        raise CourseError(f"{error}; the README needs its {README_SECTION!r} section with "
                          f"a table, and notebook 00's first cell a table") from None
    print(f"rewrote the day table in {', '.join(changed)}" if changed
          else "the day table is up to date in both places")
    return 0


if __name__ == "__main__":
    sys.exit(main())
