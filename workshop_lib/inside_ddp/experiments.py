"""Notebook 07's measurements in one torchrun job (each launch costs its start-up again).

Each part is its own module's function, run on every rank in turn; rank 0 writes them all
to one JSON file, which the notebook plots and ``findings`` judges:

- ``allreduce``: all-reduce time against message size, and the latency and bandwidth
  fitted to it (``allreduce.sweep``, ``allreduce.fit``);
- ``timing``: step time of local, naive, overlapped, bucketed and PyTorch's DDP, and the
  bucket-size sweep (``timing.measure``), training ``--model`` at ``--batch-size`` per rank:
  the notebook passes its profile's, the course CNN on the CPU and a Wide ResNet on GPUs,
  whose step has communication worth hiding (``compiled`` times the same; the other parts
  judge bytes and equality, on the CNN);
- ``zero1``: optimizer-state bytes per rank, replicated against ``zero1.ShardedOptimizer``
  and PyTorch's ``ZeroRedundancyOptimizer``, for SGD with momentum and for Adam;
- ``comm_hooks``: bytes sent per step and the result of DDP's communication hooks;
- ``fsdp``: DDP against FSDP2 (``fully_shard``): the same training, the bytes each rank
  holds;
- ``compiled`` (with ``--compile 1``): ``torch.compile`` of the DDP model.

    torchrun --standalone --nproc-per-node=2 -m workshop_lib.inside_ddp.experiments \\
        --device cpu --model cnn --dataset digits --batch-size 32 --out results.json
"""
import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from workshop_lib import allreduce_model as allreduce
from workshop_lib import cli, data, distributed, hardware, models
from workshop_lib.errors import CourseError, exit_cleanly_on_course_error, record_errors
from workshop_lib.inside_ddp import comm_hooks, compiled, fsdp, timing, zero1


def zero1_memory(device):
    """Optimizer-state bytes per rank on the course CNN, for SGD (momentum) and Adam."""
    torch.manual_seed(0)
    model = models.build("cnn", data.DATASETS["digits"]).to(device)
    out = {}
    for name, optimizer_class, settings in (("sgd", torch.optim.SGD, {"lr": 0.01,
                                                                       "momentum": 0.9}),
                                            ("adam", torch.optim.Adam, {"lr": 0.01})):
        out[name] = zero1.compare_state_memory(model, optimizer_class, **settings)
        out[name]["pytorch"] = zero1.pytorch_state_bytes(model, optimizer_class, **settings)
    return out


def run(device, rounds, steps, with_compile, say, timed=("cnn", "digits", 32)):
    """Every part, in order; ``say(text)`` reports progress (rank 0 prints it); ``timed``:
    the model, dataset and batch per rank the step times are measured on."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model_name, dataset, batch_size = timed
    parts = {
        "allreduce": lambda: allreduce.sweep(device),
        "timing": lambda: timing.measure(rank, world_size, rounds=rounds, steps=steps,
                                         batch_size=batch_size, dataset=dataset,
                                         device=device, model_name=model_name),
        "zero1": lambda: zero1_memory(device),
        "comm_hooks": lambda: comm_hooks.compare(rank, world_size, device),
        "fsdp": lambda: fsdp.compare(rank, world_size, device),
    }
    if with_compile:
        parts["compiled"] = lambda: compiled.compare(rank, world_size, device, dataset,
                                                     batch_size=batch_size,
                                                     model_name=model_name)
    # The hardware described by rank 0 alone (nvidia-smi twice), which writes the result.
    result = {"world_size": world_size, "device": device.type, "backend": dist.get_backend(),
              "hardware": hardware.describe() if rank == 0 else None, "seconds": {}}
    for name, measure in parts.items():
        start = time.perf_counter()
        result[name] = measure()
        result["seconds"][name] = time.perf_counter() - start
        say(f"{name}: {result['seconds'][name]:.1f} s")
    # One rank moves no bytes between ranks: nothing to fit (the GPU check's rehearsal).
    result["allreduce_fit"] = allreduce.fit(result["allreduce"], world_size) \
        if world_size > 1 else None
    return result


@record_errors  # a rank's error reaches torchrun's summary
@exit_cleanly_on_course_error
def main(argv=None):
    parser = cli.ArgumentParser(prog="torchrun ... -m workshop_lib.inside_ddp.experiments",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", type=hardware.device_flag)
    parser.add_argument("--rounds", type=int, default=5,
                        help="timing: rounds of one window per variant (the median's n)")
    parser.add_argument("--steps", type=int, default=10, help="timing: steps per window")
    parser.add_argument("--compile", type=int, choices=(0, 1), default=0,
                        help="1: also time torch.compile of the DDP model (minutes on a CPU)")
    parser.add_argument("--model", default="cnn", choices=list(models.MODELS),
                        help="timing: the model whose step is timed (default: %(default)s)")
    parser.add_argument("--dataset", default="digits", choices=list(data.DATASETS),
                        help="timing: its data (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=32,
                        help="timing: samples per rank a step (default: %(default)s)")
    parser.add_argument("--out", type=Path, required=True, help="the results' JSON file")
    parser.add_argument("--one-rank", action="store_true",
                        help="allow one process: every part's code runs, but the comparisons "
                             "between ranks are trivial (the GPU check's one-GPU rehearsal)")
    args = parser.parse_args(argv)
    if args.batch_size < 1:
        parser.error(f"--batch-size needs 1 or more, got {args.batch_size}")
    if "LOCAL_RANK" not in os.environ:
        raise CourseError("experiments runs under torchrun: torchrun --standalone "
                          "--nproc-per-node=2 -m workshop_lib.inside_ddp.experiments --out "
                          "results.json")
    device = hardware.pick_device(args.device, int(os.environ["LOCAL_RANK"]),
                                  int(os.environ["LOCAL_WORLD_SIZE"]))
    hardware.configure_cpu_threads(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)  # FSDP2 and its device mesh take the current device
    with distributed.process_group(hardware.backend_for(device), device=device):
        rank, world_size = dist.get_rank(), dist.get_world_size()
        if world_size < 2 and not args.one_rank:
            raise CourseError("the measurements compare ranks: launch 2 processes or more")

        def say(text):
            if rank == 0:
                print(f"[rank 0/{world_size}] {text}", flush=True)

        result = run(device, args.rounds, args.steps, bool(args.compile), say,
                     (args.model, args.dataset, args.batch_size))
    if rank == 0:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
        print(f"results: {args.out}")


if __name__ == "__main__":
    main()
