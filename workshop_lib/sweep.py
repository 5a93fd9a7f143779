"""Several training runs, one after another, in one process.

A sweep over batch sizes or learning-rate rules is not a lesson about processes, so it
need not pay a process start-up per run. Each run gets its own folder under ``--out``
with its run.jsonl and checkpoint.pt, exactly as ``python -m workshop_lib.train`` writes.

    python -m workshop_lib.sweep --out runs/batch --run bs32="--batch-size 32" \\
        --run bs512="--batch-size 512" -- --epochs 6 --dataset digits
"""
import argparse
import contextlib
import io
import shlex
import sys
import time
from pathlib import Path

from workshop_lib import runlog, train
from workshop_lib.errors import CourseError, exit_cleanly_on_course_error


def parse_run(text):
    name, sep, flags = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"--run takes NAME=\"FLAGS\", got {text!r}")
    return name, shlex.split(flags)


def run_sweep(out, runs, common_flags, quiet=True):
    """Train each ``(name, flags)`` run with ``common_flags``; return {name: Run}."""
    results = {}
    for name, flags in runs:
        run_dir = Path(out) / name
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO() if quiet else sys.stdout):
            train.main([*common_flags, *flags, "--out", str(run_dir), "--no-progress"])
        run = runlog.read(run_dir)
        results[name] = run
        print(f"{name:>16}: val_acc {run.final['val_acc']:.4f}, "
              f"{run.final['samples_per_s']:,.0f} samples/s, "
              f"{time.perf_counter() - start:.1f} s", flush=True)
    return results


@exit_cleanly_on_course_error
def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    own, common = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv \
        else (argv, [])
    parser = argparse.ArgumentParser(prog="python -m workshop_lib.sweep", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--run", type=parse_run, action="append", required=True,
                        metavar='NAME="FLAGS"')
    args = parser.parse_args(own)
    if len({name for name, _ in args.run}) != len(args.run):
        raise CourseError("each --run needs its own NAME")
    run_sweep(args.out, args.run, common)


if __name__ == "__main__":
    main()
