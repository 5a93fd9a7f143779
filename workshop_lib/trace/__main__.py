"""The command: ``torchrun ... -m workshop_lib.trace --out DIR [flags]`` (``--help``)."""
import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

import workshop_lib.trace
from workshop_lib import allreduce_model as allreduce
from workshop_lib import cli, distributed, hardware, models, profile, runlog
from workshop_lib.errors import CourseError, exit_cleanly_on_course_error, record_errors
from workshop_lib.precision import AMP_CHOICES
from workshop_lib.trace import capture, timeline

PROG = "torchrun --standalone --nproc-per-node=2 -m workshop_lib.trace"
SUMMARY_NAME = "summary.json"


def parse_args(argv):
    parser = cli.ArgumentParser(prog=PROG, description=workshop_lib.trace.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--out", type=cli.folder, default="runs/trace",
        help="folder for trace_rank{r}.json and summary.json (default: %(default)s)")
    add("--steps", type=int, default=5, help="steps profiled (default: %(default)s)")
    add("--warmup", type=int, default=5,
        help="steps trained before profiling starts (default: %(default)s)")
    add("--batch-size", type=int, default=None,
        help="samples per step per process (default: the course's, e.g. 32 on a CPU)")
    add("--model", default=None, help="cnn, wrn-16-4 or wrn-16-10 (default: the course's)")
    add("--dataset", default="auto",
        help="auto: the course's for the device (digits on a CPU)")
    add("--data-dir", default=None, help="folder of downloaded datasets")
    add("--device", default="auto", type=hardware.device_flag,
        help="auto, cpu, cuda or cuda:N (default: %(default)s)")
    add("--amp", default="off", choices=AMP_CHOICES,
        help="mixed precision, as the training scripts' --amp (default: %(default)s)")
    add("--timeout", type=float, default=300,
        help="seconds a rank waits for the others before failing (default: %(default)s)")
    args = parser.parse_args(argv)
    check_args(args)
    return args


def check_args(args):
    """Reject bad values before the process group forms, one line each, saying the fix."""
    for flag, value in (("--steps", args.steps), ("--batch-size", args.batch_size),
                        ("--timeout", args.timeout)):
        if value is not None and not value > 0:
            raise CourseError(f"{flag} must be positive, got {value}")
    if args.warmup < 0:
        raise CourseError(f"--warmup must be 0 or more, got {args.warmup}")
    if args.model is not None and args.model not in models.MODELS:
        raise CourseError(f"unknown model {args.model!r}; choose one of {', '.join(models.MODELS)}")


def torchrun_env():
    """(rank, local rank, world size, processes on this machine), as torchrun sets them."""
    if "RANK" not in os.environ:
        raise CourseError(f"workshop_lib.trace runs under torchrun: {PROG} --out runs/trace")
    return (int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]),
            int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_WORLD_SIZE"]))


def course_defaults(args, device, local_world_size):
    """Fill the model, batch and dataset the course's profile uses for this job's processes
    on this machine and device (on one GPU, one process: the GPU profile's sizes, not the
    CPU launch's that a two-process default would pick)."""
    kwargs = {"dataset": args.dataset, "launches": profile.PROCESSES,
              "nproc": local_world_size}
    if args.data_dir:
        kwargs["data_dir"] = args.data_dir
    course = profile.get_profile("gpu" if device.type == "cuda" else "cpu", **kwargs)
    args.dataset = course.dataset
    args.model = args.model or course.model
    args.batch_size = args.batch_size or course.batch_size
    if args.data_dir is None:
        args.data_dir = profile.data.DEFAULT_DATA_DIR


def rank_record(args, device, rank, world_size):
    """This rank's profiled steps: trace, figures per step, unprofiled step time."""
    path, facts, seconds, unprofiled_s = capture.profile_steps(args, device, rank, world_size,
                                                               args.out)
    steps = timeline.analyse_trace(json.loads(path.read_text())["traceEvents"])
    if len(steps) != len(seconds):
        raise RuntimeError(f"{path} holds {len(steps)} '{timeline.STEP_PREFIX}' spans, "
                           f"expected {len(seconds)}")
    for step, s in zip(steps, seconds, strict=True):
        step["measured_ms"] = s * 1e3
    return {"rank": rank, "trace": path.name, "unprofiled_step_ms": unprofiled_s * 1e3,
            "steps": steps, "facts": facts}


def gather_records(record, world_size, device):
    """Every rank's record, in rank order, on every rank. As JSON bytes in uint8 tensors:
    ``all_gather_object`` pickles through numpy (torch's distributed_c10d), which a GPU
    image holding torch alone lacks; the summary is written as JSON anyway."""
    payload = torch.tensor(list(json.dumps(record).encode()), dtype=torch.uint8, device=device)
    size = torch.tensor([payload.numel()], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(size) for _ in range(world_size)]
    dist.all_gather(sizes, size)
    longest = max(int(s.item()) for s in sizes)
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[:payload.numel()] = payload
    gathered = [torch.empty_like(padded) for _ in range(world_size)]
    dist.all_gather(gathered, padded)
    return [json.loads(bytes(t[:int(n.item())].tolist()).decode())
            for t, n in zip(gathered, sizes, strict=True)]


