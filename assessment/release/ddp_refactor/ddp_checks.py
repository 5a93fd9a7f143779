"""The assessment's checks: launch a training script under torchrun, then judge what it did.

The test cells of the assessment notebook call this module, one check per test cell, each
named after the cell's grade id:

    run = ddp_checks.launch("train_digits_ddp.py", ddp_checks.Config(epochs=3))
    ddp_checks.check_shards_disjoint_and_cover(run)

``launch`` starts the script once with torchrun, with ``ddp_recorder.py`` (next to this
file) as every process's entry point: it runs the script unchanged and records what each
rank does (ddp_recorder.py says what, and how); then, on GPUs, where the speed-up is
required, once more as a single process to measure it. Each ``check_<grade id>``
function judges one requirement from the records of all ranks, prints ``PASS: ...`` or
raises ``RequirementNotMet`` with the reason in one line. Nothing reads the script's
source: any correct way of writing it passes. ``passes`` is the pass mark, the one
definition that the notebook, the feedback (``report``) and the instructor's grades.csv
apply. ``run_script`` is the notebook's plain launch of the script, with a short summary
instead of torchrun's own output.

This file holds what the notebook calls, in the order it calls it (``process_layout``,
``run_script``, ``launch``, the checks, ``report``); the rest lives in rooms beside it, one
concern each, and every name the notebook uses is importable from here. Read this file
first, then the room you need:

- ``ddp_checks_rules.py``: the requirements and their points, the pass mark, the speed-up
  bar, ``Config`` (one graded run) and ``RequirementNotMet``;
- ``ddp_checks_run.py``: ``Run``, what one launch did, and why a job that cannot be graded
  fails every requirement with the same reason;
- ``ddp_checks_launch.py``: how a job is started in its sandbox, stopped at its time limit
  and read back;
- ``ddp_checks_training.py``: requirements 1, 2, 3 and 8 (the target accuracy, the
  shards, their reshuffling, the learning rate);
- ``ddp_checks_gradients.py``: requirement 4 (every step equals a single-process replay);
- ``ddp_checks_rank0.py``: requirements 5, 6 and 7 (the table and the files, the
  checkpoint, the logged validation metrics).

Your copy of this file, and of each room, is replaced by the instructor's when your work
is graded.

``report`` also records your result in your workshop progress (``record_result``, with
the workshop's ``workshop_lib.progress``: the closing session reads it, and on the class
server your instructor's board shows it): when you run the cells, or press Validate; never
while nbgrader grades (``NBGRADER_EXECUTION=autograde``).

Standard library only (``workshop_lib.progress`` too): importing torch in the notebook's
kernel would add seconds to every graded notebook.
"""
import contextlib
import importlib.util
import io
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path


