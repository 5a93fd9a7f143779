"""The GPU check (``python -m workshop_lib.gpu_check [--smoke]``, ``make gpu-check``): its
CPU-runnable parts, here. The fast tests build reports and read failures from fabricated
outputs and exceptions; the slow ones run commands under their time limits, the smoke as
a learner's machine runs it, and a notebook through papermill."""
import ast
import dataclasses
import functools
import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

from conftest import REPO, run_course_command
from workshop_lib import labs, plans, profile
from workshop_lib.findings import keeping_accuracy_at_scale as nb03
from workshop_lib.gpu_check import (
    budget,
    environment,
    failures,
    full,
    library,
    notebook_parts,
    probes,
    process,
    report,
    smoke,
    steps,
)
from workshop_lib.gpu_check.__main__ import main
from workshop_lib.gpu_check.report import FAIL, PASS, SKIPPED, Outcome
from workshop_lib.inside_ddp import timing

TORCHRUN_FAILURE = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/repo/workshop_lib/equivalence.py", line 76, in compare
[rank0]: AttributeError: type object 'SyncBatchNorm' has no attribute 'revert_sync_batchnorm'
E1201 12:00:00.000000 1234 torch/distributed/elastic/multiprocessing/api.py:882] failed
Traceback (most recent call last):
  File "/usr/lib/python3.12/runpy.py", line 198, in _run_module_as_main
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
workshop_lib.equivalence FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 1234)
============================================================
"""


def context(tmp_path, cuda=False, deadline=None, rehearsal=False):
    return steps.Context(out=tmp_path, env=environment.command_env(no_gpu=rehearsal),
                         cuda=cuda, deadline=deadline, cwd=REPO, rehearsal=rehearsal)


def finished(tmp_path, returncode=0, timed_out=False, stdout="", stderr="", limit_s=60.0):
    return process.Finished(command=[sys.executable, "-m", "x"], returncode=returncode,
                            timed_out=timed_out, seconds=1.0, limit_s=limit_s, stdout=stdout,
                            stderr=stderr, stdout_path=tmp_path / "x.stdout",
                            stderr_path=tmp_path / "x.stderr")


# --- a failure's own line ---------------------------------------------------------------

def test_a_torchrun_failure_is_the_ranks_exception_not_the_launchers_wrapper():
    assert failures.error_line(TORCHRUN_FAILURE) == (
        "AttributeError: type object 'SyncBatchNorm' has no attribute 'revert_sync_batchnorm'")


@pytest.mark.parametrize("text, line", [
    ("loading\nerror: --batch-size must be a positive integer, got 0\n",
     "error: --batch-size must be a positive integer, got 0"),
    ("x\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n",
     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
    ("UserWarning: something\nlast words\n", "last words"),
    ("UserWarning: only a warning\n", "UserWarning: only a warning"),
    ("", None),
])
def test_the_error_line_is_the_error_else_the_last_line(text, line):
    assert failures.error_line(text) == line


def test_a_papermill_execution_error_gives_the_cells_ename_and_evalue():
    from papermill.exceptions import PapermillExecutionError

    error = PapermillExecutionError(cell_index=7, exec_count=5, source="1 / 0",
                                    ename="ZeroDivisionError", evalue="division by zero",
                                    traceback=["\x1b[0;31mZeroDivisionError\x1b[0m: division"])
    failure = failures.describe_exception(error)
    assert failure.line == "ZeroDivisionError: division by zero"
    assert failure.where == "In [5]"
    assert failure.tail == ["ZeroDivisionError: division"]  # colours stripped


def test_a_called_process_error_gives_its_commands_own_error_not_the_exit_status():
    error = subprocess.CalledProcessError(
        1, ["torchrun", "my_train_ddp.py"], output="epoch 1\n",
        stderr="Traceback (most recent call last):\nRuntimeError: Expected all tensors to be "
               "on the same device, but found at least two devices, cuda:0 and cpu!\n")
    failure = failures.describe_exception(error)
    assert failure.line == ("RuntimeError: Expected all tensors to be on the same device, but "
                            "found at least two devices, cuda:0 and cpu! (exited with status 1)")
    assert failure.where == "torchrun my_train_ddp.py"
    silent = failures.describe_exception(subprocess.CalledProcessError(3, "x", output=b""))
    assert silent.line == "the command exited with status 3, with no output"


def executed_notebook(*cells):
    """An executed notebook as papermill writes it: an error banner first, then cells."""
    banner = {"cell_type": "markdown", "source": "An Exception was encountered", "metadata": {}}
    return {"cells": [banner, *cells]}


def code_cell(source, outputs=(), count=None, status="completed"):
    return {"cell_type": "code", "source": source, "execution_count": count,
            "outputs": list(outputs), "metadata": {"papermill": {"status": status}}}


def stream(name, text):
    return {"output_type": "stream", "name": name, "text": text}


def test_a_failed_bash_cell_is_reported_with_what_it_wrote_to_stderr():
    from papermill.exceptions import PapermillExecutionError

    bash = code_cell("%%bash\ntorchrun --nproc-per-node=$NPROC my_train_ddp.py --epochs 3\n",
                     [stream("stdout", "epoch 1 ...\n"),
                      stream("stderr", "Traceback (most recent call last):\n[rank1]: "
                                       "RuntimeError: stack expects each tensor to be equal "
                                       "size\nChildFailedError:\n"),
                      {"output_type": "error", "ename": "CalledProcessError",
                       "evalue": "Command 'b'torchrun ...'' returned non-zero exit status 1.",
                       "traceback": []}], count=6, status="failed")
    notebook = executed_notebook(code_cell("print(1)", count=5), bash)
    error = PapermillExecutionError(cell_index=9, exec_count=6, source=bash["source"],
                                    ename="CalledProcessError",
                                    evalue="Command 'b'torchrun ...'' returned non-zero exit "
                                           "status 1.", traceback=[])
    failure = failures.notebook_failure(notebook, failures.exception_info(error))
    assert failure.line == ("RuntimeError: stack expects each tensor to be equal size "
                            "(%%bash cell exited with status 1)")
    assert failure.where == "In [6]: %%bash torchrun --nproc-per-node=$NPROC my_train_ddp.py " \
                            "--epochs 3"
    assert failure.tail[-1] == "ChildFailedError:"


def test_a_bash_cell_that_prints_its_logs_tail_on_stdout_is_read_from_stdout():
    bash = code_cell("%%bash\ntorchrun ... > log 2>&1 || { tail -n 30 log; exit 1; }",
                     [stream("stdout", "AssertionError: ranks disagree\n"),
                      {"output_type": "error", "ename": "CalledProcessError",
                       "evalue": "returned non-zero exit status 1.", "traceback": []}], count=3)
    failure = failures.notebook_failure(executed_notebook(bash))
    assert failure.line == "AssertionError: ranks disagree (%%bash cell exited with status 1)"


def test_a_python_cells_error_and_a_hung_cell_are_named():
    raised = code_cell("findings.batchnorm(result)", [{
        "output_type": "error", "ename": "KeyError", "evalue": "'sync_batchnorm'",
        "traceback": ["\x1b[31mKeyError\x1b[0m: 'sync_batchnorm'"]}], count=12)
    failure = failures.notebook_failure(executed_notebook(raised))
    assert (failure.line, failure.where) == ("KeyError: 'sync_batchnorm'",
                                             "In [12]: findings.batchnorm(result)")
    assert failure.tail == ["KeyError: 'sync_batchnorm'"]
    hung = executed_notebook(code_cell("print(1)", count=1),
                             code_cell("job.wait()", status="running"))
    failure = failures.notebook_failure(hung, None, timed_out_s=900)
    assert failure.line == "timed out after 900 s (the step's limit) in this cell"
    assert failure.where == "cell 2: job.wait()"


def test_papermills_own_cell_timeout_is_the_cause_not_the_interrupt_it_caused():
    class CellTimeoutError(TimeoutError):  # nbclient's, as papermill lets it through
        pass

    interrupted = code_cell("time.sleep(600)", [{
        "output_type": "error", "ename": "KeyboardInterrupt", "evalue": "", "traceback": []}],
        count=3)
    info = failures.exception_info(CellTimeoutError(
        "A cell timed out while it was being executed, after 585 seconds.\n"
        "-------------------\n['time.sleep(600)']"))
    failure = failures.notebook_failure(executed_notebook(interrupted), info)
    assert failure.line == ("CellTimeoutError: A cell timed out while it was being executed, "
                            "after 585 seconds.")
    assert failure.where == "In [3]: time.sleep(600)"


# --- outcomes and the report ---------------------------------------------------------------

def test_a_commands_outcome_says_timeout_exit_or_problem_in_its_own_words(tmp_path):
    ctx = context(tmp_path)
    timed_out = steps.from_process("s", finished(tmp_path, None, True, stdout="step 3\n",
                                                 limit_s=5), ctx)
    assert timed_out.status == FAIL
    assert timed_out.reason == "timed out after 5 s (its limit), stopped; its last line: step 3"
    crashed = steps.from_process("s", finished(tmp_path, 1, stderr=TORCHRUN_FAILURE), ctx)
    assert crashed.reason.startswith("AttributeError: type object 'SyncBatchNorm'")
    assert crashed.where.endswith("(exit status 1)") and crashed.tail
    judged = steps.from_process("s", finished(tmp_path, 0), ctx,
                                lambda f: (["val_acc 0.5"], {}, "val_acc 0.5 is below 0.85"))
    assert (judged.status, judged.reason, judged.figures) == (FAIL, "val_acc 0.5 is below 0.85",
                                                              ["val_acc 0.5"])

    def unreadable(f):
        raise FileNotFoundError("summary.json")

    # A reader that fails on a failed command does not replace the command's own error.
    assert steps.from_process("s", finished(tmp_path, 1, stderr="ValueError: bad\n"), ctx,
                              unreadable).reason == "ValueError: bad"
    assert steps.from_process("s", finished(tmp_path, 0), ctx, unreadable).reason == \
        "FileNotFoundError: summary.json"
    assert steps.from_process("s", finished(tmp_path, 0), ctx).status == PASS


def test_steps_skip_without_cuda_and_a_step_that_raises_fails_alone(tmp_path):
    ran = []

    def broken(ctx, limit):
        raise KeyError("max_abs_difference")

    def fine(ctx, limit):
        ran.append(limit)
        return Outcome("fine", PASS, figures=["ok"])

    outcomes = steps.run_steps(context(tmp_path), [
        steps.Step("gpu", "needs a GPU", 60, fine),
        steps.Step("broken", "raises", 60, broken, needs_cuda=False),
        steps.Step("fine", "runs", 30, fine, needs_cuda=False),
        steps.Step("no pytest", "skips itself", 30, fine, needs_cuda=False,
                   skip=lambda ctx: "pytest is not installed here"),
    ], say=lambda line: None)
    assert [(o.name, o.status, o.reason) for o in outcomes] == [
        ("gpu", SKIPPED, steps.NEEDS_CUDA), ("broken", FAIL, "KeyError: 'max_abs_difference'"),
        ("fine", PASS, ""), ("no pytest", SKIPPED, "pytest is not installed here")]
    assert ran == [30] and outcomes[1].tail[-1] == "KeyError: 'max_abs_difference'"


def test_a_step_that_returns_nothing_fails_alone_and_the_next_step_runs(tmp_path):
    def forgot(context, limit):
        context.folder("forgot")  # did its work, then forgot the return

    def fine(context, limit):
        return Outcome("fine", PASS)

    outcomes = steps.run_steps(context(tmp_path), [
        steps.Step("forgot", "", 60, forgot, needs_cuda=False),
        steps.Step("fine", "", 60, fine, needs_cuda=False)], say=lambda line: None)
    assert [o.status for o in outcomes] == [FAIL, PASS]
    assert "returned None, not an Outcome" in outcomes[0].reason


def test_a_cpu_rehearsal_runs_the_steps_that_can_on_the_cpu_and_names_the_others(tmp_path):
    devices = []

    def run(ctx, limit):
        devices.append(ctx.device)
        return Outcome("x", PASS)

    outcomes = steps.run_steps(context(tmp_path, rehearsal=True), [
        steps.Step("on the cpu too", "", 60, run, rehearses=True),
        steps.Step("gpu only", "", 60, run),
        steps.Step("no gpu needed", "", 60, run, needs_cuda=False),
    ], say=lambda line: None)
    assert [(o.status, o.reason) for o in outcomes] == [
        (PASS, ""), (SKIPPED, steps.NOT_REHEARSED), (PASS, "")]
    assert devices == ["cpu", "cpu"]
    # The CPU gets more time for a GPU step's work; a step that needs no GPU keeps its own.
    assert [o.limit_s for o in outcomes] == [60 * steps.REHEARSAL_SLOWER, 60, 60]
    assert context(tmp_path, rehearsal=True).env["CUDA_VISIBLE_DEVICES"] == ""
    # Not a rehearsal: the same steps skip without CUDA, saying so.
    outcomes = steps.run_steps(context(tmp_path), [steps.Step("x", "", 60, run, rehearses=True)],
                               say=lambda line: None)
    assert (outcomes[0].status, outcomes[0].reason) == (SKIPPED, steps.NEEDS_CUDA)


def test_no_step_starts_after_the_deadline(tmp_path):
    import time

    outcomes = steps.run_steps(context(tmp_path, deadline=time.monotonic() - 1), [
        steps.Step("late", "", 60, lambda c, limit: Outcome("late", PASS), needs_cuda=False)],
        say=lambda line: None)
    assert outcomes[0].status == SKIPPED and "deadline" in outcomes[0].reason


def test_the_report_shows_each_step_its_failure_and_its_budget(tmp_path):
    outcomes = [
        Outcome("doctor", PASS, seconds=3.2, limit_s=60, figures=["torch 2.11"]),
        Outcome("equivalence", FAIL, "AttributeError: no revert_sync_batchnorm", 12.0, 120,
                where="python -m torch.distributed.run ...", tail=["Traceback", "AttributeError"],
                logs=["logs/equivalence.stderr"]),
        Outcome("bf16 run", SKIPPED, steps.NEEDS_CUDA, limit_s=90, budget_s=30.0),
    ]
    built = report.build("GPU smoke check", ["torch 2.11"], outcomes, 15.2, notes=["n"],
                         totals=["The smoke took 15 s"])
    text = report.write(tmp_path, built)
    assert not built["ok"] and built["counts"] == {"pass": 1, "fail": 1, "skipped": 1}
    assert json.loads((tmp_path / "report.json").read_text()) == built
    assert (tmp_path / "report.md").read_text() == text
    assert "| step | result | seconds | limit s | budget s |" in text
    assert "| equivalence | FAIL: AttributeError: no revert_sync_batchnorm | 12.0 | 120 |  |" \
        in text
    assert f"| bf16 run | skipped: {steps.NEEDS_CUDA} | 0.0 | 90 | 30 |" in text
    failures_part = text.split("## Failures")[1]
    assert "```\nTraceback\nAttributeError\n```" in failures_part and "doctor" not in \
        failures_part
    assert report.build("t", [], outcomes[::2], 1)["ok"]  # skipped is not failed


def test_the_budget_has_an_estimate_and_a_basis_for_every_notebook():
    names = {p.stem for p in (REPO / "notebooks").glob("[0-9]*.ipynb")}
    assert set(budget.NOTEBOOKS) == names
    for estimate in [*budget.NOTEBOOKS.values(), budget.GPU_TESTS, budget.BENCH]:
        assert estimate.seconds > 0 and estimate.basis
        assert full.cell_limit(estimate.limit_s) < estimate.limit_s  # papermill's goes first
    lines = budget.verdict_lines()
    assert "priced with one GPU's measured start, epoch and per-run figures" in lines[0]
    training = sum(e.training_s for e in budget.NOTEBOOKS.values())
    # The module's docstring: training is about a quarter, and the target is the estimate.
    assert 0.1 < training / budget.notebook_total() < 0.4
    assert budget.notebook_total() <= budget.TARGET_S, lines
    assert len(lines) == 1  # met: nothing to weigh
    over = budget.verdict_lines({"00_welcome": 900.0, "03_keeping_accuracy_at_scale": 1000.0})
    assert "measured here: 31.7 min for 2 notebook(s)" in over[1] and "NOT met, by 6.7" in over[1]
    assert over[-1].startswith("Heaviest: 03_keeping_accuracy_at_scale 16.7 min")


def test_each_notebook_fits_its_sessions_gpu_minutes_on_the_day():
    """The budget's estimate of each notebook on 4 A100-class GPUs within the minutes the
    day gives its runs on GPUs (day.SESSIONS): a notebook that grows past them fails here."""
    from workshop_lib import day

    slots = {Path(s.notebook).stem: s.budget.gpu_run for s in day.SESSIONS
             if s.budget and s.notebook.startswith("notebooks/")}
    assert slots, "the day gives its sessions' GPU minutes"
    for name, minutes in slots.items():
        estimate = budget.NOTEBOOKS[name]
        assert estimate.seconds <= 60 * minutes, (
            f"{name}: {estimate.seconds / 60:.1f} min estimated on 4 GPUs, its session gives "
            f"its runs {minutes} min ({estimate.basis})")


# --- the budget, fresh for every notebook -------------------------------------------------
# The budget prices each notebook's plan (workshop_lib.plans) under the GPU profile of 4
# A100s. These tests hold every plan to its notebook's cells, so that a cell that starts a
# process, or a sweep given a run, changes the estimate or fails here naming the notebook.

# The exercises whose check starts processes (a job under torchrun, a sweep), and those
# whose check reads an answer or trains in the kernel: a new exercise is one or the other.
LAUNCHING_CHECKS = ("conversion", "from_scratch", "challenge", "debugging", "eval_debugging",
                    "overlap", "buckets", "zero1")
CHECKS_IN_THE_KERNEL = ("welcome", "sgd", "sampler", "stuck_ranks", "eval_stuck",
                        "fit_in_memory", "knee", "sbatch_header", "self_check")
PYTHON_LAUNCH = re.compile(r"\b(?:launch|nodes)\.(?:run|start)\(|\blabs\.check\(\"("
                           + "|".join(LAUNCHING_CHECKS) + r")\"|^\s*!.*\b(?:torchrun|"
                           r"python -m workshop_lib\.)", re.MULTILINE)
BASH_LAUNCH = re.compile(r"^\s*(?:torchrun|python -m workshop_lib\.)")
# The challenge's check trains the answer (the reference: one run) on each of the
# square-root run's seeds, in one sweep.
RUNS_PER_CHECK = {"challenge": len(labs.solution("challenge")) * len(nb03.SPREAD_SEEDS)}
# A dry run of a %%bash cell: each launch prints the runs it would train (its --variant
# flags, loops expanded by bash itself) instead of starting, on a descriptor of its own
# (the cell may send the command's output to a file).
DRY_RUN = """\
exec 3>&1
launched() { local runs=0 word
             for word in "$@"; do [ "$word" = --variant ] && runs=$((runs + 1)); done
             echo "LAUNCH $(( runs > 0 ? runs : 1 ))" >&3; }
