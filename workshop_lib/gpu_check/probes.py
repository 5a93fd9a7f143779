"""The check's in-process CUDA measurements, each run as a subprocess of the check (so a
hang, a crash or a CUDA error stays inside its time limit, and the check's own process
never holds a CUDA context):

    python -m workshop_lib.gpu_check.probes cuda-info --out F.json
    python -m workshop_lib.gpu_check.probes largest-batch --out F.json
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


PROBES = {"cuda-info": cuda_info, "largest-batch": largest_batches}


def main(argv=None):
    parser = cli.ArgumentParser(prog="python -m workshop_lib.gpu_check.probes")
    parser.add_argument("probe", choices=sorted(PROBES))
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
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
