"""The single-device script against the DDP script, each changed hunk named by its DDP step.

Notebook 02 renders this diff; tests/test_twin_scripts.py holds every changed statement
to the same list of steps, so the lesson and the check cannot drift apart.
"""
import difflib
import html
import re
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
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


def step_of(line):
    """The DDP step a changed line belongs to, or None."""
    return next((name for name, pattern in DDP_STEPS.items() if re.search(pattern, line)), None)


def hunks(context=0):
    """``(steps, lines)`` per changed hunk of train.py -> train_ddp.py.

    ``lines`` are ``(tag, text)`` with tag ' ' (context), '-' (single only), '+' (DDP only).
    """
    single = (SCRIPTS / "train.py").read_text().splitlines()
    ddp = (SCRIPTS / "train_ddp.py").read_text().splitlines()
    result = []
    for group in difflib.SequenceMatcher(None, single, ddp).get_grouped_opcodes(context):
        lines = []
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                lines += [(" ", text) for text in single[i1:i2]]
            else:
                lines += [("-", text) for text in single[i1:i2]]
                lines += [("+", text) for text in ddp[j1:j2]]
        steps = []
        for tag, text in lines:
            step = step_of(text) if tag != " " else None
            if step and step not in steps:
                steps.append(step)
        result.append((steps, lines))
    return result


def render_html():
    """The diff as HTML: a heading per hunk naming its DDP step(s), then the lines."""
    colours = {"+": "#e6ffec", "-": "#ffebe9", " ": "transparent"}
    parts = []
    for steps, lines in hunks():
        title = ", ".join(steps) if steps else "unchanged context"
        body = "".join(
            f'<div style="background:{colours[tag]};white-space:pre">'
            f'{tag} {html.escape(text)}</div>' for tag, text in lines)
        parts.append(f'<p style="margin:0.8em 0 0.2em"><b>{html.escape(title)}</b></p>'
                     f'<div style="font-family:monospace;font-size:12px">{body}</div>')
    return "".join(parts)


def show():
    """Display the annotated diff in a notebook."""
    from IPython.display import HTML, display

    display(HTML(render_html()))
