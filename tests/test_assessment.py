"""The assessment's round trip on the real nbgrader CLI, the way an instructor runs it, and
more graded runs through its engine.

A copy of assessment/ gets its release and gradebook (`make release`), then one
submission per case: the instructor's solution, a correct solution in another style, the
untouched release, typical mistakes (each must lose exactly its requirements), a correct
variant that must keep full marks, learners' attempts at changing the grade from cells
of their own (each must score exactly what its script earns), and a job that never
finishes. `make autograde` grades them, each with a real torchrun launch of the learner's
script (on the CPU only the graded run: the speed-up, reported and never required, is
measured on GPUs); the scores
are read from nbgrader's gradebook, because nbgrader exits 0 even when tests fail. To keep
CI time down, most attempts at changing the grade ride on a submission with a mistake:
without the guards they would turn its lost points into full marks.

The variants nbgrader adds nothing to (no cell or file of the learner's beyond the
script) are graded through the engine alone, ``ddp_checks.launch`` with the graded run's
settings and each check, one torchrun launch each: the mistakes in averaging the
gradients (also a job that averages only its first 3 steps, or all but its last), a job of
identical copies without a process group, and correct variants (gradient accumulation
with no_sync, a different initialisation per rank, the table logged to stderr and the
checkpoint saved with the course's checkpoint.save_atomic; every rank saving so loses
requirement 5 only). One of them
asks for the speed-up on the CPU too (SPEEDUP_VARIANT): the single-process launch that
grading on GPUs adds, run for real. Notebook 02's reference conversion, and small edits of
it (PRACTICE_VARIANTS), graded alike, must not pass: the practice is not the assessment.
"""
import contextlib
import csv
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import nbformat
import pytest
from nbgrader.api import Gradebook
from test_assessment_sizing import notebook_configs

from conftest import REPO

pytestmark = pytest.mark.slow

ASSESSMENT = REPO / "assessment"
ASSIGNMENT = "ddp_refactor"
NOTEBOOK = f"{ASSIGNMENT}.ipynb"
# The files beside the notebook, in source/ and release/ alike: the checks and the recorder,
# each with its rooms, the sandbox and the data module.
GRADING_FILES = ("ddp_checks.py", "ddp_checks_rules.py", "ddp_checks_run.py",
                 "ddp_checks_launch.py", "ddp_checks_training.py", "ddp_checks_gradients.py",
                 "ddp_checks_rank0.py", "ddp_recorder.py", "ddp_recorder_data.py",
                 "ddp_recorder_steps.py", "ddp_recorder_outputs.py", "ddp_recorder_replay.py",
                 "ddp_sandbox.py", "digits_data.py")
SUBMISSIONS = Path(__file__).resolve().parent / "assessment_submissions"
SCRIPT_CELL = "ddp_script"
EDITED_TEST = "shards_reshuffled_each_epoch"
SKIPPED_TEST = "rank0_only_logs_and_writes"
MAX_SCORE = 12
# The hanging submission runs under short limits, so that the test does not wait 5 min.
HANG_LAUNCH_LIMIT_S = 15
HANG_CELL_TIMEOUT_S = 30
# Each graded notebook executes within this, on 2 CPU cores (one launch: the graded run;
# on GPUs a second one, as a single process, for the speed-up).
NOTEBOOK_LIMIT_S = 90

