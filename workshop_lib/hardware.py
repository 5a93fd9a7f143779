"""What this machine has, and the device, backend, process and thread choices that follow.

``Machine`` is the one description of the hardware that every hardware-dependent choice
reads: the workshop profile (``profile.py``), ``doctor``, the launcher, the bench, the
sweeps and the tests. ``detect()`` asks PyTorch and ``nvidia-smi``; a test builds a
``Machine`` by hand to check what the course does on a machine it is not running on (one
GPU, eight GPUs, GPUs the driver cannot serve, GPUs this PyTorch build has no kernels for,
a 64-core CPU box).
"""
import functools
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass

import torch

from workshop_lib.errors import CourseError

CPU_PROCESSES = 2  # processes of a DDP launch where there are fewer than two GPUs
# The oldest NVIDIA driver that runs each CUDA major version PyTorch can be built for
# (NVIDIA's minor-version compatibility: CUDA 13.x needs r580, 12.x r525, 11.x r450).
MIN_DRIVER = {11: 450, 12: 525, 13: 580}
DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")
SHARERS_ENV = "WORKSHOP_PROCESSES_ON_MACHINE"  # set by launchers that start several jobs


@dataclass(frozen=True)
class Machine:
    """The hardware facts the course's choices depend on."""

    gpus: int = 0                  # GPUs PyTorch can use (0 if it cannot serve any of them)
    gpu_names: tuple = ()
    gpu_memory_gib: tuple = ()
    listed_gpus: int = 0           # GPUs nvidia-smi lists (0 where it is not installed)
    driver: str | None = None      # the NVIDIA driver's version, from nvidia-smi
    torch_cuda: str | None = None  # the CUDA version PyTorch was built for (None: CPU build)
    cpu_cores: int = 1
    interconnect: str | None = None  # "NVLink" or "PCIe" between GPUs (nvidia-smi topo -m)
    # GPUs PyTorch sees but whose compute capability this build has no kernels for
    # ("cuda:0 Tesla V100-SXM2-16GB (sm_70)"), and the build's torch.cuda.get_arch_list()
    unserved_gpus: tuple = ()
    cuda_archs: tuple = ()
    # The CPU's convolutions run through oneDNN (PyTorch's builds for x86-64): the training
    # scripts then train convolutions in channels_last on the CPU (memory_format).
    onednn_cpu: bool = False

    @property
    def ddp_nproc(self):
        """Processes of a DDP launch: one per GPU with two or more, else ``CPU_PROCESSES``
        on the CPU (NCCL cannot run two ranks on one GPU)."""
        return self.gpus if self.gpus >= 2 else CPU_PROCESSES

    def threads_per_process(self, processes):
        return threads_per_process(processes, self.cpu_cores)

    def driver_problem(self):
        """A sentence when the driver is too old for this PyTorch's CUDA, else None."""
        if not (self.driver and self.torch_cuda):
            return None
        needed = MIN_DRIVER.get(int(self.torch_cuda.split(".")[0]))
        if needed is None or int(self.driver.split(".")[0]) >= needed:
            return None
        return (f"NVIDIA driver {self.driver} is too old for this PyTorch (built for CUDA "
                f"{self.torch_cuda}, which needs driver {needed} or newer): update the "
                f"driver, or install a PyTorch built for an older CUDA")

    def unserved_gpus_problem(self):
        """A sentence when PyTorch sees GPUs this build has no kernels for, else None.

        torch only warns about them, ``is_available()`` stays True, and then every kernel
        fails; the course counts them as no GPU."""
        if not self.unserved_gpus:
            return None
        return (f"this PyTorch build has no kernels for {', '.join(self.unserved_gpus)} (it "
                f"is built for {' '.join(self.cuda_archs)}), so the course uses no GPU: "
                f"install a PyTorch built for this GPU, or hide it with CUDA_VISIBLE_DEVICES")

    def unusable_gpus_problem(self):
        """A sentence when nvidia-smi lists GPUs that PyTorch cannot use, else None."""
        hidden = self.listed_gpus - self.gpus
        if hidden <= 0 or self.unserved_gpus:  # unserved_gpus_problem says why
            return None
        if os.environ.get("CUDA_VISIBLE_DEVICES") is not None and self.gpus:
            return (f"nvidia-smi lists {self.listed_gpus} GPUs; CUDA_VISIBLE_DEVICES="
                    f"{os.environ['CUDA_VISIBLE_DEVICES']!r} leaves PyTorch {self.gpus}")
        why = self.driver_problem() or (
            "PyTorch is a CPU-only build" if self.torch_cuda is None
            else "check `nvidia-smi` and CUDA_VISIBLE_DEVICES")
        return f"nvidia-smi lists {self.listed_gpus} GPU(s) that PyTorch cannot use: {why}"