torchrun() { launched "$@"; }
python() { launched "$@"; }
"""


def notebook_cells(notebook):
    return json.loads((REPO / "notebooks" / f"{notebook}.ipynb").read_text())["cells"]


def bash_environment(notebook, one, ddp, plan, tmp_path):
    """The variables a notebook's %%bash cells read, as its setup and exports give them
    under the budget's profile (only the loops' bounds and the guards' NPROC matter)."""
    used = ddp if "launches=\"processes\"" in "".join(
        "".join(c["source"]) for c in notebook_cells(notebook)) else one
    env = {"PATH": os.environ["PATH"], "RUNS": str(tmp_path), "DEVICE": used.device,
           "NPROC": str(used.nproc), "DDP_DEVICE": used.ddp_device,
           "BATCH_SIZE": str(used.batch_size)}
    if notebook == "01_sgd_and_batch_size":
        env["LARGEST"] = str(plan.largest)
    if notebook == "02_from_one_gpu_to_many":
        env["SEEDS"] = str(budget.parameters(notebook)["seeds"])
    return env


def launch_sites(notebook, env):
    """[(cell number, runs)] of every process a notebook's code cells start, in order."""
    sites = []
    for number, cell in enumerate(notebook_cells(notebook)):
        source = "".join(cell["source"])
        if cell["cell_type"] != "code":
            continue
        if source.startswith("%%bash"):
            body = source.split("\n", 1)[1]
            if not any(BASH_LAUNCH.match(line) for line in body.replace("\\\n", " ").splitlines()):
                continue
            done = subprocess.run(["bash", "-c", DRY_RUN + body], env=env, capture_output=True,
                                  text=True, timeout=30)
            assert done.returncode == 0, f"{notebook}: cell {number}'s dry run: {done.stderr}"
            sites += [(number, int(line.split()[1])) for line in done.stdout.splitlines()
                      if line.startswith("LAUNCH ")]
        elif not source.startswith("%%"):
            sites += [(number, RUNS_PER_CHECK.get(match[1], 1))
                      for match in PYTHON_LAUNCH.finditer(source)]
    return sites