# Edits of the instructor's solution, and the test cells (by nbgrader grade_id) that each
# must fail: all the others must give full points.
VARIANTS = {
    "no_sampler": ([  # every rank trains on all the data, in the same order
        ("""    train_sampler = DistributedSampler(train_set, shuffle=True, seed=seed)
    train_loader = DataLoader(train_set, batch_size=batch_size, sampler=train_sampler)
""", """    generator = torch.Generator().manual_seed(seed)
    train_loader = DataLoader(train_set, batch_size=batch_size, shuffle=True,
                              generator=generator)
"""),
        ("        train_loader.sampler.set_epoch(epoch)\n", ""),
    ], {"shards_disjoint_and_cover", "gradients_averaged_over_ranks"}),
    "no_set_epoch": ([
        ("        train_loader.sampler.set_epoch(epoch)\n", ""),
    ], {"shards_reshuffled_each_epoch"}),
    "checkpoint_every_rank": ([
        ("""            log.flush()
            # The unwrapped model: the checkpoint loads into build_model() without DDP.
            torch.save({"epoch": epoch, "model": model.module.state_dict(),
                        "optimizer": optimizer.state_dict()}, args.out / "checkpoint.pt")
""", """            log.flush()
        torch.save({"epoch": epoch, "model": model.module.state_dict(),
                    "optimizer": optimizer.state_dict()}, args.out / "checkpoint.pt")
"""),
    ], {"rank0_only_logs_and_writes"}),
    "metrics_not_reduced": ([
        ("""        dist.all_reduce(train_sums)
        dist.all_reduce(val_sums)
""", ""),
    ], {"validation_metrics_are_global"}),
    "lr_not_scaled": ([
        ("    lr = args.lr * world_size\n", "    lr = args.lr\n"),
    ], {"learning_rate_follows_global_batch"}),
    "drop_last": ([
        ("DistributedSampler(train_set, shuffle=True, seed=seed)",
         "DistributedSampler(train_set, shuffle=True, seed=seed, drop_last=True)"),
        ("DataLoader(train_set, batch_size=batch_size, sampler=train_sampler)",
         "DataLoader(train_set, batch_size=batch_size, sampler=train_sampler,\n"
         "                              drop_last=True)"),
    ], set()),
}
# Graded through the engine alone: edits of the solution (or a whole script), the test
# cells each must fail, and words its reason must hold.
ENGINE_VARIANTS = {
    "not_wrapped": ([
        ("""    model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
""", ""),
        ("model.module.state_dict()", "model.state_dict()"),
    ], {"gradients_averaged_over_ranks"}, "each rank stepped on its own gradients"),
    "summed_gradients": ([
        ("        (loss / in_step).backward()\n",
         "        (loss * dist.get_world_size() / in_step).backward()\n"),
    ], {"gradients_averaged_over_ranks"}, "summed, not averaged"),
    "parameters_averaged_each_epoch": ([
        ("""    model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
""", ""),
        ("model.module.state_dict()", "model.state_dict()"),
        ("""        train_sums = train_one_epoch(model, train_loader, optimizer, device,
                                     args.accumulate)
""", """        train_sums = train_one_epoch(model, train_loader, optimizer, device,
                                     args.accumulate)
        with torch.no_grad():  # local SGD: the ranks' parameters averaged once per epoch
            for p in model.parameters():
                dist.all_reduce(p)
                p /= world_size
"""),
    ], {"gradients_averaged_over_ranks"}, "each rank stepped on its own gradients"),
    "no_process_group": (  # tests/assessment_submissions/no_process_group.py: copies
        None, {"shards_disjoint_and_cover", "gradients_averaged_over_ranks"},
        "(dist.init_process_group was never called)"),
    # The epoch's last step, short of batches (the graded run's training set is sized so,
    # on every rank count), divided as if it were full: its gradient is too small.
    "short_last_step_divided_as_full": ([
        ("        in_step = min(accumulate, len(loader) - i // accumulate * accumulate)\n",
         "        in_step = accumulate\n"),
    ], {"gradients_averaged_over_ranks"}, "differ from a single-process replay"),
    "init_per_rank_then_broadcast": ([  # DDP broadcasts rank 0's parameters
        ("    torch.manual_seed(args.seed)\n", "    torch.manual_seed(args.seed + rank)\n"),
    ], set(), None),
    "accumulate_no_sync": ([  # notebook 05's gradient accumulation: no_sync
        ("import argparse\n", "import argparse\nimport contextlib\n"),
        ("""        loss = F.cross_entropy(model(x), y)
        (loss / in_step).backward()
        if (i + 1) % accumulate == 0 or i + 1 == len(loader):
""", """        last = (i + 1) % accumulate == 0 or i + 1 == len(loader)
        # The step's earlier batches skip DDP's all-reduce; its last averages them all.
        with contextlib.nullcontext() if last else model.no_sync():
            loss = F.cross_entropy(model(x), y)
            (loss / in_step).backward()
        if last:
"""),
    ], set(), None),
}

# Averages the gradients (DDP) for the first AVERAGED steps only, then lets each rank step on
# its own (no_sync) and averages the parameters at the end of every epoch, so that all
# ranks end with the same parameters: the exploit of the replay that judged 3 steps.
STOPS_AVERAGING = [
    ("import argparse\n", "import argparse\nimport contextlib\n"),
    ("""def train_one_epoch(model, loader, optimizer, device, accumulate):
""", """STEPS_TAKEN = [0]


def train_one_epoch(model, loader, optimizer, device, accumulate):
"""),
    ("""    model.train()
    sums = torch.zeros(2, device=device)
    optimizer.zero_grad()
""", """    model.train()
    sums = torch.zeros(2, device=device)
    optimizer.zero_grad()
    averaged = AVERAGED(-(-len(loader) // accumulate))
"""),
    # no_sync() around the forward too: DDP decides at the forward whether to all-reduce.
    ("""        loss = F.cross_entropy(model(x), y)
        (loss / in_step).backward()
        if (i + 1) % accumulate == 0 or i + 1 == len(loader):
            optimizer.step()
            optimizer.zero_grad()
""", """        with contextlib.nullcontext() if STEPS_TAKEN[0] < averaged else model.no_sync():
            loss = F.cross_entropy(model(x), y)
            (loss / in_step).backward()
        if (i + 1) % accumulate == 0 or i + 1 == len(loader):
            optimizer.step()
            optimizer.zero_grad()
            STEPS_TAKEN[0] += 1
"""),
    ("""        train_sums = train_one_epoch(model, train_loader, optimizer, device,
                                     args.accumulate)
""", """        train_sums = train_one_epoch(model, train_loader, optimizer, device,
                                     args.accumulate)
        with torch.no_grad():  # the ranks' parameters made equal again
            for p in model.parameters():
                dist.all_reduce(p)
                p /= world_size
"""),
]
EPOCHS_GRADED = notebook_configs()["graded"]["epochs"]


