"""The command: ``python -m workshop_lib.bench [flags]`` (the flags: ``--help``)."""
import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

import workshop_lib.bench
from workshop_lib import cli, data, hardware, models
from workshop_lib.bench import workers
from workshop_lib.bench.analyse import analyse
from workshop_lib.bench.plan import make_plan
from workshop_lib.bench.report import format_report
from workshop_lib.errors import CourseError, exit_cleanly_on_course_error

PROG = "python -m workshop_lib.bench"


def parse_args(argv):
    parser = cli.ArgumentParser(prog=PROG, description=workshop_lib.bench.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--out", type=Path, default=Path("runs/bench.json"),
        help="the figures as JSON (default: %(default)s)")
    add("--quick", action="store_true",
        help="a smoke run: 3 rounds, short windows and epochs, all-reduces up to 4 MB (or "
             "the largest gradients), a smaller scaling step on a CPU")
    add("--device", default="auto", type=hardware.device_flag)
    add("--nproc", type=int, default=None,
        help=f"processes at most (default: one per GPU on GPUs, {hardware.CPU_PROCESSES} "
             f"on the CPU)")
    add("--dataset", default="auto", choices=data.DATASET_CHOICES,
        help="auto: digits on a CPU; fashion-mnist if downloaded on GPUs")
    add("--data-dir", type=Path, default=data.DEFAULT_DATA_DIR)
    add("--model", default=None,
        help="the second step's model (default: cnn on a CPU, wrn-16-10 on GPUs)")
    add("--width", type=int, default=None, help="its SmallCNN width")
    add("--batch-size", type=int, nargs="+", default=None,
        help="its batch per process (default: 512 on a CPU, 128 on GPUs); several values "
             "compare several steps in one run")
    add("--rounds", type=int, default=None,
        help="interleaved rounds per figure (default: 7; 3 with --quick)")
    add("--loader-workers", type=int, default=None,
        help="DataLoader workers (default: the cores, at most 4)")
    add("--timeout", type=float, default=900,
        help="seconds a rank waits for the others before failing")
    return parser.parse_args(argv)


def check_args(args):
    """Reject bad values before any process starts, one line each, saying the fix."""
    if args.model is not None and args.model not in models.MODELS:
        raise CourseError(f"unknown model {args.model!r}; choose one of {', '.join(models.MODELS)}")
    given = {"--batch-size": min(args.batch_size) if args.batch_size else None,
             "--rounds": args.rounds, "--width": args.width, "--timeout": args.timeout}
    for flag, value in given.items():
        if value is not None and not value > 0:
            raise CourseError(f"{flag} must be positive, got {value}")
    if args.loader_workers is not None and args.loader_workers < 0:
        raise CourseError(f"--loader-workers must be 0 or more, got {args.loader_workers}")


def setup_record(args, plan, device):
    return {"device": device.type, "backend": hardware.backend_for(device),
            "interconnect": hardware.detect().interconnect,
            "world_size": plan.world_size, "world_sizes": list(plan.world_sizes),
            "threads_per_process": 1 if device.type == "cpu" else 0,
            "dataset": plan.dataset, "epoch_samples": plan.epoch_samples or None,
            "rounds": plan.rounds, "quick": args.quick, "window_s": plan.window_s,
            "configs": [asdict(c) for c in plan.configs],
            "trials": [asdict(t) for t in plan.trials],
            "precision_configs": list(plan.precision_configs)}


@exit_cleanly_on_course_error
def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    check_args(args)
    # auto: the GPUs where there are two or more (one process each), else the CPU, as the
    # course's DDP lessons run (NCCL cannot put two ranks on one GPU).
    requested = args.device
    if requested == "auto" and args.nproc is None:
        requested = "cuda" if hardware.detect().gpus >= 2 else "cpu"
    device = hardware.pick_device(requested)
    plan = make_plan(args, device)
    load_start = os.getloadavg()
    start = time.perf_counter()
    raw = workers.launch(plan)
    report = {
        "command": " ".join([PROG, *argv]),
        "setup": setup_record(args, plan, device),
        "hardware": hardware.describe(),
        **analyse(raw, plan),
        "load_average": {"start": load_start, "end": os.getloadavg()},
        "wall_s": time.perf_counter() - start,
    }
    print(format_report(report), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
