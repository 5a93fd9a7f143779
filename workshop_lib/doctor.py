"""What a learner needs to know before the workshop starts, and what to do if it is missing.

    python -m workshop_lib doctor

Notebook 00 shows the same report.
"""
from pathlib import Path

import torch

from workshop_lib import cli, data, hardware, profile


def report(data_dir=data.DEFAULT_DATA_DIR, machine=None):
    """Lines describing this machine (or ``machine``) and what the course does on it."""
    machine = machine or hardware.detect()
    lines = [f"torch {torch.__version__}, CUDA {machine.torch_cuda or 'not built'}"
             + (f", NVIDIA driver {machine.driver}" if machine.driver else "")]
    if machine.gpus:
        lines.append(f"GPUs PyTorch can use: {machine.gpus}")
        lines += [f"  cuda:{i} {name}, {memory} GiB" for i, (name, memory)
                  in enumerate(zip(machine.gpu_names, machine.gpu_memory_gib, strict=True))]
    elif machine.unserved_gpus:
        lines.append(f"GPUs PyTorch can use: none (it sees {len(machine.unserved_gpus)}, "
                     f"and this build has no kernels for them)")
    else:
        lines.append("GPUs PyTorch can use: none (torch.cuda.is_available() is False)")
    found = [p for p in (machine.driver_problem(), machine.unserved_gpus_problem(),
                         machine.unusable_gpus_problem()) if p]
    # Each once: the listed GPUs' reason may quote the driver's, the profile's notes both.
    problems = [p for p in found if not any(other != p and other in p for other in found)]
    lines += [f"problem: {problem}" for problem in problems]
    if machine.gpus > 1:
        lines.append(f"GPU interconnect: {machine.interconnect or 'unknown'} "
                     f"(`nvidia-smi topo -m`: NV# = NVLink; PIX, PHB, SYS = PCIe)")
    lines.append(f"CPU: {machine.cpu_cores} core(s)" + (
        ", convolutions through oneDNN (the training scripts train them in channels_last "
        "there, its fastest layout)" if machine.onednn_cpu else ""))

    chosen = profile.get_profile(machine=machine, data_dir=data_dir)
    if chosen.ddp_device == "cuda":
        ddp = f"{chosen.nproc} processes, one per GPU, NCCL backend"
    else:
        ddp = (f"{chosen.nproc} processes on the CPU, gloo backend, "
               f"{machine.threads_per_process(chosen.nproc)} thread(s) each")
    lines.append(f"course runs: one-device runs on {chosen.one_device_name}; DDP launches: {ddp}")
    lines += [f"  note: {note}" for note in chosen.notes if note not in found]
    if chosen.ddp_device == "cpu" and not machine.gpus:
        lines.append("  everything works; speed-ups are small because the processes share "
                     "the CPU")
    if machine.gpus:
        lines.append("watch the GPUs: the GPU Dashboards panel in JupyterLab's left bar, "
                     "or `nvidia-smi -l 1` in a terminal")
    for info in data.DATASETS.values():
        state = "available" if data.is_available(info.name, data_dir) else "not downloaded"
        lines.append(f"dataset {info.name}: {state} ({info.description})")
    lines.append(data.auto_choice_message(data_dir))
    return lines


def main(argv=None):
    parser = cli.ArgumentParser(prog="python -m workshop_lib doctor", description=__doc__)
    parser.add_argument("--data-dir", type=Path, default=data.DEFAULT_DATA_DIR)
    args = parser.parse_args(argv)
    print("\n".join(report(args.data_dir)))
    return 0