def stops_averaging(averaged):
    """STOPS_AVERAGING with the number of averaged steps, an expression of the number of
    optimizer steps per epoch (``steps``)."""
    return [*STOPS_AVERAGING, ("\ndef parse_args(", f"\nAVERAGED = lambda steps: {averaged}"
                                                    f"\n\n\ndef parse_args(")]


# The course's own atomic save (workshop_lib.checkpoint.save_atomic: torch.save through a
# file object of a temporary file renamed into place), and the table logged to stderr.
SAVE_ATOMIC_AND_LOGGING = [
    ("import argparse\n", "import argparse\nimport logging\n"),
    ("from digits_data import load_data\n",
     "from digits_data import load_data\nfrom workshop_lib import checkpoint\n"),
    ("""        if rank == 0:
            print(f"epoch {epoch:2d}/{args.epochs}  train_loss {record['train_loss']:.4f}  "
                  f"val_loss {record['val_loss']:.4f}  val_acc {record['val_acc']:.4f}",
                  flush=True)
""", """        if rank == 0:
            logging.warning("epoch %2d/%d  val_loss %.4f  val_acc %.4f", epoch, args.epochs,
                            record["val_loss"], record["val_acc"])
"""),
    ("""            torch.save({"epoch": epoch, "model": model.module.state_dict(),
                        "optimizer": optimizer.state_dict()}, args.out / "checkpoint.pt")
""", """            checkpoint.save_atomic({"epoch": epoch, "model": model.module.state_dict()},
                                   args.out / "checkpoint.pt")
"""),
]
SAVE_ATOMIC_EVERY_RANK = [
    ("from digits_data import load_data\n",
     "from digits_data import load_data\nfrom workshop_lib import checkpoint\n"),
    ("""            log.flush()
            # The unwrapped model: the checkpoint loads into build_model() without DDP.
            torch.save({"epoch": epoch, "model": model.module.state_dict(),
                        "optimizer": optimizer.state_dict()}, args.out / "checkpoint.pt")
""", """            log.flush()
        args.out.mkdir(parents=True, exist_ok=True)
        checkpoint.save_atomic({"epoch": epoch, "model": model.module.state_dict()},
                               args.out / "checkpoint.pt")
"""),
]
ENGINE_VARIANTS.update({
    "averages_first_3_steps": (stops_averaging("3"), {"gradients_averaged_over_ranks"},
                               "average the gradients over the ranks at every step"),
    # Every step but the very last: one step of each rank's own, then the parameters
    # averaged, equals the averaged step for SGD; each rank's momentum does not.
    "averages_all_but_the_last_step": (
        stops_averaging(f"{EPOCHS_GRADED} * steps - 1"), {"gradients_averaged_over_ranks"},
        "optimizer state (its momentum) differs"),
    "save_atomic_and_logging": (SAVE_ATOMIC_AND_LOGGING, set(), None),
    "save_atomic_every_rank": (SAVE_ATOMIC_EVERY_RANK, {"rank0_only_logs_and_writes"},
                               "rank 1 wrote out/checkpoint.pt"),
})
# Notebook 02's reference conversion (printed in full on the day), graded as a submission
# as is and after small edits, each cumulative; the graded run passes --accumulate 2, which
# the practice script does not have: none may pass. Each: edits, the test cells it must
# fail (None: every one), words of its reason.
PRACTICE = REPO / "workshop_lib" / "labs" / "files" / "conversion_solution.py"
SWAPPED = [  # the assessment's data and model in place of the practice's
    ("from workshop_lib.labs.conversion_data import load_data\n",
     "from digits_data import load_data\n"),
    ("    model = Net().to(device)\n",
     "    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to(device)\n"),
]
FLAG_IGNORED = [*SWAPPED, (
    '    parser.add_argument("--lr", type=float, default=0.05)\n',
    '    parser.add_argument("--lr", type=float, default=0.05)\n'
    '    parser.add_argument("--accumulate", type=int, default=1)\n')]
ACCUMULATES_SUMMED = [*FLAG_IGNORED, (  # a step every --accumulate batches, losses not divided
    """        for x, y in self.train_loader:
            x, y = x.to(self.device), y.to(self.device)
            self.optimizer.zero_grad()
            F.cross_entropy(self.model(x), y).backward()  # DDP averages the gradients here
            self.optimizer.step()
""", """        self.optimizer.zero_grad()
        for i, (x, y) in enumerate(self.train_loader):
            x, y = x.to(self.device), y.to(self.device)
            F.cross_entropy(self.model(x), y).backward()
            if (i + 1) % self.accumulate == 0 or i + 1 == len(self.train_loader):
                self.optimizer.step()
                self.optimizer.zero_grad()
"""), (
    "    Trainer(model, train_loader, val_loader, optimizer, device, args.out, rank)"
    ".train(args.epochs)\n",
    "    trainer = Trainer(model, train_loader, val_loader, optimizer, device, args.out, rank)\n"
    "    trainer.accumulate = args.accumulate\n"
    "    trainer.train(args.epochs)\n")]