def test_every_notebooks_plan_starts_what_its_cells_start(tmp_path):
    """Each notebook's cells start the processes its plan lists (what the budget prices), in
    the same order, each sweep with as many runs: one line names the notebook that differs."""
    one, ddp = budget.gpu_profiles()
    planned = plans.every_notebook(one, ddp, budget.parameters)
    for path in sorted((REPO / "notebooks").glob("[0-9]*.ipynb")):
        notebook = path.stem
        if notebook not in planned:  # a notebook without a plan starts nothing
            assert launch_sites(notebook, dict(os.environ)) == [], (
                f"{notebook} starts processes but has no plan in workshop_lib/plans.py: the "
                f"GPU budget cannot price it")
            continue
        _, plan = planned[notebook]
        launches = [launch for launch in plans.launches_of(plan) if not launch.in_kernel]
        sites = launch_sites(notebook, bash_environment(notebook, one, ddp, plan, tmp_path))
        assert len(sites) == len(launches), (
            f"{notebook}: its cells {[cell for cell, _ in sites]} start {len(sites)} "
            f"processes, its plan lists {len(launches)} ({', '.join(x.name for x in launches)})"
            f": make workshop_lib/plans.py say what the notebook starts")
        for (cell, runs), launch in zip(sites, launches, strict=True):
            assert runs == launch.runs, (
                f"{notebook}: cell {cell} trains {runs} run(s), its plan's {launch.name} "
                f"{launch.runs}: make workshop_lib/plans.py say what the notebook trains")


