"""``make gpu-check``: an instructor's one command to check a GPU workstation image.

    python -m workshop_lib.gpu_check --out build/gpu-check

In order, each timed:

1. the machine, as ``make doctor`` reports it;
2. the GPU-marked tests (``pytest -m gpu``): NCCL jobs, a failing rank under NCCL,
   SyncBatchNorm, CUDA checkpoints;
3. every notebook, executed by papermill with the GPU profile (``profile="gpu"``);
4. the quick benchmark on the GPUs.

It writes ``report.md`` and ``report.json`` in ``--out``: per step, seconds, pass or fail
(with the error's last line) and the key figures (each notebook's closing findings, the
bench's scaling and bandwidth). The course's budget for the whole day on 4 A100-class GPUs
is ``BUDGET_S``; the report says how this machine compares. Steps run even when an
earlier one failed, so one report shows everything that needs attention.
"""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from workshop_lib import cli, doctor, hardware
from workshop_lib.errors import CourseError, exit_cleanly_on_course_error

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"
BUDGET_S = 15 * 60  # the notebooks under the GPU profile, on 4 A100-class GPUs


def run_pytest(out):
    """The GPU-marked tests; (passed, summary line, seconds)."""
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p",
                             "no:cacheprovider", str(REPO / "tests")], cwd=REPO,
                            capture_output=True, text=True)
    (out / "pytest-gpu.txt").write_text(result.stdout + result.stderr)
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    # pytest exits 5 when every test was deselected or skipped: nothing failed.
    summary = lines[-1] if lines else "no output"
    ok = result.returncode in (0, 5)
    return {"name": "GPU tests (pytest -m gpu)", "ok": ok, "error": None if ok else summary,
            "seconds": time.perf_counter() - start, "figures": [summary]}


def run_notebook(path, out, profile):
    """Execute one notebook with papermill; its closing cell's text is its key figures."""
    import nbformat
    import papermill

    start = time.perf_counter()
    executed = out / "notebooks" / path.name
    executed.parent.mkdir(parents=True, exist_ok=True)
    step = {"name": path.stem, "ok": True, "error": None}
    try:
        papermill.execute_notebook(
            str(path), str(executed), kernel_name="python3", progress_bar=False,
            parameters={"profile": profile, "runs_dir": str(out / "runs" / path.stem)},
            cwd=str(path.parent))
    except Exception as error:  # papermill's PapermillExecutionError carries the cell's error
        step.update(ok=False, error=str(error).strip().splitlines()[-1][:300])
    step["seconds"] = time.perf_counter() - start
    step["figures"] = closing_text(nbformat.read(executed, as_version=4)) \
        if executed.is_file() else []
    return step


def closing_text(notebook):
    """The text the last code cell printed: a notebook's "What you should have seen"."""
    code = [cell for cell in notebook.cells if cell.cell_type == "code" and cell.outputs]
    if not code:
        return []
    text = "".join(output.get("text", "") for output in code[-1].outputs)
    return [line.removeprefix("- ") for line in text.splitlines() if line.strip()]


def run_bench(out):
    start = time.perf_counter()
    # On one GPU, a one-process bench (the step, loop overhead and data path on the GPU);
    # on several, one process per GPU (scaling and NCCL all-reduce too).
    shape = [] if hardware.detect().gpus >= 2 else ["--device", "cuda", "--nproc", "1"]
    result = subprocess.run([sys.executable, "-m", "workshop_lib.bench", "--quick", *shape,
                             "--out", str(out / "bench.json")], cwd=REPO,
                            capture_output=True, text=True)
    (out / "bench.txt").write_text(result.stdout + result.stderr)
    step = {"name": "bench --quick", "ok": result.returncode == 0,
            "seconds": time.perf_counter() - start, "figures": []}
    if step["ok"]:
        report = json.loads((out / "bench.json").read_text())
        step["figures"] = [
            f"{r['config']} step, {r['world_size']} processes: weak-scaling efficiency "
            f"{r['efficiency']['median']:.2f} (predicted {r['predicted_efficiency']:.2f})"
            for r in report["scaling"] if r["mode"] == "weak" and r["world_size"] > 1]
    else:
        step["error"] = (result.stderr.strip().splitlines() or ["no output"])[-1][:300]
    return step


def write_report(out, machine_lines, steps, wall_s):
    """report.json and report.md: the machine, then each step with its figures."""
    notebook_s = sum(s["seconds"] for s in steps if s.get("notebook"))
    report = {"machine": machine_lines, "steps": steps, "wall_s": wall_s,
              "notebooks_s": notebook_s, "budget_s": BUDGET_S,
              "ok": all(s["ok"] for s in steps)}
    (out / "report.json").write_text(json.dumps(report, indent=1))
    lines = ["# GPU check", "", "## Machine", "", *[f"    {line}" for line in machine_lines],
             "", "## Steps", "", "| step | result | seconds |", "|---|---|---|"]
    lines += [f"| {s['name']} | {'pass' if s['ok'] else 'FAIL: ' + (s.get('error') or '')} "
              f"| {s['seconds']:.0f} |" for s in steps]
    lines += ["", f"Notebooks: {notebook_s / 60:.1f} min against the course's budget of "
                  f"{BUDGET_S / 60:.0f} min on 4 A100-class GPUs; the whole check "
                  f"{wall_s / 60:.1f} min.", ""]
    for step in steps:
        if step["figures"]:
            lines += [f"## {step['name']}", "", *[f"- {f}" for f in step["figures"]], ""]
    (out / "report.md").write_text("\n".join(lines))
    return report


@exit_cleanly_on_course_error
def main(argv=None):
    parser = cli.ArgumentParser(prog="python -m workshop_lib.gpu_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("build/gpu-check"))
    parser.add_argument("--profile", default="gpu", choices=("gpu", "cpu"),
                        help="the notebooks' profile (cpu: check this command itself "
                             "without a GPU)")
    parser.add_argument("--notebooks", nargs="*", default=None,
                        help="notebook names to run (default: all)")
    parser.add_argument("--no-tests", action="store_true", help="skip the GPU tests")
    parser.add_argument("--no-bench", action="store_true", help="skip the benchmark")
    args = parser.parse_args(argv)
    machine = hardware.detect()
    if args.profile == "gpu" and not machine.gpus:
        raise CourseError("gpu-check needs a GPU that PyTorch can use, and this machine has "
                          "none (`make doctor` says why); --profile cpu checks the command "
                          "itself")
    paths = sorted(NOTEBOOKS.glob("[0-9]*.ipynb"))
    if args.notebooks is not None:
        wanted = {name.removesuffix(".ipynb") for name in args.notebooks}
        unknown = wanted - {p.stem for p in paths}
        if unknown:
            raise CourseError(f"no notebook named {', '.join(sorted(unknown))}; choose from "
                              f"{', '.join(p.stem for p in paths)}")
        paths = [p for p in paths if p.stem in wanted]
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    steps = [] if args.no_tests else [run_pytest(args.out)]
    for path in paths:
        print(f"gpu-check: {path.name} ...", flush=True)
        steps.append({**run_notebook(path, args.out, args.profile), "notebook": True})
    if not args.no_bench:
        steps.append(run_bench(args.out))
    report = write_report(args.out, doctor.report(), steps, time.perf_counter() - start)
    print((args.out / "report.md").read_text())
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