PRACTICE_VARIANTS = {
    "practice_reference": ([], None, "error: unrecognized arguments: --accumulate 2"),
    "practice_data_and_model_swapped": (SWAPPED, None,
                                        "error: unrecognized arguments: --accumulate 2"),
    "practice_accumulate_ignored": (
        FLAG_IGNORED, {"gradients_averaged_over_ranks", "learning_rate_follows_global_batch"},
        "optimizer steps took 1 batch(es) of train_set each (step 1 took 1, expected 2)"),
    "practice_accumulates_summed": (
        ACCUMULATES_SUMMED,
        {"gradients_averaged_over_ranks", "learning_rate_follows_global_batch"},
        "and each batch's loss by the number of batches its step accumulates"),
}
# Graded by the engine with Config(measure_speedup=True): also launched as a single process.
SPEEDUP_VARIANT = "init_per_rank_then_broadcast"
NEVER_FINISHES = [  # the epoch counter is never incremented
    ("""    for epoch in range(1, args.epochs + 1):
""", """    epoch = 1
    while epoch <= args.epochs:
"""),
]

# Learners' own cells that try to change the grade; nbgrader would run them in the kernel
# before the test cells. Each rides on a submission whose script loses points.
PASS_ALL = """import ddp_checks

def passing(run):
    print("PASS")

for name in dir(ddp_checks):
    if name.startswith("check_"):
        setattr(ddp_checks, name, passing)
ddp_checks.CHECKS = {name: passing for name in ddp_checks.CHECKS}"""
PASS_ONE = """import ddp_checks
ddp_checks.check_shards_disjoint_and_cover = lambda run: print("PASS")"""
# Survives `importlib.reload(ddp_checks)` and a fresh `import ddp_checks`.
PASS_ALL_STICKY = """import builtins
import importlib
import sys

import ddp_checks

def passing(run):
    print("PASS")

def patch(module):
    if getattr(module, "__name__", "") == "ddp_checks":
        for name in dir(module):
            if name.startswith("check_"):
                setattr(module, name, passing)
    return module

reload, load = importlib.reload, builtins.__import__
importlib.reload = lambda module: patch(reload(module))
builtins.__import__ = lambda name, *args, **kwargs: patch(load(name, *args, **kwargs))
sys.modules["ddp_checks"] = patch(ddp_checks)"""
ATTEMPTS = {  # submission: its added cell
    "no_sampler": PASS_ONE,
    "metrics_not_reduced": PASS_ALL,
    "lr_not_scaled": PASS_ALL_STICKY,
}
# Instead of a %%writefile cell, Python that patches the checks: graded as the script it
# writes, which trains nothing.
SCRIPT_CELL_AS_KERNEL_CODE = PASS_ALL
# Files submitted next to the notebook: a torch package that would shadow the real one.
SHADOWING_FILES = {"torch/__init__.py": "raise ImportError('a learner\\'s torch')\n"}
# A learner's own cell that waits for a file no run writes.
WAITING_CELL = """import time
from pathlib import Path

while not (Path("runs") / "ddp" / "done").exists():
    time.sleep(1)"""
# What a learner might put in place of a test cell that fails for them.
EDITED_TEST_SOURCE = '"""Requirement 3 (1 point)."""\nprint("PASS")'


def grade_id(cell):
    return cell.metadata.get("nbgrader", {}).get("grade_id")


def cell_by_id(notebook, cell_id):
    return next(cell for cell in notebook.cells if grade_id(cell) == cell_id)


def without_solution_markers(source):
    return "\n".join(line for line in source.split("\n")
                     if "### BEGIN SOLUTION" not in line and "### END SOLUTION" not in line)


def solution_script():
    """The instructor's script cell, as a learner who wrote the same would submit it."""
    source = nbformat.read(ASSESSMENT / "source" / ASSIGNMENT / NOTEBOOK, as_version=4)
    return without_solution_markers(cell_by_id(source, SCRIPT_CELL).source)


def with_edits(script, edits, name):
    for old, new in edits:
        assert script.count(old) == 1, f"{name}: the solution no longer contains {old!r}"
        script = script.replace(old, new)
    return script


def submit(course, student, script=None, edit=None, files=None):
    """Write submitted/<student>/: the release notebook with the script cell replaced,
    then ``edit`` applied, and any other ``files`` beside it."""
    notebook = nbformat.read(course / "release" / ASSIGNMENT / NOTEBOOK, as_version=4)
    if script is not None:
        cell_by_id(notebook, SCRIPT_CELL).source = script
    if edit:
        edit(notebook)
    folder = course / "submitted" / student / ASSIGNMENT
    folder.mkdir(parents=True)
    nbformat.write(notebook, folder / NOTEBOOK)
    for name, text in (files or {}).items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


def make(course, target, *args, env=None, timeout=1200):
    venv = Path(sys.executable).parent.parent
    result = subprocess.run(["make", "-C", str(course), target, f"VENV={venv}", *args],
                            capture_output=True, text=True, timeout=timeout,
                            env={**os.environ, **(env or {})})
    assert result.returncode == 0, f"make {target} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


def execution_seconds(notebook_path):
    """Wall time of one graded notebook, from the cell timings nbclient records."""
    notebook = nbformat.read(notebook_path, as_version=4)
    stamps = [datetime.fromisoformat(t.replace("Z", "+00:00"))
              for cell in notebook.cells
              for key, t in cell.metadata.get("execution", {}).items()
              if key in ("iopub.execute_input", "shell.execute_reply")]
    return (max(stamps) - min(stamps)).total_seconds()