def threads_per_process(processes, cores=None):
    """Each CPU process's share of the cores (at least one intra-op thread)."""
    return max(1, (cores or cpu_cores()) // max(1, processes))


def cpu_cores():
    """Cores this process may run on (respects containers' CPU sets, unlike os.cpu_count)."""
    return len(os.sched_getaffinity(0))


def serves(capability, archs):
    """Whether a PyTorch built for ``archs`` (``torch.cuda.get_arch_list()``) runs kernels on
    a GPU of compute capability ``(major, minor)``.

    ``sm_XY`` is machine code for capability X.Y, which runs on X.Z for Z >= Y (``sm_XYa``:
    on X.Y alone); ``compute_XY`` is PTX, compiled on load for X.Y and anything newer. An
    empty list (no CUDA build, or no driver to ask) says nothing: served, as torch's own
    check assumes."""
    if not archs:
        return True
    major, minor = capability
    for arch in archs:
        kind, _, code = arch.partition("_")
        digits = code.rstrip("af")
        if not digits.isdigit() or len(digits) < 2:
            continue
        built = (int(digits[:-1]), int(digits[-1]))
        if kind == "compute" and (major, minor) >= built:
            return True
        if kind == "sm" and major == built[0] and (
                minor == built[1] if code.endswith("a") else minor >= built[1]):
            return True
    return False


def unserved(capabilities, archs, names=None):
    """``"cuda:I NAME (sm_XY)"`` for each GPU of ``capabilities`` (``[(major, minor)]``,
    by index) that a build for ``archs`` cannot serve."""
    names = names or [None] * len(capabilities)
    return tuple(f"cuda:{i}{f' {name}' if name else ''} (sm_{major}{minor})"
                 for i, (name, (major, minor)) in enumerate(zip(names, capabilities, strict=True))
                 if not serves((major, minor), archs))


def usable_gpus():
    """GPUs PyTorch can use here: those it sees, or none if the build cannot serve one of
    them (ranks take GPUs by index from cuda:0, so one without kernels cannot be stepped
    over; CUDA_VISIBLE_DEVICES can hide it). Asks no GPU anything where the build names
    no architectures."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    archs = torch.cuda.get_arch_list() if count else []
    if not archs:
        return count
    capabilities = [torch.cuda.get_device_capability(i) for i in range(count)]
    return 0 if unserved(capabilities, archs) else count


@functools.lru_cache(maxsize=1)
def detect():
    """This machine's ``Machine`` (asked once per process)."""
    listed, driver = _nvidia_smi_gpus()
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    names = [torch.cuda.get_device_name(i) for i in range(visible)]
    archs = tuple(torch.cuda.get_arch_list()) if visible else ()
    not_served = unserved([torch.cuda.get_device_capability(i) for i in range(visible)],
                          archs, names) if archs else ()
    count = 0 if not_served else visible
    return Machine(
        gpus=count,
        gpu_names=tuple(names[:count]),
        gpu_memory_gib=tuple(round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1)
                             for i in range(count)),
        listed_gpus=listed, driver=driver, torch_cuda=torch.version.cuda,
        cpu_cores=cpu_cores(),
        interconnect=interconnect(gpu_topology()) if count > 1 else None,
        unserved_gpus=not_served, cuda_archs=archs, onednn_cpu=onednn_cpu(),
    )


@functools.cache
def onednn_cpu():
    """True where this PyTorch runs the CPU's convolutions through oneDNN: its builds for
    x86-64 (on Arm, oneDNN's convolutions depend on the build: not assumed)."""
    return (torch.backends.mkldnn.is_available()
            and platform.machine().lower() in ("x86_64", "amd64"))


def memory_format(device, channels_last=False, machine=None):
    """The layout the training scripts put the model and the images in on ``device``:
    channels_last where asked (``--channels-last``: the layout Tensor Cores' convolutions
    read fastest) and on a CPU whose convolutions run through oneDNN, which reads it
    fastest too (measured on an x86-64 CPU, one thread, the course's CNN on digits: 34
    epochs at batch 32 in 16.7 s against 22.3 s in NCHW, at batch 512 in 6.3 s against
    8.6 s; BENCHMARKS.md); else PyTorch's default, NCHW. ``machine``: this one's
    (``onednn_cpu()``) by default."""
    onednn = machine.onednn_cpu if machine else onednn_cpu()
    on_onednn_cpu = torch.device(device).type == "cpu" and onednn
    return torch.channels_last if channels_last or on_onednn_cpu else torch.contiguous_format