def test_every_exercise_check_is_known_to_start_processes_or_not():
    """The freshness test counts the checks that start processes: each check a notebook
    calls is classified, so that a new one cannot start jobs unpriced."""
    for path in sorted((REPO / "notebooks").glob("[0-9]*.ipynb")):
        text = "".join("".join(c["source"]) for c in notebook_cells(path.stem))
        for key in re.findall(r"\blabs\.check\(\"(\w+)\"", text):
            assert key in LAUNCHING_CHECKS + CHECKS_IN_THE_KERNEL, (
                f"{path.stem}: labs.check({key!r}) is new to the GPU budget: add it to "
                f"LAUNCHING_CHECKS (and its job to the notebook's plan) or to "
                f"CHECKS_IN_THE_KERNEL in tests/test_gpu_check.py")


def test_a_notebook_that_starts_one_more_process_fails_the_freshness_test(tmp_path,
                                                                           monkeypatch):
    """The probes: a plan that lost a launch or a sweep's run, a notebook cell that starts
    one more job or gives a sweep one more variant: each fails, naming the notebook."""
    real = plans.every_notebook

    def dropped(one, ddp, parameters, change):
        chosen = real(one, ddp, parameters)
        change(chosen)
        return chosen

    def drop_a_launch(chosen):
        chosen["04_when_things_go_wrong"][1].launches.pop()

    def drop_a_run(chosen):
        launches = chosen["03_keeping_accuracy_at_scale"][1].launches
        launches[1] = dataclasses.replace(launches[1], runs=launches[1].runs - 1)

    for change, words in ((drop_a_launch, "04_when_things_go_wrong: its cells"),
                          (drop_a_run, f"03_keeping_accuracy_at_scale: cell 13 trains "
                                       f"{plans.HOT_LR_RUNS} run(s), its plan's hot_lr "
                                       f"{plans.HOT_LR_RUNS - 1}")):
        monkeypatch.setattr(plans, "every_notebook", functools.partial(dropped, change=change))
        with pytest.raises(AssertionError, match=re.escape(words)):
            test_every_notebooks_plan_starts_what_its_cells_start(tmp_path)
    monkeypatch.setattr(plans, "every_notebook", real)

    # A cell that starts one more job, and a sweep cell given one more variant.
    def edited(notebook, read=notebook_cells):
        cells = read(notebook)
        if notebook == "06_beyond_one_machine":
            cells.append({"cell_type": "code", "source": ["again = launch.run(demo)\n"]})
        if notebook == "05_worked_example":
            (cell,) = [c for c in cells if "--out $RUNS/precision" in "".join(c["source"])]
            cell["source"] = ["".join(cell["source"]).replace(
                '--variant fp32="--amp off"', '--variant fp32="--amp off" --variant again=""')]
        return cells

    monkeypatch.setattr(sys.modules[__name__], "notebook_cells", edited)
    with pytest.raises(AssertionError, match="05_worked_example: cell 6 trains 4 run"):
        test_every_notebooks_plan_starts_what_its_cells_start(tmp_path)
    monkeypatch.setattr(plans, "PRECISION_RUNS", 4)  # the plan follows: the next one fails
    with pytest.raises(AssertionError, match=r"06_beyond_one_machine: its cells .* start 9 "
                                             r"processes, its plan lists 8"):
        test_every_notebooks_plan_starts_what_its_cells_start(tmp_path)


def test_the_budget_prices_every_plans_runs_and_waits():
    """The estimate moves with the plan: one more run in a sweep's last wave costs a wave,
    a DDP run's epochs divide over its ranks, a hang costs its timeout."""
    sweep = plans.Launch("s", "cuda", runs=budget.GPUS, epochs=4)
    full_wave, _, _ = budget.price(sweep)
    one_more, trained, said = budget.price(dataclasses.replace(sweep, runs=budget.GPUS + 1))
    # A second wave: its epochs and its runs' set-up.
    assert one_more - full_wave == 4 * budget.EPOCH_S + budget.SWEEP_RUN_S
    assert "2 wave(s)" in said and trained == 2 * 4 * budget.EPOCH_S
    ddp, _, _ = budget.price(plans.Launch("d", "cuda", 4, backend="nccl", runs=2, epochs=6))
    assert ddp == budget.LAUNCH_S + 2 * 6 * budget.DDP_EPOCH_S / 4
    hang, _, _ = budget.price(plans.Launch("hang", "cuda", 4, backend="nccl", epochs=3))
    assert hang == budget.LAUNCH_S + 3 * budget.DDP_EPOCH_S / 4 + budget.HANG_TIMEOUT_S
    assert set(budget.WAITS_S) <= {launch.name for _, plan in plans.every_notebook(
        *budget.gpu_profiles(), budget.parameters).values()
        for launch in plans.launches_of(plan)}  # every wait belongs to a launch
    assert set(budget.IN_KERNEL_S) | set(budget.PRICED_IN_KERNEL_S) <= {
        launch.name for _, plan in plans.every_notebook(
        *budget.gpu_profiles(), budget.parameters).values()
        for launch in plans.launches_of(plan) if launch.in_kernel}  # and every measured figure
    for notebook, (_, plan) in plans.every_notebook(*budget.gpu_profiles(),
                                                   budget.parameters).items():
        assert budget.NOTEBOOKS[notebook] == budget.estimate(plans.launches_of(plan))