def submit_cases(course):
    """Every submission of the first `make autograde`."""
    solution = solution_script()
    submit(course, "solution", solution)
    alt_style = (SUBMISSIONS / "alt_style.py").read_text()
    submit(course, "alt_style", f"%%writefile train_digits_ddp.py\n{alt_style}")
    submit(course, "untouched_release")
    for name, (edits, _) in VARIANTS.items():
        def edit(notebook, name=name):
            if name in ATTEMPTS:
                add_cell(notebook, ATTEMPTS[name])
            if name == "no_set_epoch":  # ... and the learner "fixed" the test that fails
                cell_by_id(notebook, EDITED_TEST).source = EDITED_TEST_SOURCE
            if name == "checkpoint_every_rank":  # ... and told nbclient to skip that test
                cell_by_id(notebook, SKIPPED_TEST).metadata["tags"] = ["skip-execution"]
        files = SHADOWING_FILES if name == "drop_last" else {}
        submit(course, name, with_edits(solution, edits, name), edit, files)
    submit(course, "script_cell_as_kernel_code", SCRIPT_CELL_AS_KERNEL_CODE)


def add_cell(notebook, source):
    """A learner's cell right after the script cell: before every test cell."""
    at = notebook.cells.index(cell_by_id(notebook, SCRIPT_CELL)) + 1
    notebook.cells.insert(at, nbformat.v4.new_code_cell(source))


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """A copy of assessment/ after the whole instructor workflow; also prints the score
    table (shown with pytest -s, or when a test fails)."""
    course = tmp_path_factory.mktemp("course") / "assessment"
    shutil.copytree(ASSESSMENT, course, ignore=shutil.ignore_patterns(
        "gradebook.db", "submitted", "autograded", "feedback", "grades.csv",
        "autograde.log", "runs", "grading_run", "train_digits*.py", "__pycache__"))
    shutil.rmtree(course / "release")  # made afresh: test_committed_release compares
    make(course, "release")
    submit_cases(course)
    start = time.perf_counter()
    autograde_log = make(course, "autograde")
    autograde_s = time.perf_counter() - start

    submit(course, "never_finishes", with_edits(solution_script(), NEVER_FINISHES,
                                                "never_finishes"),
           lambda notebook: add_cell(notebook, WAITING_CELL))
    # `make autograde` again grades only the new submission.
    start = time.perf_counter()
    hang_log = make(course, "autograde",
                    f"NBGRADER_ARGS=--Execute.timeout={HANG_CELL_TIMEOUT_S}",
                    env={"DDP_CHECKS_TIME_LIMIT_S": str(HANG_LAUNCH_LIMIT_S)})
    hang_s = time.perf_counter() - start

    make(course, "feedback")
    grades_log = make(course, "grades")

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        scores = {}
        for submission in gradebook.assignment_submissions(ASSIGNMENT):
            notebook = submission.notebooks[0]
            scores[submission.student.id] = {
                "total": (submission.score, submission.max_score),
                "cells": {grade.name: (grade.score, grade.max_score)
                          for grade in notebook.grades},
            }
    seconds = {student: execution_seconds(course / "autograded" / student / ASSIGNMENT
                                          / NOTEBOOK) for student in scores}
    print(f"\nautograde of {len(scores) - 1} submissions: {autograde_s:.0f} s; "
          f"of never_finishes: {hang_s:.0f} s")
    for student, result in sorted(scores.items()):
        lost = [f"{cell} -{mx - got:g}" for cell, (got, mx) in result["cells"].items()
                if got < mx]
        print(f"{student:30} {result['total'][0]:4g}/{result['total'][1]:g}  "
              f"{seconds[student]:5.1f} s  {', '.join(lost) or 'full marks'}")
    return {"path": course, "scores": scores, "seconds": seconds, "hang_s": hang_s,
            "autograde_log": autograde_log, "hang_log": hang_log, "grades_log": grades_log}