def _nvidia_smi(*args):
    if not shutil.which("nvidia-smi"):
        return None
    try:
        result = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True,
                                timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout if result.returncode == 0 else None


def _nvidia_smi_gpus():
    """(GPUs nvidia-smi lists, driver version): what the driver sees, whatever torch can."""
    out = _nvidia_smi("--query-gpu=driver_version", "--format=csv,noheader")
    versions = [line.strip() for line in (out or "").splitlines() if line.strip()]
    return len(versions), (versions[0] if versions else None)


def gpu_topology():
    """``nvidia-smi topo -m`` (NVLink vs PCIe between GPUs), or None where unavailable."""
    return _nvidia_smi("topo", "-m")


def interconnect(topology):
    """"NVLink" if any two GPUs are joined by NVLink (``NV#`` in the matrix), else "PCIe"."""
    if not topology:
        return None
    rows = [line.split() for line in topology.splitlines() if line.startswith("GPU")]
    return "NVLink" if any(re.fullmatch(r"NV\d+", cell) for row in rows for cell in row) \
        else "PCIe"


def device_flag(text):
    """A ``--device`` value: auto, cpu, cuda or cuda:N."""
    if not DEVICE_PATTERN.fullmatch(text):
        import argparse

        raise argparse.ArgumentTypeError(f"--device takes auto, cpu, cuda or cuda:N, got {text!r}")
    return text


def pick_device(requested="auto", local_rank=0, local_world_size=1):
    """The device for process ``local_rank`` of ``local_world_size`` on this machine."""
    gpus = 0 if requested == "cpu" else usable_gpus()
    if requested == "cpu" or (requested == "auto" and not gpus):
        return torch.device("cpu")
    if gpus == 0:
        why = "sees no GPU" if not torch.cuda.is_available() else \
            "has no kernels for this GPU (its build does not serve its compute capability)"
        raise CourseError(f"--device {requested} but PyTorch {why} here; use --device "
                          f"cpu (`python -m workshop_lib doctor` says why)")
    if requested.startswith("cuda:"):
        index = int(requested.split(":")[1])
        if index >= gpus:
            raise CourseError(f"--device {requested} but only {gpus} GPU(s) are visible "
                              f"(cuda:0 to cuda:{gpus - 1})")
        return torch.device("cuda", index)
    if local_world_size > gpus:
        raise CourseError(
            f"{local_world_size} process(es) on this machine but {gpus} GPU(s) visible; "
            f"launch with --nproc-per-node={gpus} (or --device cpu to share the CPU)"
        )
    return torch.device("cuda", local_rank)


def backend_for(device):
    """NCCL talks GPU to GPU directly; gloo works on CPU tensors."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def processes_on_this_machine():
    """Processes sharing this machine's cores: torchrun's LOCAL_WORLD_SIZE, unless the
    launcher that started several jobs here (a parallel sweep, several torchrun agents
    playing nodes) says how many share it in WORKSHOP_PROCESSES_ON_MACHINE; else 1."""
    for name in (SHARERS_ENV, "LOCAL_WORLD_SIZE"):
        if os.environ.get(name, "").isdigit() and int(os.environ[name]) > 0:
            return int(os.environ[name])
    return 1


def configure_cpu_threads(device):
    """Give this CPU process its share of the cores (at least one intra-op thread).

    More threads than cores makes the processes fight over them; measured throughput is
    then meaningless. Returns the thread count set (0 on a GPU, where it does not matter).
    """
    if device.type != "cpu":
        return 0
    threads = threads_per_process(processes_on_this_machine())
    torch.set_num_threads(threads)
    return threads


def describe():
    """Software and hardware facts recorded in every run log's header."""
    machine = detect()
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": machine.gpus > 0,
        "gpus": [{"name": name, "memory_gib": memory}
                 for name, memory in zip(machine.gpu_names, machine.gpu_memory_gib,
                                         strict=True)],
        "driver": machine.driver,
        "interconnect": machine.interconnect,
        "cpu_cores": machine.cpu_cores,
        "platform": platform.platform(),
        "hostname": platform.node(),
    }


def synchronize(device):
    """Wait for queued GPU work, so that a clock read after it measures it (no-op on CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
