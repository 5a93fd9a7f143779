"""The check's in-process CUDA measurements, each run as a subprocess of the check (so a
hang, a crash or a CUDA error stays inside its time limit, and the check's own process
never holds a CUDA context):

    python -m workshop_lib.gpu_check.probes cuda-info --out F.json
    python -m workshop_lib.gpu_check.probes largest-batch --out F.json
    python -m workshop_lib.gpu_check.probes speed --out F.json [--device cpu]
    python -m workshop_lib.gpu_check.probes launcher --out F.json
"""
import json
import sys
import time

import torch

from workshop_lib import cli
from workshop_lib.gpu_check import library

# The notebook 05 search, for the course's two GPU-profile shapes: the CNN on digits (the
# profile without Fashion-MNIST) and the Wide ResNet on Fashion-MNIST's image size.
LARGEST_BATCH_CASES = (("cnn", "digits"), ("wrn-16-4", "fashion-mnist"))


def cuda_info():
    props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
    nccl = None
    try:
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # a build without NCCL: the report says "none"
        pass
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "nccl": nccl,
            "devices": [{"name": p.name, "memory_gib": round(p.total_memory / 2**30, 1),
                         "capability": f"{p.major}.{p.minor}",
                         "multiprocessors": p.multi_processor_count} for p in props],
            "bf16": bool(torch.cuda.is_bf16_supported()),
            "tf32_cudnn": bool(torch.backends.cudnn.allow_tf32),
            "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32)}


def largest_batches():
    rows = []
    for model, dataset in LARGEST_BATCH_CASES:
        for checkpointing in (False, True):
            start = time.perf_counter()
            fits, capped, cap = library.largest_batch(model, dataset, checkpointing)
            rows.append({"model": model, "dataset": dataset, "grad_checkpointing": checkpointing,
                         "largest_batch": fits, "capped": capped, "cap": cap,
                         "seconds": time.perf_counter() - start})
            print(json.dumps(rows[-1]), flush=True)
            torch.cuda.empty_cache()
    return rows


SPEED_IMAGES = 4096  # random images of the dataset's shape: times do not depend on values
SPEED_VARIANTS = (("fp32", "off", False), ("fp32 channels_last", "off", True),
                  ("bf16", "bf16", False), ("bf16 channels_last", "bf16", True))


def speed(device="cuda"):
    """The GPU profile's model (the CPU profile's, rehearsed on the CPU) on random images of
    its dataset's shape, so that no download is needed: samples/s against the batch per
    device around the profile's batch (notebook 05's knee), then at the profile's batch
    fp32 and bf16, each NCHW and channels_last (each variant a fresh model, timed by
    ``throughput.curve``), and the step fed three ways (``input_pipeline.feeds``)."""
    from torch.utils.data import TensorDataset

    from workshop_lib import data, models, optim, profile, throughput
    from workshop_lib.precision import Precision

    dataset = "fashion-mnist" if device == "cuda" else "digits"
    sizes = profile.SIZES[(device, dataset)]
    info = data.DATASETS[dataset]
    generator = torch.Generator().manual_seed(0)
    train_set = TensorDataset(
        torch.randn(SPEED_IMAGES, info.in_channels, info.image_size, info.image_size,
                    generator=generator),
        torch.randint(info.num_classes, (SPEED_IMAGES,), generator=generator))

    def timed(batches, amp="off", channels_last=False):
        layout = torch.channels_last if channels_last else torch.contiguous_format
        torch.manual_seed(0)
        model = models.build(sizes.model, info).to(device, memory_format=layout)
        optimizer = optim.build("sgd", model.parameters(), sizes.lr, optim.MOMENTUM,
                                optim.WEIGHT_DECAY)
        measured = throughput.curve(model, optimizer, train_set, torch.device(device),
                                    batches, layout, precision=Precision(amp, device))
        del model, optimizer
        if device == "cuda":
            torch.cuda.empty_cache()
        return measured

    result = {"device": device, "model": sizes.model, "dataset": dataset,
              "batch_size": sizes.batch_size,
              "knee_curve": timed(throughput.batches_around(sizes.batch_size)),
              "at_profile_batch": {}}
    print(json.dumps(result["knee_curve"]["samples_per_s"]), flush=True)
    bf16 = device != "cuda" or torch.cuda.is_bf16_supported()
    for name, amp, channels_last in SPEED_VARIANTS:
        if amp == "bf16" and not bf16:
            continue
        measured = timed([sizes.batch_size], amp, channels_last)
        result["at_profile_batch"][name] = measured["samples_per_s"].get(sizes.batch_size)
    # Notebook 05's input feed at the profile's batch: a DataLoader, its workers, the device.
    from workshop_lib import input_pipeline

    torch.manual_seed(0)
    model = models.build(sizes.model, info).to(device)
    optimizer = optim.build("sgd", model.parameters(), sizes.lr, optim.MOMENTUM,
                            optim.WEIGHT_DECAY)
    fed = input_pipeline.feeds(model, optimizer, train_set, sizes.batch_size,
                               torch.device(device))
    result["input_feed"] = fed["samples_per_s"]
    return result


