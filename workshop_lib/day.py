"""The day: the course's sessions, and the one table that shows them.

The README (section "The day") and notebook 00's opening cell show the same table, and
``tests/test_day.py`` keeps both equal to ``table()``. Each notebook's opening cell states
its session's time budget for a novice (``budget_line``), and the README says how the
budgets fit the day (``day_line``); both are written by ``--write`` too. Each session's title is its
notebook's own first heading, read from the file, so a title is changed in one place, the
notebook; what the learner does there and the time it takes on the day are kept here.
After changing a row, a notebook's title, or adding a notebook:

    python -m workshop_lib.day            # print the table
    python -m workshop_lib.day --write    # write it into README.md and the notebooks
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
BUDGET_MARK = "**Time budget**"  # the opening cell's line that states the budget
DAY_MARK = "A day of"            # the README's line, below the table, that sums the day
DAY_MINUTES = 8 * 60     # the workshop's day, 9:00 to 17:00
DAY_STARTS = 9 * 60      # 9:00, in minutes after midnight
# The day's breaks, each after a session (by notebook): a pause after every 90 minutes or
# so of work, lunch after the morning's last session. In the day table, with their times.
BREAKS = (("notebooks/01_sgd_and_batch_size.ipynb", "Break", 10),
          ("notebooks/02_from_one_gpu_to_many.ipynb", "Lunch", 45),
          ("notebooks/04_when_things_go_wrong.ipynb", "Break", 10))
BREAK_MINUTES = sum(minutes for _, _, minutes in BREAKS)
GPUS = 4                 # the GPU budget's machine: the worked example's four GPUs


@dataclass(frozen=True)
class Budget:
    """A novice's minutes in a session's core path: reading (the text, the outputs, the
    diff), writing the exercises (with their checks' launches), and waiting for the
    notebook's own runs, on the CPU profile (two processes sharing the cores) or on
    ``GPUS`` GPUs. ``optional``: the parts its notebook marks "Optional (about N min)",
    outside the slot, as (heading, minutes).

    Where the runs' minutes come from: notebook 02's CPU run is measured (its core cells in
    a papermill execution of tests/test_notebook_02.py, below); the other runs, and every
    reading and exercise time, are estimates to replace with measurements from a taught
    day."""
    reading: int
    exercises: int
    cpu_run: int
    gpu_run: int
    optional: tuple[tuple[str, int], ...] = ()

    def minutes(self, runs_on):
        """The session's core path with the runs of ``runs_on`` ("cpu" or "gpu")."""
        return self.reading + self.exercises + (self.cpu_run if runs_on == "cpu"
                                                else self.gpu_run)

    def fits(self, slot):
        """True when the core path fits the slot's most minutes on either profile."""
        return max(self.minutes("cpu"), self.minutes("gpu")) <= slot[1]


@dataclass(frozen=True)
class Session:
    notebook: str       # the session's notebook, from the repository root
    you_do: str         # what the learner does there, in a few words
    minutes: tuple[int, int] | None  # time on the day, (fewest, most); None: a second day
    budget: Budget | None = None  # a novice's minutes, by part


SESSIONS = (
    Session("notebooks/00_welcome.ipynb",
            "check the machine, the course profile and the dataset; launch a first DDP job "
            "and record what each of its processes did", (25, 25),
            Budget(reading=10, exercises=5, cpu_run=8, gpu_run=3)),
    Session("notebooks/01_sgd_and_batch_size.ipynb",
            "write mini-batch SGD on a problem you can see; then throughput, accuracy and "
            "time to accuracy as the batch grows", (60, 60),
            Budget(reading=15, exercises=20, cpu_run=15, gpu_run=8)),
    # 02 and 04 gave the closing session (08) its 15 min: 10 and 5 of the slack their slots
    # held beyond the core path, the time their optional parts had on the day.
    Session("notebooks/02_from_one_gpu_to_many.ipynb",
            "make a single-device script a DDP job and launch it with torchrun; node, world "
            "size, global and local rank; predict what each rank sees; measure the same "
            "accuracy in less time and read its speed-up as weak scaling, its efficiency and "
            "each step's overhead (strong scaling too; optional: the bench, DDP from two "
            "collectives)", (85, 85),
            # cpu_run measured, papermill on a loaded 2-core machine (CPU profile, digits,
            # reference solutions): the core cells 232 s (setup 11, the learner's launch 35
            # and check 35, the 1-vs-N comparison 143), the optional ones 229 s (bench 193,
            # from-scratch check 36); the whole notebook 313 s and 466 s in two runs
            # reading: 20 min, 3 for weak scaling (no run: it reads the comparison's), 2
            # for the picture of a DDP step
            Budget(reading=25, exercises=45, cpu_run=5, gpu_run=10,
                   optional=(("how close to the physical limit?", 10),
                             ("DDP from two collectives, an exercise", 15)))),
    Session("notebooks/03_keeping_accuracy_at_scale.ipynb",
            "lose accuracy at a large batch and win it back (linear and square-root rules and "
            "why, warmup with SequentialLR, LARS, LAMB and NovoGrad, against three seeds' "
            "spread); early stopping at a target; BatchNorm across ranks; the large-batch "
            "challenge: beat the square-root rule on every seed", (60, 60),
            Budget(reading=15, exercises=20, cpu_run=20, gpu_run=10)),
    Session("notebooks/04_when_things_go_wrong.ipynb",
            "crash a rank, hang a collective, kill a rank and resume from the checkpoint (bit "
            "for bit the uninterrupted job); read where each rank of a hung job waits, then "
            "debug it (optional: a second hang, in a forward through DDP)", (40, 40),
            Budget(reading=12, exercises=15, cpu_run=12, gpu_run=8,
                   optional=(("a second hang, found the same way", 12),))),
    Session("notebooks/05_worked_example.ipynb",
            "mixed precision, memory and its remedies, gradient accumulation, DataParallel "
            "against DDP, a step's profile, samples/s against the batch per device, an "
            "input-bound DataLoader; fit global batch 256 where only 64 fits, find the knee",
            # reading re-counted with its printed sources, findings and recap: 20 min of the
            # core path once DataParallel (it needs GPUs) and the profile are optional, 2
            # more for the knee; cpu_run measured: the whole notebook, papermill on the
            # 2-core machine (CPU profile, digits, reference solutions), 53 s
            (60, 60), Budget(reading=22, exercises=23, cpu_run=5, gpu_run=10,
                             optional=(("`nn.DataParallel` against DDP", 6),
                                       ("where a step's time goes", 8)))),
    Session("assessment/release/ddp_refactor/ddp_refactor.ipynb",
            "convert another single-device script yourself; graded by what your job does",
            # 60-70: its budget is 65; 5 of its 75 went to 02's slack
            (60, 70), Budget(reading=5, exercises=50, cpu_run=10, gpu_run=5)),
    Session("notebooks/06_beyond_one_machine.ipynb",
            "data prepared once on each node's local rank 0 behind a barrier, data as record "
            "shards, two nodes and a lost node, SLURM and Kubernetes jobs",
            None, Budget(reading=20, exercises=15, cpu_run=15, gpu_run=10)),
    Session("notebooks/07_inside_ddp.ipynb",
            "build overlap, buckets and ZeRO-1 yourself; what comes next: communication "
            "hooks, torch.compile, FSDP", None,
            Budget(reading=20, exercises=45, cpu_run=10, gpu_run=5)),
    # After the assessment, on the day: no launch (its 1 min of "runs" is the kernel's start
    # and imports); it reads the learner's records.
    Session("notebooks/08_looking_back.ipynb",
            "read your own records of the day: your speed-up and what limited it, the batch "
            "your accuracy held at, a hang, your assessment job; a checked self-check; the "
            "survey", (15, 15), Budget(reading=8, exercises=6, cpu_run=1, gpu_run=1)),
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


def budget_line(session):
    """The line a notebook's opening cell states its budget in."""
    b = session.budget
    slot = (f"its {time_on_the_day(session)} on the day" if session.minutes else
            "for a second day, or early finishers")
    line = (f"{BUDGET_MARK}: about {b.minutes('cpu')} min on the CPU profile, "
            f"{b.minutes('gpu')} min on {GPUS} GPUs ({slot}): {b.reading} min reading, "
            f"{b.exercises} min exercises, runs {b.cpu_run} min on the CPU or {b.gpu_run} "
            f"min on {GPUS} GPUs")
    if b.optional:
        line += ("; optional, after the day or for early finishers: "
                 + ", ".join(f"{heading} ({minutes} min)" for heading, minutes in b.optional))
    return line + "."


def the_day():
    """The sessions on the day (a slot in minutes), in order."""
    return [s for s in SESSIONS if s.minutes is not None]


def day_line():
    """The README's sentence, below the table, on how the sessions fit the day."""
    slots = sum(s.minutes[1] for s in the_day())
    cpu = sum(s.budget.minutes("cpu") for s in the_day())
    gpu = sum(s.budget.minutes("gpu") for s in the_day())
    pauses = ", ".join(f"{name.lower()} {minutes} min" for _, name, minutes in BREAKS)
    return (f"{DAY_MARK} {DAY_MINUTES // 60} h: {slots} min of sessions at most and "
            f"{BREAK_MINUTES} min of breaks ({pauses}). A novice's budgets (reading, "
            f"exercises, runs; each notebook's opening cell states its own) add up to {cpu} "
            f"min on the CPU profile and {gpu} min on {GPUS} GPUs.")


ASSESSMENT_IN_WORKSPACE = "ddp_refactor/ddp_refactor.ipynb"  # jupyter/learner/make_workspace.py


def _assessment():
    return next(s for s in SESSIONS if s.notebook.startswith("assessment/"))


def last_notebook_before_the_assessment():
    """The day's last notebook session before the assessment: its closing cell is followed
    by ``recap()``."""
    day = the_day()
    return [s for s in day[:day.index(_assessment())] if s.notebook.startswith("notebooks/")][-1]


def recap(root=REPO):
    """The recap before the assessment: each session of the day so far and what the learner
    did there, where the assessment lives, the closing session after it, and what is left
    for a second day."""
    assessment = _assessment()
    day = the_day()
    done = [s for s in day[:day.index(assessment)] if s.notebook.startswith("notebooks/")]
    closing = day[day.index(assessment) + 1:]
    later = [s for s in SESSIONS if s.minutes is None]
    lines = ["Today, session by session:"]
    lines += [f"- {title(s, root)}: {s.you_do}." for s in done]
    lines += ["", f"Next, the assessment ({time_on_the_day(assessment)}): {assessment.you_do}. "
                  f"It lives in your JupyterLab at {ASSESSMENT_IN_WORKSPACE} (beside the "
                  f"notebooks/ folder, in the workspace `make lab` serves; the instructor's "
                  f"copy is {assessment.notebook}). Open it and follow it: it says what is "
                  f"graded."]
    lines += [f"Then {title(s, root)} ({time_on_the_day(s)}, {s.notebook}): {s.you_do}."
              for s in closing]
    lines += ["", "For a second day, or if you finish early:"]
    lines += [f"- {title(s, root)}: {s.you_do}." for s in later]
    return "\n".join(lines)


def in_teaching_order():
    """The sessions as the day runs them: the day's, then a second day's (``SESSIONS``
    keeps the notebooks' numbered order, and the closing session, 08, is on the day)."""
    return [*the_day(), *(s for s in SESSIONS if s.minutes is None)]


def clock(minutes):
    """Minutes after midnight as the day table writes a time: 9:05, 13:40."""
    return f"{minutes // 60}:{minutes % 60:02d}"


def table(root=REPO):
    """The day table, as Markdown: the day's sessions with their start times (each slot at
    its most), the breaks between them, then a second day's."""
    rows = ["| starts | session | what you do | time |", "|---|---|---|---|"]
    breaks = {notebook: (name, minutes) for notebook, name, minutes in BREAKS}
    now = DAY_STARTS
    for s in the_day():
        rows.append(f"| {clock(now)} | {title(s, root)} | {s.you_do} | {time_on_the_day(s)} |")
        now += s.minutes[1]
        if s.notebook in breaks:
            name, minutes = breaks[s.notebook]
            rows.append(f"| {clock(now)} | {name} | | {minutes} min |")
            now += minutes
    rows.append(f"| {clock(now)} | End of the day | | |")
    rows += [f"| | {title(s, root)} | {s.you_do} | {time_on_the_day(s)} |"
             for s in SESSIONS if s.minutes is None]
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


def with_line(text, mark, line, after):
    """``text`` with its line starting with ``mark`` replaced by ``line``; without one,
    ``line`` goes in as a paragraph of its own after the first line ``after`` accepts."""
    lines = text.split("\n")
    for i, old in enumerate(lines):
        if old.startswith(mark):
            lines[i] = line
            return "\n".join(lines)
    at = next(i for i, old in enumerate(lines) if after(old))
    return "\n".join([*lines[:at + 1], "", line, *lines[at + 1:]])


def opening_line(root, session):
    """The budget line in the session notebook's opening cell, or None."""
    cells = json.loads((root / session.notebook).read_text())["cells"]
    source = "".join(next(c for c in cells if c["cell_type"] == "markdown")["source"])
    return next((line for line in source.splitlines() if line.startswith(BUDGET_MARK)), None)


def day_line_in_readme(root=REPO):
    return next((line for line in (root / README).read_text().splitlines()
                 if line.startswith(DAY_MARK)), None)


def write(root=REPO):
    """Replace the day table and the day's line in the README, the table in notebook 00's
    opening cell, and the budget line in each notebook's opening cell (those lines only);
    return the files that changed."""
    import nbformat

    new = table(root)
    changed = []
    readme = root / README
    text = readme.read_text()
    start, end = table_span(text, README_SECTION)
    table_end = start + len(new)
    updated = text[:start] + new + text[end:]
    if not any(line.startswith(DAY_MARK) for line in updated.splitlines()):
        updated = f"{updated[:table_end]}\n\n{DAY_MARK}{updated[table_end:]}"  # placeholder
    updated = with_line(updated, DAY_MARK, day_line(), after=None)
    if updated != text:
        readme.write_text(updated)
        changed.append(README)
    for session in SESSIONS:
        if not session.notebook.startswith("notebooks/"):
            continue  # the assessment's notebook is nbgrader's: its cells are checksummed
        notebook = nbformat.read(root / session.notebook, as_version=4)
        cell = welcome_cell(notebook)
        source = with_line(cell.source, BUDGET_MARK, budget_line(session),
                           after=lambda line: line.startswith("# "))
        if session.notebook == WELCOME:
            start, end = table_span(source)
            source = source[:start] + new + source[end:]
        if source != cell.source:
            cell.source = source
            nbformat.write(notebook, root / session.notebook)
            changed.append(session.notebook)
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