def test_the_waits_the_budget_prices_are_the_notebooks_own():
    """The timeouts the budget counts are those the notebooks wait out: 04's hang, 06's
    uneven hang and its elastic job's; 04's debugging jobs wait out none of theirs."""
    def text(notebook):
        return "\n".join("".join(c["source"]) for c in notebook_cells(notebook))

    failures_text, beyond_text = text("04_when_things_go_wrong"), text("06_beyond_one_machine")
    assert f"hang_timeout_s = {budget.HANG_TIMEOUT_S}\n" in failures_text
    assert failures_text.count(f'"--dist-timeout", "{budget.DEBUG_TIMEOUT_S}"') == 3
    # Of those three, the mismatch runs under DETAIL, which names it before any timeout,
    # and the two stuck jobs are stopped once their stacks are dumped.
    assert not {"debug_job", "detail_mismatch", "debug_eval_job"} & set(budget.WAITS_S)
    for started in ('job = launch.start([str(buggy)', 'job = launch.start([str(eval_job)'):
        cell = failures_text[failures_text.index(started):].split("\n\n")[0]
        assert re.search(r"job\.dump_stacks\(\)[^\n]*\njob\.stop\(\)", cell), cell
    mismatch_cell = failures_text[failures_text.index("launch.run([str(mismatch)"):]
    assert '"TORCH_DISTRIBUTED_DEBUG": "DETAIL"' in mismatch_cell.split("timeout=120")[0]
    assert f"TIMEOUT_S = {budget.UNEVEN_TIMEOUT_S}\n" in beyond_text
    assert f"ELASTIC_TIMEOUT_S = {budget.ELASTIC_TIMEOUT_S} " in beyond_text
    assert f'"last_call_timeout": {budget.ELASTIC_LAST_CALL_S}}}' in beyond_text


# --- what the smoke runs with -------------------------------------------------------------