def _room(name):
    """The room ``name``.py beside this file, loaded by its path and registered in
    sys.modules under its name, where the rooms loaded after it find it with a plain
    import. By its path, and nothing added to sys.path: this file is itself loaded by its
    path, from several folders (release/ by the workshop's conversion check, source/ by
    export_grades.py and the tests, copies of either), and each copy must use the rooms
    beside it, not those of the first copy imported."""
    spec = importlib.util.spec_from_file_location(
        name, Path(__file__).resolve().with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# In the order they import each other: each room finds the rooms it imports loaded.
_room("ddp_checks_rules")  # the requirements, the pass mark, Config, RequirementNotMet
_room("ddp_checks_run")  # Run, and what every check asks of it first
_room("ddp_checks_launch")  # one launch: sandbox, time limit, output, records
_room("ddp_checks_training")  # requirements 1, 2, 3 and 8
_room("ddp_checks_gradients")  # requirement 4
_room("ddp_checks_rank0")  # requirements 5, 6 and 7

from ddp_checks_gradients import (  # noqa: E402, F401 - the rooms' names, importable from here
    PARAM_RTOL,
    REPLAY_RTOL,
    START_RTOL,
    check_gradients_averaged_over_ranks,
)
from ddp_checks_launch import (  # noqa: E402, F401
    EXCEPTION_LINE,
    OUTPUT_CHARS,
    RANK_LINE,
    RECORDER,
    RECORDER_FILES,
    TIME_LIMIT_ENV,
    TRACEBACK_START,
    CappedReader,
    JobOutput,
    _launch_once,
    _sandbox_module,
)
from ddp_checks_rank0 import (  # noqa: E402, F401
    ACC_TOLERANCE,
    LOSS_RTOL,
    check_checkpoint_loads_into_plain_model,
    check_rank0_only_logs_and_writes,
    check_validation_metrics_are_global,
)
from ddp_checks_rules import (  # noqa: E402, F401
    BASELINE_EPOCHS,
    PASS_POINTS,
    PASS_REQUIRES,
    REQUIREMENTS,
    SPEEDUP_NOT_REQUIRED_ON_CPU,
    SPEEDUP_PER_GPU,
    SPEEDUP_UNCALIBRATED,
    Config,
    RequirementNotMet,
    pass_rule,
    passes,
)
from ddp_checks_run import Run, where  # noqa: E402, F401
from ddp_checks_training import (  # noqa: E402, F401
    LR_RTOL,
    check_learning_rate_follows_global_batch,
    check_runs_and_reaches_target_accuracy,
    check_shards_disjoint_and_cover,
    check_shards_reshuffled_each_epoch,
    scaled_learning_rates,
)

RUN_DIR = Path("grading_run")  # under the notebook's folder: the evidence and --out of a run
NPROC_ENV = "DDP_CHECKS_NPROC"  # instructor's override of the number of processes
CPU_PROCESSES = 2  # processes to launch where there are fewer than two GPUs


# --------------------------------------------------------------------------------------
# Where to run: the processes and the device.
# --------------------------------------------------------------------------------------

def visible_gpus():
    """How many GPUs a launched process can use, as PyTorch counts them.

    nvidia-smi lists the GPUs the driver sees, also those PyTorch cannot use (a driver
    too old for its CUDA, CUDA_VISIBLE_DEVICES); only where it lists two or more is PyTorch
    asked, in a subprocess (importing torch in this kernel would slow every graded
    notebook by seconds).
    """
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    if sum(1 for line in listed.splitlines() if line.startswith("GPU ")) < 2:
        return 0
    try:
        asked = subprocess.run(
            [sys.executable, "-c", "import torch; print(torch.cuda.device_count() "
                                   "if torch.cuda.is_available() else 0)"],
            capture_output=True, text=True, timeout=120, check=False)
        return int(asked.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return 0


def process_layout():
    """``(processes, on_gpu)``: one process per GPU where there are two or more GPUs,
    otherwise ``CPU_PROCESSES`` processes on the CPU (one GPU cannot be shared by two
    NCCL ranks). ``DDP_CHECKS_NPROC`` sets the number of CPU processes or GPUs to use.
    """
    gpus = visible_gpus()
    wanted = int(os.environ.get(NPROC_ENV, 0)) or None
    if gpus >= 2:
        return min(wanted or gpus, gpus), True
    return wanted or CPU_PROCESSES, False


# --------------------------------------------------------------------------------------
# Launch the script: the graded run, and the notebook's plain launch.
# --------------------------------------------------------------------------------------

def launch(script, config=Config(), nproc=None, on_gpu=None):  # noqa: B008 - Config is frozen
    """Run ``script`` under torchrun with ``config``'s flags; return a ``Run``.

    ``nproc`` processes, on GPUs (NCCL) if ``on_gpu``, else on the CPU; what the caller
    leaves out comes from ``process_layout()``. Where the run measures the speed-up
    (``Run.measures_speedup``: on two or more GPUs, unless ``config`` says otherwise), a job
    that finished is run again as a single process on the same kind of device
    (``Run.one_process``). Never raises for the learner's
    failures (crash, hang, missing file): they become ``Run.failure``, which every check
    reports.
    """
    if nproc is None or on_gpu is None:
        layout_nproc, layout_on_gpu = process_layout()
        nproc = layout_nproc if nproc is None else nproc
        on_gpu = layout_on_gpu if on_gpu is None else on_gpu
    # A fresh folder each time: nothing left from an earlier run can count for this one.
    shutil.rmtree(RUN_DIR, ignore_errors=True)
    run = _launch_once(script, config, int(nproc), bool(on_gpu), RUN_DIR)
    print(run.summary())
    if run.ok:
        print("\n".join(run.ranks[0]["stdout"][-(config.epochs + 4):]))
        if run.measures_speedup:
            alone = replace(config, epochs=min(config.epochs, BASELINE_EPOCHS))
            run.one_process = _launch_once(script, alone, 1, run.on_gpu,
                                           RUN_DIR / "one_process")
            print(run.speed_summary())
    return run


def run_script(script, *args, nproc=None, on_gpu=None, time_limit_s=300):
    """Launch ``script`` with ``args`` under torchrun, as a learner would; show its output
    through ``JobOutput`` and end with one line on how it ended. Returns the exit status."""
    if nproc is None or on_gpu is None:
        layout_nproc, layout_on_gpu = process_layout()
        nproc = layout_nproc if nproc is None else nproc
        on_gpu = layout_on_gpu if on_gpu is None else on_gpu
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nproc}", "--tee", "3",
               "--log-line-prefix-template", "[rank${rank}]: ", str(script), *map(str, args)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    if not on_gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""  # one GPU cannot host two NCCL ranks: use the CPU
    output = JobOutput(show=lambda text: print(text, flush=True))
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", env=env, start_new_session=True)
    # At the limit, SIGTERM: torchrun then stops its workers itself.
    timer = threading.Timer(time_limit_s, os.killpg, (proc.pid, signal.SIGTERM))
    timer.start()
    for line in proc.stdout:
        output.feed(line)
    returncode = proc.wait()
    stopped = returncode != 0 and not timer.is_alive()
    timer.cancel()
    print(output.ending(f"{script} on {where(nproc, on_gpu)}", returncode,
                        time.perf_counter() - start, time_limit_s if stopped else None))
    return returncode


# --------------------------------------------------------------------------------------
# The report: every requirement's verdict, the points and the pass mark.
# --------------------------------------------------------------------------------------

CHECKS = {grade_id: globals()[f"check_{grade_id}"] for grade_id in REQUIREMENTS}


def report(run):
    """Print each requirement's verdict, the points, whether they reach the pass mark and,
    if not, what is missing; return ``(points, passed)``."""
    met, lines = set(), []
    for grade_id, points in REQUIREMENTS.items():
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                CHECKS[grade_id](run)
        except RequirementNotMet:
            lines.append(f"  not met  {grade_id} (0 of {points})")
        else:
            met.add(grade_id)
            lines.append(f"  met      {grade_id} ({points} of {points})")
    points = sum(REQUIREMENTS[grade_id] for grade_id in met)
    passed = passes(met)
    print("\n".join(lines))
    if isinstance(run, Run) and run.ok:
        print(run.speed_summary())
    print(f"Total: {points} of {sum(REQUIREMENTS.values())} points. Pass mark: "
          f"{pass_rule()}. Result: {'PASSED' if passed else 'NOT PASSED'}.")
    missing = [grade_id for grade_id in PASS_REQUIRES if grade_id not in met]
    if missing:
        print(f"Not passed without {' and '.join(missing)}: the pass mark requires "
              f"{'them' if len(missing) > 1 else 'it'} whatever the other points.")
    record_result(run, met)
    return points, passed


PROGRESS_KEY = "ddp_refactor"  # the assessment's key (and notebook) in the learner's progress


def record_result(run, met):
    """Record the result of the requirements ``met`` in the learner's workshop progress
    (workshop_lib.progress; its record, or None): where the learner runs the checks, their
    cells or Validate (``NBGRADER_EXECUTION=validate``), never while nbgrader autogrades (as
    the grader, into nobody's progress), nor where the workshop's library is not installed.
    Never raises: a result that cannot be recorded costs the learner nothing."""
    if _sandbox_module().grading():
        return None
    try:
        from workshop_lib import progress
    except ImportError:
        return None
    points, total = sum(REQUIREMENTS[g] for g in met), sum(REQUIREMENTS.values())
    not_met = [grade_id for grade_id in REQUIREMENTS if grade_id not in met]
    details = {"points": points, "max_points": total,
               "met": [grade_id for grade_id in REQUIREMENTS if grade_id in met],
               "not_met": not_met,
               "validate": os.environ.get("NBGRADER_EXECUTION") == "validate"}
    if isinstance(run, Run):
        details.update(processes=run.nproc, on_gpu=run.on_gpu, epochs=run.config.epochs,
                       elapsed_s=round(run.elapsed_s, 1))
        try:
            details.update(samples_per_s=run.samples_per_s, speedup=run.speed()[0])
        except Exception:  # noqa: BLE001 - records a job too broken to time: no speed then
            pass
    passed = passes(met)
    reason = (f"{points} of {total} points: {'PASSED' if passed else 'NOT PASSED'}"
              + (f"; not met: {', '.join(not_met)}" if not_met else ""))
    return progress.record_quietly("assessment", PROGRESS_KEY, PROGRESS_KEY, passed, reason,
                                   details)
