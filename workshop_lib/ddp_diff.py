"""A single-device script against its DDP version, each changed hunk named by its DDP step.

Two pairs: notebook 02's exercise (``labs/files/conversion_stub.py`` against
``conversion_solution.py``, labelled by ``EXERCISE_STEPS``: the answer the notebook shows),
and the course's own twin scripts (``train.py`` against ``train_ddp.py``, labelled by
``DDP_STEPS``: optional reading, ``python -m workshop_lib.ddp_diff --course``).
tests/test_twin_scripts.py holds every changed statement of the twins to ``DDP_STEPS``, and
tests/test_ddp_diff.py every hunk of the exercise to ``EXERCISE_STEPS``, so the
lesson and the check cannot drift apart.
"""
import difflib
import html
import re
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
COURSE = (SCRIPTS / "train.py", SCRIPTS / "train_ddp.py")
EXERCISE = (SCRIPTS / "labs" / "files" / "conversion_stub.py",
            SCRIPTS / "labs" / "files" / "conversion_solution.py")
# Step name -> a pattern that a line belonging to that step matches (first match names it).
DDP_STEPS = {
    "distributed imports": r"^\s*(import os|from datetime import timedelta"
                           r"|import torch\.distributed|from torch\.nn\.parallel import"
                           r"|from torch\.utils\.data\.distributed"
                           r"|from workshop_lib\.errors import CourseError)",
    "distributed sampler + set_epoch": r"(DistributedSampler|ShardSampler|set_epoch)",
    "accumulation: no all-reduce until the last batch": r"(no_sync|\bsync\b"
                                                         r"|^import contextlib)",
    "DDP wrap, .module to unwrap": r"(DDP\(|\.module\b|\bwrap\(|process_group=)",
    "global metrics (all-reduce)": r"dist\.(all_reduce|broadcast)\(",
    "rank-0-only logging and checkpoints": r"\bis_rank0\b|\brank == 0\b",
    "elastic restarts and error reports": r"(TORCHELASTIC_RESTART_COUNT|restarted\b"
                                          r"|record_errors|elastic|\bjob\b|job_id)",
    "process group: join, leave; exit at once on error": r"(backend|init_process_group"
                                                         r"|device_id|^\s*(try:|raise$"
                                                         r"|except BaseException\b)"
                                                         r"|destroy_process_group"
                                                         r"|exit_at_once|dist-timeout"
                                                         r"|\bdistributed\b)",
    "rank layout from torchrun": r"\b(rank|local_rank|world_size|local_world_size"
                                 r"|torchrun_env)\b|os\.environ"
                                 # this rank's GPU made the current device
                                 r"|set_device|^if device\.type == 'cuda':$",
    "names the DDP script": r"(train_ddp|torchrun)",
}


# The exercise's steps, in the order notebook 02's section 1 lists them (first match names
# a line). Its module docstrings are the exercise's instructions, not code: left out.
EXERCISE_STEPS = {
    "process group: join with the device's backend, leave at the end":
        r"(import torch\.distributed|init_process_group|destroy_process_group)",
    "rank layout from torchrun; on GPUs, GPU LOCAL_RANK made current":
        r"(^import os$|os\.environ|\blocal_rank\b|set_device)",
    "each rank its own shard, a new one each epoch (DistributedSampler + set_epoch)":
        r"(DistributedSampler|set_epoch|run_epoch\((self, )?epoch\))",
    "global metrics: validation shards, their sums all-reduced":
        r"(dist\.all_reduce|\bSubset\b|val_shard|ALL ranks)",
    "the DDP wrap (gradients averaged in backward); .module to unwrap":
        r"(DistributedDataParallel|DDP\(|\.module\b|averages the gradients)",
    "rank 0 alone prints and writes":
        r"(\brank [!=]= 0\b|\brank\)|self\.rank\b)",
}


def step_of(line, steps=None):
    """The step (of ``steps``, default ``DDP_STEPS``) a changed line belongs to, or None."""
    steps = DDP_STEPS if steps is None else steps
    return next((name for name, pattern in steps.items() if re.search(pattern, line)), None)


def code_lines(path, skip_docstring=False):
    """The file's lines; with ``skip_docstring``, those after its module docstring."""
    text = Path(path).read_text()
    lines = text.splitlines()
    if skip_docstring:
        import ast

        docstring = ast.parse(text).body[0]
        if isinstance(docstring, ast.Expr) and isinstance(docstring.value, ast.Constant):
            lines = lines[docstring.end_lineno:]
    return lines


def hunks(context=0, pair=COURSE, steps=None, skip_docstring=False):
    """``(steps, lines)`` per changed hunk of ``pair`` (default train.py -> train_ddp.py),
    each named by the ``steps`` (default ``DDP_STEPS``) its changed lines match.

    ``lines`` are ``(tag, text)`` with tag ' ' (context), '-' (single only), '+' (DDP only).
    """
    single, ddp = (code_lines(path, skip_docstring) for path in pair)
    result = []
    for group in difflib.SequenceMatcher(None, single, ddp).get_grouped_opcodes(context):
        lines = []
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                lines += [(" ", text) for text in single[i1:i2]]
            else:
                lines += [("-", text) for text in single[i1:i2]]
                lines += [("+", text) for text in ddp[j1:j2]]
        named = []
        for tag, text in lines:
            step = step_of(text, steps) if tag != " " else None
            if step and step not in named:
                named.append(step)
        result.append((named, lines))
    return result


def exercise_hunks(context=0):
    """Notebook 02's answer: the exercise's stub -> solution, code only, named by step."""
    return hunks(context, EXERCISE, EXERCISE_STEPS, skip_docstring=True)


def render_html(rendered=None):
    """The diff as HTML (default: the course's twin scripts): a heading per hunk naming its
    DDP step(s), then the lines."""
    colours = {"+": "#e6ffec", "-": "#ffebe9", " ": "transparent"}
    parts = []
    for steps, lines in (hunks() if rendered is None else rendered):
        title = ", ".join(steps) if steps else "unchanged context"
        body = "".join(
            f'<div style="background:{colours[tag]};white-space:pre">'
            f'{tag} {html.escape(text)}</div>' for tag, text in lines)
        parts.append(f'<p style="margin:0.8em 0 0.2em"><b>{html.escape(title)}</b></p>'
                     f'<div style="font-family:monospace;font-size:12px">{body}</div>')
    return "".join(parts)


def render_text(rendered):
    """The diff as plain text: a ``## step`` line per hunk, then its lines."""
    parts = []
    for steps, lines in rendered:
        parts.append("## " + (", ".join(steps) if steps else "unchanged context"))
        parts += [f"{tag} {text}" for tag, text in lines]
    return "\n".join(parts)


def show(rendered=None):
    """Display an annotated diff in a notebook (default: the course's twin scripts)."""
    from IPython.display import HTML, display

    display(HTML(render_html(rendered)))


def show_exercise():
    """Display notebook 02's answer: the exercise's own diff, named step by step."""
    show(exercise_hunks())


def main(argv=None):
    from workshop_lib import cli

    parser = cli.ArgumentParser(prog="python -m workshop_lib.ddp_diff",
                                     description="Print a single-device -> DDP diff, each "
                                                 "hunk named by its DDP step.")
    parser.add_argument("--course", action="store_true",
                        help="the course's own train.py -> train_ddp.py (default: notebook "
                             "02's exercise, stub -> solution)")
    args = parser.parse_args(argv)
    print(render_text(hunks() if args.course else exercise_hunks()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