def test_the_standin_digits_have_the_real_ones_shape_and_range():
    path = environment.STANDINS / "sklearn" / "datasets" / "__init__.py"
    spec = importlib.util.spec_from_file_location("standin_datasets", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    digits, again = module.load_digits(), module.load_digits()
    images, target = torch.tensor(digits.images), torch.tensor(digits.target)
    assert images.shape == (1797, 8, 8) and target.shape == (1797,)
    assert images.min() == 0 and images.max() == 16 and torch.equal(images, images.round())
    assert torch.bincount(target).tolist() == [180] * 7 + [179] * 3  # 1,797 dealt 0..9
    assert torch.equal(images, torch.tensor(again.images))  # the same on every rank


def test_standins_go_first_on_the_path_and_only_the_missing_ones(tmp_path):
    folder = environment.install_standins(["tqdm"], tmp_path / "standins")
    assert sorted(p.name for p in folder.iterdir()) == ["tqdm"]
    env = environment.command_env(folder, one_gpu=True)
    assert env["PYTHONPATH"].split(os.pathsep)[:2] == [str(folder), str(REPO)]
    assert env["CUDA_VISIBLE_DEVICES"] == environment.first_gpu()
    assert environment.install_standins([], tmp_path / "none") is None
    assert environment.missing_replaceable(force=True) == ["sklearn", "tqdm"]


def module_level_imports(path):
    """The modules a file imports at module level (in ``try``/``if`` blocks too)."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in tree.body:
        for inner in ast.walk(node) if isinstance(node, ast.Try | ast.If) else [node]:
            if isinstance(inner, ast.Import):
                found |= {alias.name for alias in inner.names}
            elif isinstance(inner, ast.ImportFrom) and inner.level == 0:
                found.add(inner.module)
                found |= {f"{inner.module}.{alias.name}" for alias in inner.names}
    return found


def third_party_imports(module):
    """Packages outside the standard library that importing ``module`` (a workshop_lib
    module) imports at module level, following workshop_lib's own imports."""
    seen, outside, todo = set(), set(), [module]
    while todo:
        name = todo.pop()
        parts = name.split(".")
        base = REPO.joinpath(*parts)
        path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        if name in seen or not path.is_file():
            continue
        seen.add(name)
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # parent packages
        for imported in module_level_imports(path):
            top = imported.split(".")[0]
            if top == "workshop_lib":
                todo.append(imported)
            elif top not in sys.stdlib_module_names:
                outside.add(top)
    return outside


def test_the_check_imports_nothing_but_the_standard_library_and_torch():
    """A bare GPU image holds torch alone: the check must start there."""
    for path in (REPO / "workshop_lib" / "gpu_check").glob("*.py"):
        module = f"workshop_lib.gpu_check.{path.stem}".removesuffix(".__init__")
        assert third_party_imports(module) <= {"torch"}, module


def test_the_steps_read_their_results_with_the_standard_library_and_torch():
    """A step reads its command's results in the check's own process, which has no
    stand-ins: whatever a step imports where it reads needs torch alone (the first
    rehearsal under torch 2.11 alone failed on 07's findings, which import tqdm)."""
    from workshop_lib.findings import inside_ddp

    for name in ("smoke", "notebook_parts", "full", "steps", "report"):
        tree = ast.parse((REPO / "workshop_lib" / "gpu_check" / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module.startswith("workshop_lib"):
                for alias in node.names:
                    module = f"{node.module}.{alias.name}"
                    imported = module if importlib.util.find_spec(node.module) and (
                        REPO / Path(*module.split("."))).with_suffix(".py").exists() \
                        else node.module
                    assert third_party_imports(imported) <= {"torch"}, (name, imported)
    assert library.SAME_PARAMETERS == inside_ddp.SAME_PARAMETERS
    gpu = profile.SIZES[("cuda", "fashion-mnist")]
    assert (library.GPU_MODEL, library.GPU_BATCH) == (gpu.model, gpu.batch_size)


@pytest.mark.parametrize("module", ["workshop_lib.train", "workshop_lib.equivalence",
                                    "workshop_lib.trace.__main__", "workshop_lib.doctor",
                                    "workshop_lib.labs.conversion_data", "workshop_lib.memory",
                                    "workshop_lib.models", "workshop_lib.checkpoint",
                                    "workshop_lib.runlog", "workshop_lib.throughput",
                                    "workshop_lib.launch", "workshop_lib.train_ddp",
                                    "workshop_lib.inside_ddp.experiments",
                                    "workshop_lib.findings.inside_ddp",
                                    "workshop_lib.bench.__main__"])
def test_what_the_smokes_gpu_steps_run_needs_only_torch_and_the_standins(module):
    """Each module a smoke step runs imports, at module level, only the standard library,
    torch, and packages the smoke has a stand-in for (scikit-learn's digits, tqdm)."""
    allowed = {"torch", *environment.REPLACEABLE.values()}
    assert third_party_imports(module) <= allowed, (
        f"{module} needs {sorted(third_party_imports(module) - allowed)} at import: a bare GPU "
        f"image lacks it; import it where it is used, or give the smoke a stand-in")


def test_every_library_call_of_the_smoke_names_an_existing_entry_point():
    import inspect

    from workshop_lib import memory

    assert library.CONVERSION_SOLUTION.is_file()
    assert "cap" in inspect.signature(memory.largest_batch).parameters
    for command in (library.equivalence("e.json"), library.trace("t"), library.train("o"),
                    library.doctor(), library.bench_quick("b.json", True),
                    library.inside_ddp("i.json")[4:]):  # after torchrun's own arguments
        target = command[1] if command[0] == "-m" else command[0]
        assert importlib.util.find_spec(target) is not None, target
    assert library.trace_step_prefix()


class ScriptedContext(steps.Context):
    """A context whose commands do not run: each returns the output it is given."""

    def __init__(self, out, **outputs):
        super().__init__(out=out, env={}, cuda=True, cwd=REPO)
        self.outputs, self.commands = outputs, []

    def command(self, name, args, limit_s, cwd=None):
        self.commands.append((args, limit_s, cwd))
        return finished(self.out, **self.outputs)


def test_the_fp16_step_fails_on_the_lr_scheduler_warning_and_counts_skipped_steps(
        tmp_path, monkeypatch):
    monkeypatch.setattr(library, "final_record", lambda out: {
        "epoch": 4, "val_acc": 0.97, "peak_memory_mib": 12.5, "saved_activation_bytes": 2**20})
    monkeypatch.setattr(library, "grad_scaler_scale", lambda out: 2.0 ** 13)
    warning = ("/torch/optim/lr_scheduler.py:200: UserWarning: Detected call of "
               "`lr_scheduler.step()` before `optimizer.step()`. In PyTorch 1.1.0 and later, ...")
    run = smoke.training_run("fp16 run", "run-fp16", ["--amp", "fp16"], check_stderr=True)
    ctx = ScriptedContext(tmp_path, stderr=warning + "\n")
    outcome = run(ctx, 90)
    assert outcome.status == FAIL and outcome.reason.startswith(
        "stderr holds PyTorch's warning: /torch/optim/lr_scheduler.py:200: UserWarning")
    args = ctx.commands[0][0]
    assert args[:2] == ["-m", "workshop_lib.train"] and args[args.index("--amp") + 1] == "fp16"
    assert any("at least 3 step(s) skipped for overflow" in f for f in outcome.figures)
    clean = run(ScriptedContext(tmp_path, stderr=""), 90)
    assert clean.status == PASS and "lr_scheduler warning on stderr: none" in clean.figures
    assert clean.values["grad_scaler_scale"] == 2.0 ** 13


def test_a_notebook_runs_with_solutions_absolute_runs_and_a_cell_limit(tmp_path):
    step = full.notebook_step(REPO / "notebooks" / "02_from_one_gpu_to_many.ipynb", "gpu")
    assert step.needs_cuda and step.budget_s == budget.NOTEBOOKS[step.name].seconds
    ctx = ScriptedContext(tmp_path, stdout="")
    assert step.run(ctx, step.limit_s).status == PASS
    [(args, limit, cwd)] = ctx.commands
    assert args[:2] == ["-m", "workshop_lib.gpu_check.run_notebook"] and limit == step.limit_s
    assert cwd == REPO / "notebooks"  # the notebooks' relative paths (../deploy) hold
    parameters = json.loads(args[args.index("--parameters") + 1])
    assert parameters == {"profile": "gpu", "solutions": True,
                          "runs_dir": str(tmp_path / "runs" / "02_from_one_gpu_to_many")}
    assert float(args[args.index("--cell-timeout") + 1]) < limit
    assert Path(args[3]) == tmp_path / "notebooks" / "02_from_one_gpu_to_many.ipynb"


def test_the_bench_step_reads_notebook_02s_run_on_several_gpus_else_runs_its_own(
        tmp_path, monkeypatch):
    """Notebook 02's bench cell runs the step's command on every GPU: where the notebook
    passed in this check, the step reads that run; else (one GPU, the notebook failed or
    its run is not on every GPU) it runs its own."""
    monkeypatch.setattr(full.torch.cuda, "device_count", lambda: 4)
    ran = tmp_path / "runs" / full.BENCH_NOTEBOOK / "bench.json"
    ran.parent.mkdir(parents=True)
    row = {"config": "course", "world_size": 4, "mode": "weak",
           "efficiency": {"median": 0.9}, "predicted_efficiency": 0.95}
    report = {"setup": {"device": "cuda", "world_size": 4}, "scaling": [row]}
    ran.write_text(json.dumps(report))
    ctx = ScriptedContext(tmp_path, stdout="")
    ctx.results[full.BENCH_NOTEBOOK] = Outcome(full.BENCH_NOTEBOOK, PASS)
    outcome = full.bench(ctx, 300)
    assert outcome.status == PASS and not ctx.commands
    assert outcome.figures == ["course step, 4 processes: weak-scaling efficiency 0.90 "
                               "(predicted 0.95)"]
    assert json.loads((tmp_path / "bench" / "bench.json").read_text()) == report
    for change in ({"status": FAIL}, {"world_size": 2}, {"gpus": 1}):
        ctx = ScriptedContext(tmp_path, stdout="")
        ctx.results[full.BENCH_NOTEBOOK] = Outcome(full.BENCH_NOTEBOOK,
                                                   change.get("status", PASS))
        ran.write_text(json.dumps({**report, "setup": {
            "device": "cuda", "world_size": change.get("world_size", 4)}}))
        gpus = change.get("gpus", 4)
        monkeypatch.setattr(full.torch.cuda, "device_count", lambda gpus=gpus: gpus)
        full.bench(ctx, 300)
        [(args, _, _)] = ctx.commands
        assert args[:3] == ["-m", "workshop_lib.bench", "--quick"], change


def test_the_equivalence_compares_in_full_float32_and_restores_tf32():
    """Wherever a verdict says "the same" (the equivalence, 07's compiled and FSDP runs):
    no TF32, cuDNN's deterministic algorithms without autotuning; the settings as they
    were afterwards."""
    from workshop_lib import equivalence
    from workshop_lib.inside_ddp import compiled, fsdp

    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = matmul.allow_tf32, cudnn.allow_tf32, cudnn.deterministic, cudnn.benchmark
    seen = []

    def settings(*args, **kwargs):
        seen.append((matmul.allow_tf32, cudnn.allow_tf32, cudnn.deterministic,
                     cudnn.benchmark))

    try:
        matmul.allow_tf32 = cudnn.allow_tf32 = cudnn.benchmark = True
        cudnn.deterministic = False
        with equivalence.full_float32():
            settings()
        class Stop(Exception):
            pass

        def load(*args, **kwargs):  # the comparisons' first step: the settings it runs with
            settings()
            raise Stop

        for module in (compiled, fsdp):  # their comparisons run under it too
            real = module.data
            module.data = types.SimpleNamespace(load=load)
            try:
                with pytest.raises(Stop):
                    module.compare(0, 1, torch.device("cpu"))
            finally:
                module.data = real
        assert (matmul.allow_tf32, cudnn.allow_tf32, cudnn.deterministic,
                cudnn.benchmark) == (True, True, False, True)
    finally:
        matmul.allow_tf32, cudnn.allow_tf32, cudnn.deterministic, cudnn.benchmark = saved
    assert seen == [(False, False, True, False)] * 3, seen


def test_a_relative_out_becomes_absolute_before_anything_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(smoke, "steps", lambda: [])
    assert main(["--smoke", "--cpu-rehearsal", "--out", "relative"]) == 0
    built = json.loads((tmp_path / "relative" / "report.json").read_text())
    assert built["steps"] == [] and built["ok"]


def test_the_largest_batch_says_when_it_is_the_searchs_cap(monkeypatch):
    from workshop_lib import memory

    assert library.largest_batch("cnn", "digits", False, device="cpu") == (
        None, False, memory.SEARCH_CAP)
    for returned, expected in [(memory.LargestBatch(2**16, True, 2**16), (2**16, True)),
                               (memory.LargestBatch(2**15, False, 2**16), (2**15, False))]:
        monkeypatch.setattr(memory, "largest_batch", lambda *a, r=returned, **k: r)
        assert library.largest_batch("cnn", "digits", False)[:2] == expected


def test_trace_events_count_the_step_spans_and_their_gpu_mirrors(tmp_path):
    prefix = library.trace_step_prefix()
    events = [{"name": f"{prefix}{i}", "cat": cat} for i in range(3)
              for cat in ("user_annotation", "gpu_user_annotation", "gpu_user_annotation")]
    events += [{"name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "cat": "kernel"},
               {"name": "void cudnn::conv", "cat": "kernel"}, {"name": "aten::mm", "cat": "cpu_op"}]
    path = tmp_path / "trace_rank0.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert smoke.trace_events(path, prefix) == {
        "step_spans_user_annotation": 3, "step_spans_gpu_user_annotation": 6, "kernels": 2,
        "nccl_kernels": 1, "events": 12}


def test_without_a_gpu_the_full_check_says_so_in_one_line(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # on any machine
    with pytest.raises(SystemExit) as stop:
        main(["--out", "unused"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs a GPU that PyTorch can use" in err[0]


@pytest.mark.parametrize("why, fake", [
    ("torch.cuda.is_available() is False here", {"is_available": lambda: False}),
    # a V100 under a build for sm_75 and newer: torch sees it, and has no kernels for it
    ("has no kernels for the GPU(s) here",
     {"is_available": lambda: True, "device_count": lambda: 1,
      "get_arch_list": lambda: ["sm_75", "sm_80", "sm_90"],
      "get_device_capability": lambda i: (7, 0)}),
])
def test_without_a_usable_gpu_the_smoke_refuses_in_one_line(why, fake, capsys, monkeypatch,
                                                            tmp_path):
    for name, value in fake.items():
        monkeypatch.setattr(torch.cuda, name, value)
    monkeypatch.setattr(smoke, "steps", lambda: [])
    with pytest.raises(SystemExit) as stop:
        main(["--smoke", "--out", str(tmp_path / "refused")])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the smoke check needs a GPU that PyTorch can use" in err[0]
    assert why in err[0] and "--cpu-rehearsal" in err[0]
    assert not (tmp_path / "refused").exists()
    # Told it is a rehearsal, it runs (here: no steps) and says so.
    assert main(["--smoke", "--cpu-rehearsal", "--out", str(tmp_path / "rehearsal")]) == 0
    built = json.loads((tmp_path / "rehearsal" / "report.json").read_text())
    assert built["title"] == "GPU smoke check, CPU rehearsal"
    assert any("CPU REHEARSAL" in line for line in built["machine"])
    with pytest.raises(SystemExit):
        main(["--cpu-rehearsal", "--profile", "cpu"])
    assert "--cpu-rehearsal goes with --smoke" in capsys.readouterr().err


def test_an_unknown_notebook_is_named(capsys):
    with pytest.raises(SystemExit):
        main(["--profile", "cpu", "--notebooks", "99_nothing"])
    assert "no notebook named 99_nothing" in capsys.readouterr().err


# --- commands under their time limits (slow: they start processes) -------------------------

SLEEPER = textwrap.dedent("""
    import subprocess, sys, time
    # A worker in a session of its own, as torchrun starts them.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                             start_new_session=True)
    open(sys.argv[1], "w").write(str(child.pid))
    print("started", flush=True)
    time.sleep(120)
""")


def gone(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")  # exited, not yet reaped by its new parent


@pytest.mark.slow
def test_a_step_past_its_limit_is_stopped_with_its_workers_and_reported(tmp_path):
    pid_file = tmp_path / "worker.pid"

    def sleeper(ctx, limit):
        result = ctx.command("sleeper", ["-c", SLEEPER, pid_file], limit)
        return steps.from_process("sleeper", result, ctx)

    outcome, after = steps.run_steps(context(tmp_path), [
        steps.Step("sleeper", "sleeps past its limit", 3, sleeper, needs_cuda=False),
        steps.Step("after", "still runs", 30, lambda c, limit: Outcome("after", PASS),
                   needs_cuda=False)], say=lambda line: None)
    assert outcome.status == FAIL
    assert outcome.reason == "timed out after 3 s (its limit), stopped; its last line: started"
    assert gone(int(pid_file.read_text()))  # the worker in its own session too
    assert after.status == PASS
    assert (tmp_path / "logs" / "sleeper.stdout").read_text() == "started\n"


@pytest.mark.slow
def test_a_failing_bash_cell_in_a_notebook_is_reported_with_its_own_error(tmp_path):
    """The papermill path for real: the child runner, the executed notebook, the cell."""
    import nbformat

    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                       "language": "python"}
    parameters = nbformat.v4.new_code_cell("profile = 'auto'\nruns_dir = 'runs'\n"
                                           "solutions = False")
    parameters.metadata["tags"] = ["parameters"]
    notebook.cells = [parameters, nbformat.v4.new_code_cell(
        "import os\nos.makedirs(runs_dir)\nprint(solutions, runs_dir)"),
        nbformat.v4.new_code_cell(
            "%%bash\necho 'Traceback (most recent call last):' >&2\n"
            "echo 'RuntimeError: Expected all tensors to be on the same device' >&2\nexit 1"),
        nbformat.v4.new_code_cell("print('never runs')")]
    path = tmp_path / "99_failing.ipynb"
    nbformat.write(notebook, path)
    out = tmp_path / "check"
    [outcome] = steps.run_steps(context(out), [full.notebook_step(path, "cpu")],
                                say=lambda line: None)
    assert outcome.status == FAIL, outcome
    assert outcome.reason == ("RuntimeError: Expected all tensors to be on the same device "
                              "(%%bash cell exited with status 1)")
    # In [4]: after the parameters, papermill's injected parameters and the cell before
    assert outcome.where.startswith("notebooks/99_failing.ipynb, In [4]: %%bash echo")
    executed = json.loads((out / "notebooks" / "99_failing.ipynb").read_text())
    printed = "".join(failures._stream(cell, "stdout") for cell in executed["cells"])
    assert f"True {out / 'runs' / '99_failing'}" in printed  # solutions, absolute runs
    assert (out / "runs" / "99_failing").is_dir()


@pytest.mark.slow
def test_the_smokes_cpu_rehearsal_runs_here_skipping_what_needs_a_gpu_and_saying_so(tmp_path):
    """The command as an image is rehearsed, end to end: the GPU-only steps are skipped
    and named; a deadline already past stops the others before they start (the next test
    runs them, and test_doctor runs doctor)."""
    result = run_course_command(["-m", "workshop_lib.gpu_check", "--smoke", "--cpu-rehearsal",
                                 "--standins", "always", "--deadline", "1", "--out",
                                 str(tmp_path)], timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    built = json.loads((tmp_path / "report.json").read_text())
    by_name = {step["name"]: step for step in built["steps"]}
    assert list(by_name) == [step.name for step in smoke.steps()]
    assert built["title"] == "GPU smoke check, CPU rehearsal"
    for step in smoke.steps():
        status, reason = by_name[step.name]["status"], by_name[step.name]["reason"]
        if step.needs_cuda and not step.rehearses:
            assert (status, reason) == (SKIPPED, steps.NOT_REHEARSED), step.name
        else:
            assert status == SKIPPED and "deadline" in reason, step.name
    assert any("stand-ins used" in line and "sklearn, tqdm" in line for line in built["machine"])
    assert sorted(p.name for p in (tmp_path / "standins").iterdir()) == ["sklearn", "tqdm"]
    assert result.stdout.rstrip().endswith("report.json")
    assert (tmp_path / "report.md").read_text() in result.stdout  # printed at the end


@pytest.mark.slow
def test_the_full_check_runs_a_notebook_with_solutions_and_absolute_runs(tmp_path):
    """The orchestration on the CPU: one notebook executed by papermill with the CPU
    profile, no GPU tests (they would nest here) and no bench."""
    result = run_course_command(["-m", "workshop_lib.gpu_check", "--profile", "cpu",
                                 "--notebooks", "00_welcome", "--no-tests", "--no-bench",
                                 "--out", str(tmp_path)], timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    built = json.loads((tmp_path / "report.json").read_text())
    welcome = built["steps"][-1]
    assert [s["name"] for s in built["steps"]] == [smoke.CUDA_INFO, "doctor", "00_welcome"]
    assert welcome["status"] == PASS and welcome["budget_s"] == budget.NOTEBOOKS[
        "00_welcome"].seconds
    assert any("the environment works" in line for line in welcome["figures"])
    assert any("measured here" in line for line in built["totals"])
    assert (tmp_path / "notebooks" / "00_welcome.ipynb").is_file()
    assert (tmp_path / "runs" / "00_welcome").is_dir()
    assert not (REPO / "notebooks" / "build").exists()


@pytest.mark.slow
def test_the_smokes_steps_read_what_the_course_commands_really_write(tmp_path):
    """The smoke's CUDA steps, run on the CPU as a CPU rehearsal runs them: the
    commands' real outputs (the trace and its summary, the conversion's log, a run's
    record) are what the steps read, so a changed output format fails here, not first on
    a GPU."""
    wanted = ("equivalence, 1 rank on CUDA [item 1]",
              "conversion reference, 1 rank on CUDA [item 2]", "trace on CUDA, 1 rank [item 3]",
              "the profile's speed: the knee, precision and layout",
              "notebook 07's parts, 1 rank", smoke.FP32_RUN)
    chosen = [step for step in smoke.steps() if step.name in wanted]
    outcomes = steps.run_steps(context(tmp_path, rehearsal=True), chosen, say=lambda line: None)
    assert [o.status for o in outcomes] == [PASS] * 6, [(o.name, o.reason) for o in outcomes]
    equivalence, conversion, trace, speed, parts, run = outcomes  # in the smoke's order
    # 07's parts on one rank (experiments --one-rank): every part ran, FSDP judged the same
    # as DDP; torch.compile, minutes on a CPU, is named as left out.
    assert set(parts.values["seconds"]) == {"allreduce", "timing", "zero1", "comm_hooks",
                                            "fsdp"}
    assert parts.values["world_size"] == 1 and parts.values["allreduce_fit"] is None
    # The step timed on the CPU profile's model and batch, its sweep the powers of four
    # below the CNN's gradient bytes.
    timed = parts.values["timing"]
    assert (timed["model"], timed["batch_size"]) == ("cnn", 32)
    assert {name for name in timed["step_ms"] if name.startswith("buckets_")} == {
        f"buckets_{size}" for size in timing.sweep_for(timed["gradient_bytes"])}
    assert any(line.startswith("fully_shard against DDP after 5 Adam steps: largest")
               for line in parts.figures)
    assert any("torch.compile: not run on the CPU" in line for line in parts.figures)
    # The CPU profile's sizes: the curve around its batch, its knee one of the batches, and
    # the four precision x layout variants at the profile's batch, against fp32.
    assert speed.values["batch_size"] == profile.SIZES[("cpu", "digits")].batch_size
    assert str(speed.values["knee"]) in speed.values["knee_curve"]["samples_per_s"]
    assert set(speed.values["at_profile_batch"]) == {name for name, *_ in probes.SPEED_VARIANTS}
    assert any(f"the knee (the smallest batch within 10% of the best): batch "
               f"{speed.values['knee']}" in line for line in speed.figures)
    assert set(speed.values["input_feed"]) == {"resident", "data_loader", "workers"}
    assert any(line.startswith("input feed at batch") for line in speed.figures)
    assert set(equivalence.values["max_abs_difference"]) == {"bn_free", "batchnorm"}
    assert equivalence.values["tf32"] is False  # cuDNN allows TF32 by default: turned off
    assert trace.values["events"]["step_spans_user_annotation"] == 3  # library.trace's steps
    assert trace.values["median"]["measured_ms"] > 0
    assert (tmp_path / "trace" / "trace_rank0.json").is_file()
    assert conversion.values["val_acc"] >= library.CONVERSION_TARGET
    assert run.values["epoch"] == 4 and run.values["saved_activation_bytes"] > 0


# What probes.launcher writes, shaped as on a GPU: the watchdog's own words (the launcher's
# reading of them) and the seconds each job took.
WATCHDOG_SAID = ("NCCL's watchdog: rank 0's ALLREDUCE (collective #2 of its process group, "
                 "1,024 elements) ran 5 s, past its 5 s timeout, and it took the process down")


def launcher_result(stuck_ok=False, seconds=27.0, watchdog=WATCHDOG_SAID, launch_ok=True):
    return {"ddp_launch": {"ok": launch_ok, "seconds": 31.0, "summary": "SUCCESS in 31 s."
                           if launch_ok else "FAILED after 9 s: rank 0 failed first",
                           "exitcode": None, "error": None, "watchdog": None,
                           "flight_recorder_dumps": 0},
            "stuck_collective": {"ok": stuck_ok, "seconds": seconds, "summary": "FAILED",
                                 "exitcode": -6, "error": watchdog, "watchdog": watchdog,
                                 "flight_recorder_dumps": 1, "timeout_s": probes.STUCK_TIMEOUT_S,
                                 "bar_s": probes.STUCK_BAR_S, "limit_s": probes.STUCK_LIMIT_S}}


def test_the_launcher_step_passes_only_a_timeout_the_watchdog_ended_in_time():
    problem = notebook_parts.launcher_problem
    assert problem(launcher_result()) is None
    assert "past its 5 s timeout + 30 s" in problem(launcher_result(seconds=40))
    assert "nothing stopped it" in problem(launcher_result(stuck_ok=True))
    assert "no NCCL watchdog report" in problem(launcher_result(watchdog=None))
    assert "the one-rank DDP launch failed" in problem(launcher_result(launch_ok=False))
    assert probes.STUCK_BAR_S == probes.STUCK_TIMEOUT_S + 30
    assert probes.STUCK_LIMIT_S > probes.STUCK_BAR_S  # the launcher's limit is no pass


def test_the_stuck_collective_refuses_to_run_outside_torchrun_on_a_gpu(capsys, monkeypatch):
    from workshop_lib.gpu_check import stuck_collective

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert stuck_collective.main(["--timeout-s", "5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "runs under torchrun on a GPU" in err[0]
