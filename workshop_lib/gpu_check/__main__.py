"""The command: ``python -m workshop_lib.gpu_check [--smoke] [--out DIR] ...`` (``--help``)."""
import argparse
import sys
import time

import torch

import workshop_lib.gpu_check
from workshop_lib import cli, hardware
from workshop_lib.errors import CourseError, exit_cleanly_on_course_error
from workshop_lib.gpu_check import budget, environment, full, report, smoke
from workshop_lib.gpu_check.library import REPO
from workshop_lib.gpu_check.steps import REHEARSAL_SLOWER, Context, run_steps

DEFAULT_OUT = REPO / "build" / "gpu-check"
SMOKE_TARGET_S = 5 * 60


def parse_args(argv):
    parser = cli.ArgumentParser(prog="python -m workshop_lib.gpu_check",
                                description=workshop_lib.gpu_check.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--smoke", action="store_true",
        help="the one-GPU smoke check (torch alone needed; under 5 minutes)")
    add("--cpu-rehearsal", action="store_true",
        help="--smoke without a GPU: run on the CPU every step that can (checks an image "
             "before its GPUs are at hand; says nothing about GPUs)")
    add("--out", type=cli.folder, default=None,
        help=f"folder for the report, logs and runs (default: {DEFAULT_OUT}, "
             f"{DEFAULT_OUT / 'smoke'} for --smoke)")
    add("--deadline", type=float, default=None,
        help=f"seconds after which no further step starts (default: "
             f"{smoke.DEADLINE_S} for --smoke, none otherwise)")
    add("--standins", choices=("auto", "always"), default="auto",
        help="--smoke: stand-ins for scikit-learn's digits and tqdm where they do not "
             "import (auto), or always (to check the fallback itself)")
    add("--profile", default="gpu", choices=("gpu", "cpu"),
        help="the notebooks' profile (cpu: check this command itself without a GPU)")
    add("--notebooks", nargs="*", default=None, help="notebook names to run (default: all)")
    add("--no-tests", action="store_true", help="skip the GPU tests")
    add("--no-bench", action="store_true", help="skip the benchmark")
    args = parser.parse_args(argv)
    if args.cpu_rehearsal and not args.smoke:
        raise CourseError("--cpu-rehearsal goes with --smoke (the full check rehearses on "
                          "the CPU with --profile cpu)")
    if args.deadline is not None and not args.deadline > 0:
        raise CourseError(f"--deadline must be positive, got {args.deadline}")
    return args


def notebook_paths(names):
    paths = sorted((REPO / "notebooks").glob("[0-9]*.ipynb"))
    if names is None:
        return paths
    wanted = {name.removesuffix(".ipynb") for name in names}
    unknown = wanted - {p.stem for p in paths}
    if unknown:
        raise CourseError(f"no notebook named {', '.join(sorted(unknown))}; choose from "
                          f"{', '.join(p.stem for p in paths)}")
    return [p for p in paths if p.stem in wanted]


def totals(args, outcomes, wall_s):
    if args.cpu_rehearsal:
        return [f"The CPU rehearsal took {wall_s:.0f} s (the smoke's target, "
                f"{SMOKE_TARGET_S / 60:.0f} min, is for one GPU)."]
    if args.smoke:
        return [f"The smoke took {wall_s:.0f} s, against its target of "
                f"{SMOKE_TARGET_S / 60:.0f} min on one GPU"
                + (" (met)." if wall_s <= SMOKE_TARGET_S else " (NOT met).")]
    measured = {o.name: o.seconds for o in outcomes
                if o.name in budget.NOTEBOOKS and o.status != "skipped"}
    return budget.verdict_lines(measured)


def no_gpu():
    """Why this machine has no GPU for the smoke, in a clause."""
    if not torch.cuda.is_available():
        return "torch.cuda.is_available() is False here"
    return (f"this PyTorch build ({' '.join(torch.cuda.get_arch_list())}) has no kernels "
            f"for the GPU(s) here")


@exit_cleanly_on_course_error
def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    cuda = hardware.usable_gpus() > 0 and not args.cpu_rehearsal
    if args.smoke and not cuda and not args.cpu_rehearsal:
        raise CourseError(f"the smoke check needs a GPU that PyTorch can use, and {no_gpu()} "
                          f"(`make doctor` says more); run it on the GPU machine, or add "
                          f"--cpu-rehearsal to run on the CPU the steps that can")
    if not args.smoke and args.profile == "gpu" and not cuda:
        raise CourseError("gpu-check needs a GPU that PyTorch can use, and this machine has "
                          "none (`make doctor` says why); --profile cpu checks the command "
                          "itself, --smoke --cpu-rehearsal runs what needs no GPU")
    paths = [] if args.smoke else notebook_paths(args.notebooks)
    out = (args.out or (DEFAULT_OUT / "smoke" if args.smoke else DEFAULT_OUT)).resolve()
    cli.prepare_out_dir(out)
    start = time.monotonic()
    standins = environment.missing_replaceable(force=args.standins == "always") \
        if args.smoke else []
    folder = environment.install_standins(standins, out / "standins")
    deadline = args.deadline or (smoke.DEADLINE_S if args.smoke else None)
    if args.cpu_rehearsal and not args.deadline:
        deadline *= REHEARSAL_SLOWER
    env = environment.command_env(folder, one_gpu=args.smoke, no_gpu=args.cpu_rehearsal)
    context = Context(out=out, env=env, cuda=cuda, rehearsal=args.cpu_rehearsal,
                      deadline=start + deadline if deadline else None, cwd=REPO)
    steps = smoke.steps() if args.smoke else full.steps(
        paths, args.profile, tests=not args.no_tests, run_bench=not args.no_bench)
    outcomes = run_steps(context, steps, say=lambda line: print(line, flush=True))
    wall_s = time.monotonic() - start
    notes = [f"{step.name}: {step.checks}" for step in steps]
    if not args.smoke:
        notes.append("budget s: " + budget.__doc__.split("\n\n")[1].replace("\n", " "))
    title = "GPU smoke check" + (", CPU rehearsal" if args.cpu_rehearsal else "") \
        if args.smoke else "GPU check (make gpu-check)"
    machine = environment.describe(standins, one_gpu=args.smoke, rehearsal=args.cpu_rehearsal)
    built = report.build(title, machine, outcomes,
                         wall_s, notes=notes, totals=totals(args, outcomes, wall_s))
    print(report.write(out, built))
    print(f"report: {out / 'report.md'} and report.json")
    return 0 if built["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
