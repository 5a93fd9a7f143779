"""Several training runs, in one command.

A sweep over batch sizes or learning-rate rules is not a lesson about processes, so it
need not pay a process start-up per run: on one device the runs of the single-device
script go one after another in this process. On a machine with several GPUs they go
``--parallel`` at a time, one per GPU (each worker process takes the next run when its
GPU is free), so no GPU sits idle. Launched by torchrun, the sweep runs the DDP script's
``fit`` for each run in turn, in one process group: several seeds of a DDP job for one
torchrun start-up. Each run gets its own folder under ``--out`` with its run.jsonl and
checkpoint.pt, exactly as the training scripts write them; the run record's ``device``
says which GPU ran it.

    python -m workshop_lib.sweep --out runs/batch --variant bs32="--batch-size 32" \\
        --variant bs512="--batch-size 512" -- --epochs 6 --dataset digits
    torchrun --standalone --nproc-per-node=2 -m workshop_lib.sweep --out runs/seeds \\
        --variant s0="--seed 0" --variant s1="--seed 1" -- --epochs 6 --dataset digits
"""
import argparse
import contextlib
import io
import multiprocessing
import os
import queue
import shlex
import sys
import time
from pathlib import Path

from workshop_lib import cli, hardware, runlog
from workshop_lib.errors import CourseError, exit_cleanly_on_course_error


def parse_variant(text):
    name, sep, flags = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"--variant takes NAME=\"FLAGS\", got {text!r}")
    return name, shlex.split(flags)


def requested_device(flags):
    """The --device the flags ask for (the last one given), or "auto"."""
    values = [flags[i + 1] for i, flag in enumerate(flags[:-1]) if flag == "--device"]
    return values[-1] if values else "auto"


def workers_for(parallel, device, machine):
    """The device each worker uses: one per GPU when the runs go to GPUs."""
    on_gpus = device == "cuda" or (device == "auto" and machine.gpus > 0)
    if parallel == "auto":
        parallel = machine.gpus if on_gpus and machine.gpus > 1 else 1
    parallel = int(parallel)
    if parallel < 1:
        raise CourseError(f"--parallel must be at least 1 (or auto), got {parallel}")
    if parallel == 1:
        return [None]  # in this process, on the device the flags ask for
    if on_gpus:
        if parallel > machine.gpus:
            raise CourseError(f"--parallel {parallel} but {machine.gpus} GPU(s): one run per "
                              f"GPU at a time; pass --parallel {machine.gpus} or auto")
        return [f"cuda:{i}" for i in range(parallel)]
    if device.startswith("cuda:"):
        raise CourseError(f"--parallel {parallel} with --device {device}: parallel runs "
                          f"each take a GPU of their own; drop one of the two")
    return ["cpu"] * parallel


def train_one(run_dir, flags, quiet):
    from workshop_lib import train

    with contextlib.redirect_stdout(io.StringIO() if quiet else sys.stdout):
        train.main([*flags, "--out", str(run_dir), "--no-progress"])


def report(name, run, seconds):
    print(f"{name:>16}: val_acc {run.final['val_acc']:.4f}, "
          f"{run.final['samples_per_s']:,.0f} samples/s, {seconds:.1f} s on "
          f"{run.start['device']}", flush=True)


def run_sweep(out, runs, common_flags, quiet=True, parallel="auto", machine=None):
    """Train each ``(name, flags)`` run with ``common_flags``; return {name: Run}."""
    devices = workers_for(parallel, requested_device(common_flags),
                          machine or hardware.detect())
    if devices == [None]:
        for name, flags in runs:
            start = time.perf_counter()
            train_one(Path(out) / name, [*common_flags, *flags], quiet)
            report(name, runlog.read(Path(out) / name), time.perf_counter() - start)
    else:
        _run_parallel(out, runs, common_flags, devices)
    return {name: runlog.read(Path(out) / name) for name, _ in runs}


def run_ddp_sweep(out, runs, common_flags):
    """Under torchrun: train_ddp's ``fit`` for each run, one after another, in one process
    group (the flags of the first run decide the device and the collective timeout)."""
    import torch.distributed as dist

    from workshop_lib import distributed, train_ddp

    rank, local_rank, world_size, local_world_size = train_ddp.torchrun_env()
    every = [train_ddp.parse_args([*common_flags, *flags, "--out", str(Path(out) / name),
                                   "--no-progress"]) for name, flags in runs]
    device = hardware.pick_device(every[0].device, local_rank, local_world_size)
    with distributed.process_group(hardware.backend_for(device), every[0].dist_timeout,
                                   device=device):
        for (name, _), args in zip(runs, every, strict=True):
            if rank == 0:
                cli.prepare_out_dir(args.out)
            dist.barrier()  # the folder exists before any rank trains into it
            start = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):
                train_ddp.fit(args, device, rank, world_size)
            if rank == 0:
                report(name, runlog.read(args.out), time.perf_counter() - start)


def _worker(device, sharers, todo, done, out, common_flags):
    # Threads per process follow the processes sharing this machine's cores.
    os.environ[hardware.SHARERS_ENV] = str(sharers)
    for name, flags in iter(todo.get, None):
        start = time.perf_counter()
        error = None
        try:
            train_one(Path(out) / name, [*common_flags, *flags, "--device", device], quiet=True)
        except SystemExit as stop:  # a CourseError: the script printed its one line
            error = f"exit status {stop.code}" if stop.code else None
        except Exception as failure:
            error = f"{type(failure).__name__}: {failure}"
        done.put((name, error, time.perf_counter() - start))


def _run_parallel(out, runs, common_flags, devices):
    # Spawned, not forked: forking a process whose torch threads run can deadlock.
    context = multiprocessing.get_context("spawn")
    todo, done = context.Queue(), context.Queue()
    for run in [*runs, *[None] * len(devices)]:  # then one "no more" per worker
        todo.put(run)
    workers = [context.Process(target=_worker, args=(device, len(devices), todo, done, out,
                                                      common_flags)) for device in devices]
    for worker in workers:
        worker.start()
    failed, pending = [], len(runs)
    while pending:
        try:
            name, error, seconds = done.get(timeout=5)
        except queue.Empty:
            if not any(worker.is_alive() for worker in workers):
                raise CourseError(f"the sweep's workers died with {pending} run(s) left "
                                  f"(exit codes {[w.exitcode for w in workers]})") from None
            continue
        pending -= 1
        if error:
            failed.append(f"{name} ({error})")
        else:
            report(name, runlog.read(Path(out) / name), seconds)
    for worker in workers:
        worker.join()
    if failed:
        raise CourseError(f"{len(failed)} run(s) failed: {', '.join(failed)}")


@exit_cleanly_on_course_error
def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    own, common = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv \
        else (argv, [])
    parser = cli.ArgumentParser(prog="python -m workshop_lib.sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    # --variant, not --run: torchrun would take "--run" for its own --run-path.
    parser.add_argument("--variant", type=parse_variant, action="append", required=True,
                        metavar='NAME="FLAGS"')
    parser.add_argument("--parallel", default="auto",
                        help="runs at a time: auto = one per GPU when the runs go to "
                             "several GPUs, else 1 (default: %(default)s)")
    args = parser.parse_args(own)
    if len({name for name, _ in args.variant}) != len(args.variant):
        raise CourseError("each --variant needs its own NAME")
    if "RANK" in os.environ:  # launched by torchrun: the DDP script's runs
        run_ddp_sweep(args.out, args.variant, common)
    else:
        run_sweep(args.out, args.variant, common, parallel=args.parallel)


if __name__ == "__main__":
    main()
