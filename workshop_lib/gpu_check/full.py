"""``make gpu-check``: the GPU tests, every notebook with the GPU profile and the
exercises' reference solutions, and the quick bench, each under its own time limit.

Each notebook runs in its own process (``run_notebook``: papermill with a per-cell
``execution_timeout``), under the step's time limit (``budget``'s estimate, x3), with
``solutions=True`` (so the exercises' checks take their GPU paths) and absolute run
folders under the check's ``--out`` (``build/gpu-check/`` at the repository's root,
which git ignores). A failed notebook is reported with its failing cell's own error.
"""
import json
import os
from pathlib import Path

import torch

from workshop_lib.gpu_check import budget, failures, library, smoke
from workshop_lib.gpu_check.report import FAIL, PASS, Outcome
from workshop_lib.gpu_check.steps import Step, from_process

NOTEBOOKS = library.REPO / "notebooks"
# papermill's per-cell limit: under the step's, so a hung cell is usually stopped by
# papermill (which names it) before the step's own limit stops the whole notebook; the
# longest cell (a sweep) is estimated at ~2-4 min on 4 A100s.
CELL_LIMIT_S, CELL_MARGIN_S, MIN_CELL_S = 600, 15, 60


def closing_text(notebook):
    """The text the last code cell printed: a notebook's "What you should have seen"."""
    code = [cell for cell in notebook.get("cells", [])
            if cell.get("cell_type") == "code" and cell.get("outputs")]
    if not code:
        return []
    text = "".join("".join(o["text"]) if isinstance(o.get("text"), list) else o.get("text", "")
                   for o in code[-1]["outputs"])
    return [line.removeprefix("- ") for line in text.splitlines() if line.strip()]


def _read_json(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def notebook_outcome(name, finished, executed, error_json, context):
    """The step's Outcome: the closing figures, or the failing cell's own error."""
    notebook = _read_json(executed) or {}
    outcome = from_process(name, finished, context,
                           lambda _: (closing_text(notebook), {}, None))
    if outcome.status == FAIL and (notebook.get("cells") or Path(error_json).is_file()):
        failure = failures.notebook_failure(
            notebook, _read_json(error_json),
            timed_out_s=finished.limit_s if finished.timed_out else None)
        outcome.reason, outcome.tail = failure.line, failure.tail or outcome.tail
        outcome.where = f"{Path(executed).relative_to(context.out)}, {failure.where}"
    return outcome


def cell_limit(step_limit_s):
    return max(MIN_CELL_S, min(CELL_LIMIT_S, step_limit_s - CELL_MARGIN_S))


def notebook_step(path, profile):
    estimate = budget.NOTEBOOKS.get(path.stem, budget.Estimate(300.0, "no estimate yet"))

    def run(context, limit):
        folder = context.folder("notebooks")
        executed, error_json = folder / path.name, folder / f"{path.stem}.error.json"
        executed.unlink(missing_ok=True)
        error_json.unlink(missing_ok=True)
        parameters = {"profile": profile, "solutions": True,
                      "runs_dir": str((context.out / "runs" / path.stem).resolve())}
        command = ["-m", "workshop_lib.gpu_check.run_notebook", path, executed,
                   "--cwd", NOTEBOOKS, "--parameters", json.dumps(parameters),
                   "--cell-timeout", f"{cell_limit(limit):.0f}",
                   "--error-json", error_json]
        finished = context.command(path.stem, command, limit, cwd=NOTEBOOKS)
        return notebook_outcome(path.stem, finished, executed, error_json, context)

    return Step(path.stem, f"{path.name} with profile {profile}, solutions=True; estimate: "
                           f"{estimate.basis}", estimate.limit_s, run,
                needs_cuda=profile == "gpu", budget_s=estimate.seconds)


def gpu_tests(context, limit):
    finished = context.command("gpu-tests", ["-m", "pytest", "-m", "gpu", "-q", "-p",
                                             "no:cacheprovider", library.REPO / "tests"], limit)
    return smoke.pytest_outcome("GPU tests (pytest -m gpu)", finished, context)


# The notebook whose bench cell runs this step's command (bench --quick, one process per
# GPU) where there are two GPUs or more: its run in this check serves as the step's.
BENCH_NOTEBOOK = "02_from_one_gpu_to_many"


def efficiency_lines(report):
    return [f"{r['config']} step, {r['world_size']} processes: weak-scaling efficiency "
            f"{r['efficiency']['median']:.2f} (predicted {r['predicted_efficiency']:.2f})"
            for r in report["scaling"] if r["mode"] == "weak" and r["world_size"] > 1]


def bench(context, limit):
    out = context.folder("bench") / "bench.json"
    # One GPU: a one-process bench; several: one process per GPU (scaling, NCCL too).
    one_gpu = torch.cuda.device_count() < 2
    notebook = context.results.get(BENCH_NOTEBOOK)
    ran = context.out / "runs" / BENCH_NOTEBOOK / "bench.json"
    if not one_gpu and notebook is not None and notebook.status == PASS and ran.is_file():
        # Notebook 02 passed in this check, so its bench cell ran this very command on
        # every GPU and wrote this file: read it rather than measure it all again.
        report = library.read_json(ran)
        if report["setup"]["device"] == "cuda" and \
                report["setup"]["world_size"] == torch.cuda.device_count():
            out.write_text(ran.read_text())
            return Outcome("bench --quick", PASS, f"the run {BENCH_NOTEBOOK} made in this "
                                                  f"check", figures=efficiency_lines(report),
                           where=os.path.relpath(ran, context.out))

    def read(finished):
        return efficiency_lines(library.read_json(out)), {}, None

    finished = context.command("bench", library.bench_quick(out, one_gpu), limit)
    return from_process("bench --quick", finished, context, read)


def steps(notebook_paths, profile, tests=True, run_bench=True):
    chosen = [Step(smoke.CUDA_INFO, "the GPUs, CUDA, NCCL, bf16 and TF32 as torch sees them",
                   60, smoke.cuda_info),
              Step("doctor", "`python -m workshop_lib doctor`", 60, smoke.doctor,
                   needs_cuda=False)]
    if tests:
        chosen.append(Step("GPU tests (pytest -m gpu)", "every GPU-marked test",
                           budget.GPU_TESTS.limit_s, gpu_tests,
                           budget_s=budget.GPU_TESTS.seconds))
    chosen += [notebook_step(path, profile) for path in notebook_paths]
    if run_bench:
        chosen.append(Step("bench --quick", "scaling, overhead and all-reduces on the GPUs "
                                            f"(on two or more: {BENCH_NOTEBOOK}'s run, "
                                            f"where it passed)",
                           budget.BENCH.limit_s, bench, budget_s=budget.BENCH.seconds))
    return chosen
