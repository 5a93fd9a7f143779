"""What this machine has, and the device, backend and thread settings that follow from it."""
import os
import platform
import shutil
import subprocess
import sys

import torch

from workshop_lib.errors import CourseError

DEVICE_CHOICES = ("auto", "cpu", "cuda")
CPU_PROCESSES = 2  # ranks to launch on a machine with no GPU


def cpu_cores():
    """Cores this process may run on (respects containers' CPU sets, unlike os.cpu_count)."""
    return len(os.sched_getaffinity(0))


def default_nproc():
    """Processes per machine the course launches: one per GPU, else ``CPU_PROCESSES``."""
    return torch.cuda.device_count() or CPU_PROCESSES


def pick_device(requested="auto", local_rank=0, local_world_size=1):
    """The device for process ``local_rank`` of ``local_world_size`` on this machine."""
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    gpus = torch.cuda.device_count()
    if gpus == 0:
        raise CourseError("--device cuda but no GPU is visible here; use --device cpu (or auto)")
    if local_world_size > gpus:
        raise CourseError(
            f"{local_world_size} process(es) on this machine but {gpus} GPU(s) visible; "
            f"launch with --nproc-per-node={gpus} (or --device cpu to share the CPU)"
        )
    return torch.device("cuda", local_rank)


def backend_for(device):
    """NCCL talks GPU to GPU directly; gloo works on CPU tensors."""
    return "nccl" if device.type == "cuda" else "gloo"


def configure_cpu_threads(device, processes_on_this_machine):
    """Give each CPU process its share of the cores (at least one intra-op thread).

    More threads than cores makes the ranks fight over them; measured throughput is then
    meaningless. Returns the thread count set (0 on a GPU, where it does not matter).
    """
    if device.type != "cpu":
        return 0
    threads = max(1, cpu_cores() // processes_on_this_machine)
    torch.set_num_threads(threads)
    return threads


def gpus():
    return [
        {
            "name": torch.cuda.get_device_name(i),
            "memory_gib": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1),
        }
        for i in range(torch.cuda.device_count())
    ]


def gpu_topology():
    """``nvidia-smi topo -m`` (NVLink vs PCIe between GPUs), or None where unavailable."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                             timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def describe():
    """Software and hardware facts recorded in every run log's header."""
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "gpus": gpus(),
        "cpu_cores": cpu_cores(),
        "platform": platform.platform(),
        "hostname": platform.node(),
    }