def load_checks():
    """ddp_checks.py of source/, as the graded notebook imports it."""
    spec = importlib.util.spec_from_file_location(
        "round_trip_ddp_checks", ASSESSMENT / "source" / ASSIGNMENT / "ddp_checks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """Each of ENGINE_VARIANTS graded by the engine, as its test cells would: one launch
    with the graded run's settings on 2 CPU processes (and for SPEEDUP_VARIANT the
    single-process run for the speed-up), then every check and the report. ``{variant:
    {"reasons": {grade id: reason or None}, "report": (points, passed), "printed": the
    report, "speed": Run.speed()}}``."""
    checks = load_checks()
    graded = {}
    for name, (edits, _, _) in {**ENGINE_VARIANTS, **PRACTICE_VARIANTS}.items():
        config = checks.Config(**notebook_configs()["graded"],
                               measure_speedup=name == SPEEDUP_VARIANT)
        folder = tmp_path_factory.mktemp(name)
        shutil.copy(ASSESSMENT / "source" / ASSIGNMENT / "digits_data.py", folder)
        if name in PRACTICE_VARIANTS:
            script = with_edits(PRACTICE.read_text(), edits, name)
        elif edits is None:
            script = (SUBMISSIONS / f"{name}.py").read_text()
        else:
            script = with_edits(solution_script(), edits, name).split("\n", 1)[1]
        (folder / "train_digits_ddp.py").write_text(script)
        checks.RUN_DIR = folder / "grading_run"
        with contextlib.redirect_stdout(io.StringIO()):
            run = checks.launch(folder / "train_digits_ddp.py", config, nproc=2, on_gpu=False)
        reasons = {}
        for grade_id, check in checks.CHECKS.items():
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    check(run)
                reasons[grade_id] = None
            except checks.RequirementNotMet as reason:
                reasons[grade_id] = str(reason)
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            report = checks.report(run)
        graded[name] = {"reasons": reasons, "report": report, "printed": printed.getvalue(),
                        "seconds": run.elapsed_s, "speed": run.speed()}
        print(f"{name:30} {report[0]:2d}/12 passed={report[1]}  {run.elapsed_s:5.1f} s  "
              + "; ".join(f"{g}: {r}" for g, r in reasons.items() if r))
    return graded


def failing_cells(course, student):
    return {cell for cell, (got, mx) in course["scores"][student]["cells"].items()
            if got < mx}


def assert_only_failing(course, student, expected):
    cells = course["scores"][student]["cells"]
    assert failing_cells(course, student) == expected
    assert all(got == 0 for cell, (got, mx) in cells.items() if cell in expected)
    total, max_total = course["scores"][student]["total"]
    assert total == max_total - sum(cells[cell][1] for cell in expected)


def feedback_text(course, student):
    """The words of a learner's feedback page (without its markup, styles and scripts)."""
    html = (course["path"] / "feedback" / student / ASSIGNMENT
            / f"{ASSIGNMENT}.html").read_text()
    html = re.sub(r"<(style|script)\b.*?</\1>", " ", html, flags=re.S)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def graded_notebook(course, student):
    return nbformat.read(course["path"] / "autograded" / student / ASSIGNMENT / NOTEBOOK,
                         as_version=4)


def test_instructor_solution_gets_full_marks(course):
    assert course["scores"]["solution"]["total"] == (MAX_SCORE, MAX_SCORE)
    assert_only_failing(course, "solution", set())


def test_correct_solution_in_another_style_gets_full_marks(course):
    assert_only_failing(course, "alt_style", set())


def test_untouched_release_scores_zero_quickly_with_the_reason(course):
    assert course["scores"]["untouched_release"]["total"][0] == 0
    assert failing_cells(course, "untouched_release") == set(
        course["scores"]["solution"]["cells"])
    feedback = feedback_text(course, "untouched_release")
    assert "stopped with NotImplementedError" in feedback
    assert "still needs your code" in feedback


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_variant_loses_exactly_the_requirement_it_breaks(course, variant):
    assert_only_failing(course, variant, VARIANTS[variant][1])


@pytest.mark.parametrize("variant", ENGINE_VARIANTS)
def test_each_variant_graded_by_the_engine_loses_exactly_what_it_breaks(engine, variant):
    _, lost, reason = ENGINE_VARIANTS[variant]
    reasons = engine[variant]["reasons"]
    assert {grade_id for grade_id, why in reasons.items() if why} == lost, reasons
    if reason:
        assert any(reason in why for why in reasons.values() if why), reasons
    points = 12 - sum(load_checks().REQUIREMENTS[grade_id] for grade_id in lost)
    assert engine[variant]["report"][0] == points


def test_correct_variants_pass_and_jobs_that_are_not_data_parallel_do_not(engine):
    """Gradient accumulation with no_sync (notebook 05's), a different initialisation per
    rank: full marks. Copies of one training without a process group, and ranks stepping
    alone: not passed, whatever else they get right."""
    for variant in ("accumulate_no_sync", "init_per_rank_then_broadcast"):
        assert engine[variant]["report"] == (12, True)
    for variant in ("no_process_group", "not_wrapped", "summed_gradients",
                    "parameters_averaged_each_epoch"):
        assert engine[variant]["report"][1] is False, variant
    copies = engine["no_process_group"]
    assert "Give each rank its own shard (DistributedSampler)" in copies["reasons"][
        "shards_disjoint_and_cover"]
    assert "wrap the model in DistributedDataParallel" in copies["reasons"][
        "gradients_averaged_over_ranks"]
    assert "Not passed without shards_disjoint_and_cover and gradients_averaged_over_ranks" \
        in copies["printed"]


@pytest.mark.parametrize("variant", PRACTICE_VARIANTS)
def test_notebook_02s_reference_and_small_edits_of_it_do_not_pass(engine, variant):
    """The practice's answer is not the assessment's: as is, with the assessment's data and
    model swapped in, with --accumulate added but ignored (a step every batch), and with the
    accumulation done but the batches' gradients summed: none passes, each for its reason."""
    _, lost, reason = PRACTICE_VARIANTS[variant]
    graded = engine[variant]
    reasons = graded["reasons"]
    failed = {grade_id for grade_id, why in reasons.items() if why}
    assert failed == (lost or set(reasons)), reasons
    assert any(reason in why for why in reasons.values() if why), reasons
    assert graded["report"][1] is False
    assert "Result: NOT PASSED" in graded["printed"]


