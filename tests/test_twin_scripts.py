"""train_ddp.py differs from train.py only in DDP steps (the diff notebook 02 teaches).

An allowlist, not an exclusion list: every statement the DDP script adds or rewrites must
match one of the DDP ideas below, so a change made to one script alone fails here.
Statements are compared whole (continuation lines joined, comments and the module
docstring left out), so re-wrapping a line is not a difference.
"""
import ast
import copy
import difflib
import re

from conftest import REPO
from workshop_lib.ddp_diff import DDP_STEPS, hunks

# What the single-device script has that the DDP script drops.
SINGLE_PROCESS_ONLY = r"(RandomSampler|SequentialSampler|^world_size = 1$|generator\.manual_seed)"


def statements(path):
    """Each statement as ast.unparse writes it (one line; compound ones by their header),
    so formatting, comments and the module docstring never count as differences."""
    lines = []

    def visit(body):
        for node in body:
            blocks = [f for f in ("body", "orelse", "finalbody") if getattr(node, f, None)]
            if not blocks:
                lines.append(ast.unparse(node))
                continue
            header = copy.copy(node)
            for field in blocks:
                setattr(header, field, [ast.Pass()])
            lines.append(" ".join(part.strip() for part in ast.unparse(header).splitlines()
                                  if part.strip() != "pass"))
            for field in blocks:
                visit(getattr(node, field))

    visit(ast.parse(path.read_text()).body[1:])
    return lines


def diff():
    single = statements(REPO / "workshop_lib/train.py")
    ddp = statements(REPO / "workshop_lib/train_ddp.py")
    changes = [line for line in difflib.unified_diff(single, ddp, lineterm="", n=0)
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    return [c[1:] for c in changes if c[0] == "+"], [c[1:] for c in changes if c[0] == "-"]


def is_ddp_step(line):
    return any(re.search(pattern, line) for pattern in DDP_STEPS.values())


def test_every_added_statement_is_a_ddp_step():
    added, _ = diff()
    unexplained = [line for line in added if not is_ddp_step(line)]
    assert not unexplained, "DDP statements that are no DDP step:\n" + "\n".join(unexplained)


def rewritten_as_ddp_step(line, added):
    """True if a DDP-step statement keeps most of this one (DDP only added to it)."""
    def kept(new):
        blocks = difflib.SequenceMatcher(None, line, new).get_matching_blocks()
        return sum(b.size for b in blocks) / len(line)

    return any(is_ddp_step(new) and kept(new) >= 0.8 for new in added)


def test_every_removed_statement_is_replaced_by_a_ddp_step():
    added, removed = diff()
    unexplained = [line for line in removed if not (re.search(SINGLE_PROCESS_ONLY, line)
                                                    or rewritten_as_ddp_step(line, added))]
    assert not unexplained, "single-device statements missing from the DDP script:\n" + \
        "\n".join(unexplained)


def test_the_diff_shows_every_ddp_step_and_stays_short():
    added, removed = diff()
    text = "\n".join(added)
    for required in ("init_process_group", "DistributedSampler", "set_epoch", "DDP(model",
                     "model.module", "is_rank0", "dist.all_reduce", "destroy_process_group"):
        assert required in text, f"the DDP script should show {required}"
    # ~50 statements: the DDP steps, restarts and accumulation with no_sync; readable in class.
    assert len(added) <= 56, "the diff should stay short enough to read in class"


def test_every_rendered_hunk_is_named_by_a_ddp_step():
    rendered = hunks()
    unnamed = [lines for steps, lines in rendered if not steps]
    assert not unnamed, f"hunks notebook 02 could not name: {unnamed}"
    named = {step for steps, _ in rendered for step in steps}
    assert named >= set(DDP_STEPS) - {"names the DDP script"}