def allreduce_floor(device, world_size, gradient_bytes):
    """The all-reduce floor for these gradients, on this job's own ranks: all-reduces timed
    from 1 KB up to the gradients' size, fitted as latency + bytes over a bandwidth
    (``allreduce_model``, the bench's fit), priced at the gradients' size: what one
    bucket of them costs with nothing beside it. None with one rank (nothing to reduce)."""
    if world_size < 2:
        return None
    gradient_bytes = -(-gradient_bytes // 4) * 4  # whole float32 values
    sizes = (*(s for s in allreduce.SIZES if s < gradient_bytes), gradient_bytes)
    rows = allreduce.sweep(device, sizes=sizes, reps=20)
    fitted = allreduce.fit(rows, world_size)
    return {"fit": fitted, "gradient_bytes": gradient_bytes, "sweep": rows,
            "floor_ms": allreduce.predicted_s(fitted, world_size, [gradient_bytes]) * 1e3}


def summarise(records, args, device, world_size, threads):
    """The summary: set-up, and per rank its steps (start times from a common origin, the
    first step of any rank: the ranks of one machine share its clock) and medians."""
    origin = min(r["steps"][0]["start_us"] for r in records)
    ranks = []
    for record in records:
        steps = [{"start_ms": (s["start_us"] - origin) / 1e3,
                  **{k: v for k, v in s.items() if k != "start_us"}} for s in record["steps"]]
        ranks.append({"rank": record["rank"], "trace": record["trace"],
                      "unprofiled_step_ms": record["unprofiled_step_ms"],
                      "steps": steps, "median": timeline.rank_totals(steps)})
    facts = records[0]["facts"]
    ratios = [(s["compute_ms"] + s["exposed_ms"]) / s["measured_ms"]
              for r in ranks for s in r["steps"]]
    return {
        "command": " ".join([PROG, *sys.argv[1:]]),
        "setup": {"device": device.type, "backend": hardware.backend_for(device),
                  "world_size": world_size, "threads_per_process": threads,
                  "model": args.model, "dataset": facts["dataset"],
                  "parameters": facts["parameters"], "gradient_bytes": facts["gradient_bytes"],
                  "batch_size": args.batch_size, "amp": args.amp, "warmup_steps": args.warmup,
                  "steps": args.steps},
        "hardware": hardware.describe(),
        "accounted": {"median": sorted(ratios)[len(ratios) // 2], "min": min(ratios),
                      "max": max(ratios), "n": len(ratios)},
        "ranks": ranks,
    }


COLUMNS = {"rank": ("rank", "d"), "step": ("step", ""), "measured_ms": ("measured ms", ".2f"),
           "step_ms": ("span ms", ".2f"), "compute_ms": ("compute ms", ".2f"),
           "communication_ms": ("communication ms", ".2f"),
           "overlapped_ms": ("overlapped ms", ".2f"), "exposed_ms": ("exposed ms", ".2f"),
           "other_ms": ("other ms", ".2f"), "accounted": ("(compute+exposed)/measured", ".2f")}


def format_summary(summary, out):
    setup = summary["setup"]
    rows = []
    for rank in summary["ranks"]:
        for s in [*rank["steps"], {**rank["median"], "step": "median",
                                   "accounted": rank["median"]["accounted"]["median"]}]:
            rows.append({**{k: s[k] for k in COLUMNS if k in s}, "rank": rank["rank"],
                         "step": str(s["step"]),
                         "accounted": s["accounted"] if "accounted" in s else
                         (s["compute_ms"] + s["exposed_ms"]) / s["measured_ms"]})
    unprofiled = ", ".join(f"rank {r['rank']} {r['unprofiled_step_ms']:.2f} ms"
                           for r in summary["ranks"])
    return "\n".join([
        f"workshop_lib.trace: {setup['device']}, {setup['backend']}, {setup['world_size']} "
        f"rank(s), {setup['model']} on {setup['dataset']}, batch {setup['batch_size']} per "
        f"rank, amp {setup['amp']}; {setup['steps']} steps profiled after "
        f"{setup['warmup_steps']} warm-up steps",
        "compute: the training thread's operators (GPU: kernels); communication: each "
        "all-reduce from launch to completion; exposed: communication with no compute beside it",
        runlog.format_table(rows, COLUMNS),
        f"compute + exposed communication over the measured step: "
        f"{summary['accounted']['median']:.2f} [{summary['accounted']['min']:.2f}.."
        f"{summary['accounted']['max']:.2f}] over n={summary['accounted']['n']} steps",
        f"the same step unprofiled (median): {unprofiled}",
        *([f"the all-reduce floor for {summary['floor']['gradient_bytes'] / 2**20:.2f} MB of "
           f"gradients, fitted on these ranks: {summary['floor']['floor_ms']:.2f} ms (latency "
           f"{summary['floor']['fit']['latency_s'] * 1e3:.3f} ms, bus bandwidth "
           f"{allreduce.bandwidth_text(summary['floor']['fit'])})"]
          if summary.get("floor") else []),
        "traces (open in https://ui.perfetto.dev or chrome://tracing): " + ", ".join(
            str(out / r["trace"]) for r in summary["ranks"]),
    ])


@record_errors  # a crashing rank's error goes to torchrun's error file and summary
@exit_cleanly_on_course_error
def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    rank, local_rank, world_size, local_world_size = torchrun_env()
    device = hardware.pick_device(args.device, local_rank, local_world_size)
    course_defaults(args, device, local_world_size)
    cli.prepare_out_dir(args.out)
    threads = hardware.configure_cpu_threads(device)
    with distributed.process_group(hardware.backend_for(device), timeout_s=args.timeout,
                                   device=device):
        record = rank_record(args, device, rank, world_size)
        records = gather_records(record, world_size, device)
        floor = allreduce_floor(device, world_size, record["facts"]["gradient_bytes"])
    if rank == 0:
        summary = summarise(records, args, device, world_size, threads)
        summary["floor"] = floor
        runlog.save_json(args.out / SUMMARY_NAME, summary)
        print(format_summary(summary, args.out))
        print(f"wrote {args.out / SUMMARY_NAME}", flush=True)


if __name__ == "__main__":
    main()