def test_every_graded_notebook_runs_within_the_limit(course):
    slow = {student: round(s) for student, s in course["seconds"].items()
            if s > NOTEBOOK_LIMIT_S and student != "never_finishes"}
    assert not slow, f"over {NOTEBOOK_LIMIT_S} s: {slow}"


def test_feedback_says_why_a_requirement_is_not_met(course):
    assert "set_epoch(epoch)" in feedback_text(course, "no_set_epoch")
    no_sampler = feedback_text(course, "no_sampler")
    assert "overlapping data" in no_sampler  # shards_disjoint_and_cover
    assert "the ranks trained on the same samples" in no_sampler  # gradients_averaged
    assert no_sampler.count("Give each rank its own shard (DistributedSampler)") >= 2
    assert "rank 1 wrote out/checkpoint.pt" in feedback_text(course, "checkpoint_every_rank")
    assert "dist.all_reduce" in feedback_text(course, "metrics_not_reduced")
    graded_lr = notebook_configs()["graded"]["lr"]
    assert f"scale --lr {graded_lr:g} by the world size" in feedback_text(course,
                                                                          "lr_not_scaled")
    for student in course["scores"]:  # in test cells: the reason alone, no traceback
        for cell in graded_notebook(course, student).cells:
            if cell.metadata.get("nbgrader", {}).get("grade"):
                for output in cell.outputs:
                    if output.output_type == "error":
                        assert output.ename == "RequirementNotMet"
                        assert len(output.traceback) == 1, output.traceback


def test_feedback_ends_with_the_total_and_the_pass_mark(course):
    expected = {"solution": "Total: 12 of 12 points", "lr_not_scaled": "Total: 11 of 12",
                "no_sampler": "Total: 7 of 12", "untouched_release": "Total: 0 of 12"}
    rule = load_checks().pass_rule()
    for student, total in expected.items():
        feedback = feedback_text(course, student)
        assert total in feedback
        assert f"Pass mark: {rule}." in feedback
        verdict = "NOT PASSED" if student in ("no_sampler", "untouched_release") else "PASSED"
        assert f"Result: {verdict}." in feedback
    assert "Not passed without shards_disjoint_and_cover and gradients_averaged_over_ranks" \
        in feedback_text(course, "no_sampler")


def test_feedback_says_why_the_cpu_grader_does_not_measure_the_speed_up(course):
    feedback = feedback_text(course, "solution")
    assert ("Speed-up: not measured (on the CPU the speed-up is not required: the processes "
            "share" in feedback), feedback[-3000:]
    assert list((course["path"] / "grading_run").glob("**/one_process")) == [], \
        "no single-process launch on the CPU"


def test_asked_for_on_the_cpu_the_speed_up_is_measured_by_a_real_single_process_run(engine):
    speedup, why_not = engine[SPEEDUP_VARIANT]["speed"]
    assert why_not is None and speedup > 0
    assert re.search(r"Speed-up: [\d,]+ training samples/s on 2 CPU processes, [\d,]+ as a "
                     r"single process: \d+\.\d\dx \(on the CPU the speed-up is not "
                     r"required: the processes share", engine[SPEEDUP_VARIANT]["printed"])
    assert engine[SPEEDUP_VARIANT]["report"] == (12, True)


@pytest.mark.parametrize("student", [*ATTEMPTS, "script_cell_as_kernel_code"])
def test_cells_a_learner_adds_are_not_graded(course, student):
    """Each attempt scores what its script earns: the added cell is gone from the graded
    notebook, and the script cell writes the script."""
    graded = graded_notebook(course, student)
    release = nbformat.read(course["path"] / "release" / ASSIGNMENT / NOTEBOOK, as_version=4)
    assert [grade_id(c) for c in graded.cells] == [grade_id(c) for c in release.cells]
    script = cell_by_id(graded, SCRIPT_CELL).source
    assert script.split("\n")[0] == "%%writefile train_digits_ddp.py"
    if student == "script_cell_as_kernel_code":
        assert course["scores"][student]["total"][0] == 0
        # The script it becomes runs in the sandbox, beside the recorder and the data only.
        assert "stopped with ModuleNotFoundError: No module named 'ddp_checks'" in \
            feedback_text(course, student)
    else:
        assert_only_failing(course, student, VARIANTS[student][1])
    assert "Dropped 1 cell(s) that are not part of the assignment" in course["autograde_log"]


def test_a_test_cell_tagged_to_be_skipped_still_runs(course):
    graded = graded_notebook(course, "checkpoint_every_rank")
    skipped = cell_by_id(graded, SKIPPED_TEST)
    assert "tags" not in skipped.metadata
    assert any(output.output_type == "error" for output in skipped.outputs)


def test_files_submitted_beside_the_notebook_are_not_graded(course):
    graded = course["path"] / "autograded" / "drop_last" / ASSIGNMENT
    assert not (graded / "torch").exists()
    assert "Removed torch: only the notebook of a submission is graded" in \
        course["autograde_log"]
    assert course["scores"]["drop_last"]["total"][0] == MAX_SCORE


