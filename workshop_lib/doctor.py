"""What a learner needs to know before the workshop starts, and what to do if it is missing.

    python -m workshop_lib doctor
"""
import argparse
from pathlib import Path

import torch

from workshop_lib import data, hardware


def report(data_dir=data.DEFAULT_DATA_DIR):
    """Lines describing this machine and the choices the course makes on it."""
    lines = [f"torch {torch.__version__}, CUDA {torch.version.cuda or 'not built'}"]
    gpus = hardware.gpus()
    if gpus:
        lines.append(f"GPUs: {len(gpus)}")
        lines += [f"  cuda:{i} {g['name']}, {g['memory_gib']} GiB" for i, g in enumerate(gpus)]
        topology = hardware.gpu_topology()
        if topology and len(gpus) > 1:
            lines.append("GPU interconnect (nvidia-smi topo -m; NV# = NVLink):")
            lines += ["  " + row for row in topology.strip().splitlines()]
        lines.append(f"course runs: NCCL backend, {len(gpus)} process(es), one per GPU")
        lines.append("watch the GPUs: the GPU Dashboards panel in JupyterLab's left bar, "
                     "or `nvidia-smi -l 1` in a terminal")
    else:
        lines.append("GPUs: none visible (torch.cuda.is_available() is False)")
        lines.append(f"course runs: gloo backend on the CPU, {hardware.CPU_PROCESSES} processes, "
                     f"{max(1, hardware.cpu_cores() // hardware.CPU_PROCESSES)} thread(s) each "
                     f"({hardware.cpu_cores()} cores)")
        lines.append("  everything works; speed-ups are small because the processes share "
                     "the CPU. On a GPU machine check the NVIDIA driver with `nvidia-smi`.")
    for info in data.DATASETS.values():
        state = "available" if data.is_available(info.name, data_dir) else "not downloaded"
        lines.append(f"dataset {info.name}: {state} ({info.description})")
    lines.append(data.auto_choice_message(data_dir))
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m workshop_lib doctor", description=__doc__)
    parser.add_argument("--data-dir", type=Path, default=data.DEFAULT_DATA_DIR)
    args = parser.parse_args(argv)
    print("\n".join(report(args.data_dir)))
    return 0