STUCK_TIMEOUT_S, STUCK_KERNEL_S = 5, 90
STUCK_BAR_S = STUCK_TIMEOUT_S + 30  # issue 40: ended within the timeout and 30 s
STUCK_LIMIT_S = 120  # the launcher's own limit, should the watchdog not end it


def launcher():
    """Two jobs through the course's launcher (``workshop_lib.launch``), one NCCL rank
    each: a one-epoch ``train_ddp`` on digits, and a collective that cannot finish within
    its timeout (``stuck_collective``), with the seconds each took, how it ended and the
    launcher's summary (the watchdog's own words for the stuck one)."""
    import io
    import tempfile

    from workshop_lib import launch

    def job(target, timeout):
        shown = io.StringIO()
        result = launch.run(target, nproc=1, timeout=timeout, stream=shown)
        return {"ok": result.ok, "seconds": result.seconds, "summary": result.summary(),
                "exitcode": result.exitcode, "error": result.error,
                "watchdog": launch.watchdog_timeout(result.log_dir),
                "flight_recorder_dumps": len(list(result.log_dir.glob(
                    f"**/{launch.FLIGHT_RECORDER}/rank_*")))}

    training = job(["-m", "workshop_lib.train_ddp", "--device", "cuda", "--dataset", "digits",
                    "--model", "cnn", "--epochs", "1", "--no-progress", "--out",
                    tempfile.mkdtemp(prefix="gpu-check-launch-")], timeout=180)
    stuck = job(["-m", "workshop_lib.gpu_check.stuck_collective", "--timeout-s",
                 str(STUCK_TIMEOUT_S), "--kernel-s", str(STUCK_KERNEL_S)], STUCK_LIMIT_S)
    return {"ddp_launch": training, "stuck_collective": {
        **stuck, "timeout_s": STUCK_TIMEOUT_S, "bar_s": STUCK_BAR_S,
        "limit_s": STUCK_LIMIT_S}}


PROBES = {"cuda-info": cuda_info, "largest-batch": largest_batches, "speed": speed,
          "launcher": launcher}
ON_THE_CPU_TOO = {"speed"}  # probes a CPU rehearsal runs (--device cpu)


def main(argv=None):
    parser = cli.ArgumentParser(prog="python -m workshop_lib.gpu_check.probes")
    parser.add_argument("probe", choices=sorted(PROBES))
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cpu: a CPU rehearsal of a probe that can run there")
    args = parser.parse_args(argv)
    if args.device == "cpu" and args.probe in ON_THE_CPU_TOO:
        result = PROBES[args.probe]("cpu")
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        return 0
    if args.device == "cpu":
        print(f"error: the {args.probe} probe runs on CUDA only", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("error: this probe needs CUDA, and torch.cuda.is_available() is False",
              file=sys.stderr)
        return 2
    result = PROBES[args.probe]()
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