def test_edited_test_cell_is_restored_and_flagged(course):
    graded = graded_notebook(course, "no_set_epoch")
    source = nbformat.read(ASSESSMENT / "source" / ASSIGNMENT / NOTEBOOK, as_version=4)
    assert cell_by_id(graded, EDITED_TEST).source == cell_by_id(source, EDITED_TEST).source
    assert course["scores"]["no_set_epoch"]["cells"][EDITED_TEST][0] == 0
    log = course["autograde_log"]
    assert f"Attribute 'checksum' for cell {EDITED_TEST} has changed" in log
    flagged = [line for line in log.splitlines() if "edited locked cell" in line]
    assert flagged == [f"no_set_epoch: edited locked cell {EDITED_TEST!r} in {NOTEBOOK} "
                       f"(put back to the original before grading)"]


def test_never_finishing_submission_is_stopped_and_graded(course):
    assert course["scores"]["never_finishes"]["total"][0] == 0
    # One launch stopped at its limit; the learner's waiting cell never ran.
    assert course["hang_s"] < HANG_LAUNCH_LIMIT_S + 90
    feedback = feedback_text(course, "never_finishes")
    assert f"did not finish within {HANG_LAUNCH_LIMIT_S} s and was stopped" in feedback
    graded = graded_notebook(course, "never_finishes")
    assert not any(cell.source == WAITING_CELL for cell in graded.cells)
    # Nothing of the stopped job is left running.
    job = str(course["path"] / "autograded" / "never_finishes")
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            assert job not in cmdline.read_bytes().decode(errors="replace")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            pass


def test_grades_csv_matches_the_gradebook_with_a_pass_column(course):
    with open(course["path"] / "grades.csv") as f:
        rows = {row["student_id"]: row for row in csv.DictReader(f)}
    assert set(rows) == set(course["scores"])
    for student, result in course["scores"].items():
        row = rows[student]
        assert float(row["score"]) == result["total"][0]
        assert float(row["max_score"]) == MAX_SCORE
        for cell, (got, _) in result["cells"].items():
            assert float(row[cell]) == got
        lost = failing_cells(course, student)
        passed = (result["total"][0] >= 9 and not lost & {
            "runs_and_reaches_target_accuracy", "shards_disjoint_and_cover",
            "gradients_averaged_over_ranks"})
        assert row["passed"] == ("yes" if passed else "no"), student
    assert rows["solution"]["passed"] == "yes" and rows["no_sampler"]["passed"] == "no"
    assert rows["metrics_not_reduced"]["passed"] == "yes"  # 10 points, all three required
    assert f"{len(rows)} learners" in course["grades_log"]


def test_committed_release_is_generated_from_source(course):
    """release/ is what `make release` makes from source/: regenerate it after editing."""
    fresh = course["path"] / "release" / ASSIGNMENT
    committed = ASSESSMENT / "release" / ASSIGNMENT
    names = sorted(p.name for p in fresh.iterdir())
    assert names == sorted(p.name for p in committed.iterdir()
                           if p.name not in {"runs", "grading_run"}
                           and not p.name.startswith("train_digits"))
    for name in names:
        assert (fresh / name).read_bytes() == (committed / name).read_bytes(), name


def secrets():
    """Lines that exist only in the solution or hidden-test regions of source/."""
    source = nbformat.read(ASSESSMENT / "source" / ASSIGNMENT / NOTEBOOK, as_version=4)
    inside, outside = set(), set()
    for cell in source.cells:
        region = None
        for line in cell.source.split("\n"):
            if "### BEGIN" in line:
                region = line
            elif "### END" in line:
                region = None
            else:
                (inside if region else outside).add(line.strip())
    return {line for line in inside - outside if len(line) > 8}


def test_release_holds_nothing_of_the_solution_or_hidden_tests(course):
    hidden = secrets()
    assert any("seed=20240917" in line for line in hidden)  # the graded run's settings
    assert any("DistributedSampler(" in line for line in hidden)
    source = ASSESSMENT / "source" / ASSIGNMENT
    for release in (ASSESSMENT / "release", course["path"] / "release"):
        files = [p for p in release.rglob("*") if p.is_file()]
        assert {p.name for p in files} == {NOTEBOOK, *GRADING_FILES}
        for path in files:
            text = path.read_text()
            assert "BEGIN SOLUTION" not in text and "HIDDEN TESTS" not in text
            assert "20240917" not in text
            if path.suffix == ".ipynb":  # the cells' text, not its JSON escaping
                cells = nbformat.reads(text, as_version=4).cells
                lines = {line.strip() for c in cells for line in c.source.split("\n")}
                assert not hidden & lines, f"{path} holds {sorted(hidden & lines)}"
            else:  # the provided files, as they are in source/
                assert text == (source / path.name).read_text()
    assert not (ASSESSMENT / "release" / "gradebook.db").exists()


def test_assessment_notebooks_are_committed_without_outputs():
    for folder in ("source", "release"):
        notebook = ASSESSMENT / folder / ASSIGNMENT / NOTEBOOK
        cells = json.loads(notebook.read_text())["cells"]
        assert all(not c.get("outputs") and not c.get("execution_count")
                   for c in cells if c["cell_type"] == "code"), notebook
