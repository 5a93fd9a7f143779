"""What the course does on each shape of machine, from a hand-built machine description.

No test here depends on the machine it runs on: each builds the ``Machine`` it is about
(no GPU, one GPU, four, eight, GPUs the driver cannot serve, a 64-core box) and checks the
choices the profile, the doctor and the launcher make for it.
"""
import pytest

from workshop_lib import doctor, hardware, profile
from workshop_lib.errors import CourseError
from workshop_lib.hardware import Machine

LAPTOP = Machine(gpus=0, cpu_cores=8)
BIG_CPU = Machine(gpus=0, cpu_cores=64)
ONE_GPU = Machine(gpus=1, gpu_names=("NVIDIA L4",), gpu_memory_gib=(22.0,), listed_gpus=1,
                  driver="580.65.06", torch_cuda="13.0", cpu_cores=16)
FOUR_GPUS = Machine(gpus=4, gpu_names=("NVIDIA A100-SXM4-80GB",) * 4,
                    gpu_memory_gib=(79.2,) * 4, listed_gpus=4, driver="580.65.06",
                    torch_cuda="13.0", cpu_cores=64, interconnect="NVLink")
EIGHT_GPUS = Machine(gpus=8, gpu_names=("NVIDIA H100 80GB HBM3",) * 8,
                     gpu_memory_gib=(79.6,) * 8, listed_gpus=8, driver="590.10",
                     torch_cuda="13.0", cpu_cores=192, interconnect="NVLink")
OLD_DRIVER = Machine(gpus=0, listed_gpus=4, driver="550.54.15", torch_cuda="13.0",
                     cpu_cores=32)


@pytest.fixture
def no_fashion(tmp_path):
    """A data folder without Fashion-MNIST."""
    return tmp_path


@pytest.fixture
def with_fashion(tmp_path):
    from workshop_lib import data

    raw = data.fashion_mnist_raw_dir(tmp_path)
    raw.mkdir(parents=True)
    for name in data.FASHION_MNIST_FILES:
        (raw / name).write_bytes(b"")
    return tmp_path


def get(machine, data_dir, **overrides):
    return profile.get_profile(machine=machine, data_dir=data_dir, **overrides)


@pytest.mark.parametrize("machine", [LAPTOP, BIG_CPU])
def test_no_gpu_everything_on_the_cpu(machine, no_fashion):
    for launches in (profile.ONE_DEVICE, profile.PROCESSES):
        p = get(machine, no_fashion, launches=launches)
        assert (p.name, p.device, p.ddp_device, p.backend) == ("cpu", "cpu", "cpu", "gloo")
        assert p.nproc == hardware.CPU_PROCESSES
        assert (p.dataset, p.model) == ("digits", "cnn")
    assert machine.threads_per_process(2) == machine.cpu_cores // 2


def test_one_gpu_single_device_runs_on_it_and_ddp_lessons_on_cpu_processes(with_fashion):
    one_device = get(ONE_GPU, with_fashion)
    assert (one_device.name, one_device.device) == ("gpu", "cuda")
    assert (one_device.dataset, one_device.model) == ("fashion-mnist", "wrn-16-4")
    processes = get(ONE_GPU, with_fashion, launches=profile.PROCESSES)
    assert (processes.device, processes.ddp_device, processes.backend) == ("cpu", "cpu", "gloo")
    assert processes.nproc == 2
    # Sizes follow the device and dataset actually used: no Wide ResNet on CPU processes.
    assert (processes.dataset, processes.model) == ("digits", "cnn")
    assert any("NCCL cannot run two ranks on one GPU" in note for note in processes.notes)


def test_one_gpu_without_fashion_mnist_gets_digit_sizes(no_fashion):
    p = get(ONE_GPU, no_fashion)
    assert (p.device, p.dataset) == ("cuda", "digits")
    assert (p.model, p.batch_size) == (profile.SIZES[("cpu", "digits")].model,
                                       profile.SIZES[("cpu", "digits")].batch_size)


@pytest.mark.parametrize("machine", [FOUR_GPUS, EIGHT_GPUS])
def test_several_gpus_one_process_per_gpu_with_nccl(machine, with_fashion):
    p = get(machine, with_fashion, launches=profile.PROCESSES)
    assert (p.nproc, p.device, p.ddp_device, p.backend) == (machine.gpus, "cuda", "cuda",
                                                            "nccl")
    assert (p.dataset, p.model) == ("fashion-mnist", "wrn-16-4")
    assert not p.notes


def test_profile_cpu_means_the_cpu_for_every_run_on_a_gpu_machine(with_fashion):
    for launches in (profile.ONE_DEVICE, profile.PROCESSES):
        p = get(FOUR_GPUS, with_fashion, name="cpu", launches=launches)
        assert (p.device, p.ddp_device, p.backend, p.nproc) == ("cpu", "cpu", "gloo", 2)
        assert p.dataset == "digits"
        assert any("Fashion-MNIST is downloaded" in note for note in p.notes)


def test_explicit_dataset_on_the_cpu_gets_cpu_sizes(with_fashion):
    p = get(LAPTOP, with_fashion, dataset="fashion-mnist")
    assert (p.dataset, p.model, p.device) == ("fashion-mnist", "cnn", "cpu")


def test_nproc_override(no_fashion):
    one = get(LAPTOP, no_fashion, nproc=1, launches=profile.PROCESSES)
    assert one.nproc == 1 and any("nproc is 1" in note for note in one.notes)
    more_than_gpus = get(FOUR_GPUS, no_fashion, nproc=8, launches=profile.PROCESSES)
    assert (more_than_gpus.ddp_device, more_than_gpus.backend) == ("cpu", "gloo")
    two_of_four = get(FOUR_GPUS, no_fashion, nproc="2", launches=profile.PROCESSES)
    assert (two_of_four.nproc, two_of_four.ddp_device) == (2, "cuda")


def test_profile_gpu_without_a_gpu_is_one_clear_error(no_fashion):
    with pytest.raises(CourseError, match="needs a GPU that PyTorch can use"):
        get(LAPTOP, no_fashion, name="gpu")
    with pytest.raises(CourseError, match="nproc must be at least 1"):
        get(LAPTOP, no_fashion, nproc=0)
    with pytest.raises(CourseError, match="not downloaded"):
        get(LAPTOP, no_fashion, dataset="fashion-mnist")


def test_gpus_the_driver_cannot_serve_are_named_and_the_course_uses_the_cpu(no_fashion):
    assert "580 or newer" in OLD_DRIVER.driver_problem()
    p = get(OLD_DRIVER, no_fashion)
    assert (p.name, p.ddp_device) == ("cpu", "cpu")
    assert any("nvidia-smi lists 4 GPU(s) that PyTorch cannot use" in n for n in p.notes)
    report = "\n".join(doctor.report(no_fashion, machine=OLD_DRIVER))
    assert "problem: NVIDIA driver 550.54.15 is too old" in report
    assert "course runs: one-device runs on the CPU" in report
    assert ONE_GPU.driver_problem() is None and FOUR_GPUS.unusable_gpus_problem() is None


@pytest.mark.parametrize("machine,expected", [
    (LAPTOP, "DDP launches: 2 processes on the CPU, gloo backend, 4 thread(s) each"),
    (ONE_GPU, "DDP launches: 2 processes on the CPU, gloo backend, 8 thread(s) each"),
    (FOUR_GPUS, "DDP launches: 4 processes, one per GPU, NCCL backend"),
])
def test_doctor_says_what_the_course_will_do(machine, expected, no_fashion):
    report = "\n".join(doctor.report(no_fashion, machine=machine))
    assert expected in report
    if machine.gpus:
        assert f"GPUs PyTorch can use: {machine.gpus}" in report
        assert f"cuda:0 {machine.gpu_names[0]}" in report
    if machine.gpus > 1:
        assert "GPU interconnect: NVLink" in report


def test_interconnect_is_read_from_the_topology_matrix():
    nvlink = """\tGPU0\tGPU1\tCPU Affinity
GPU0\t X \tNV12\t0-63
GPU1\tNV12\t X \t0-63"""
    pcie = """\tGPU0\tGPU1\tCPU Affinity
GPU0\t X \tPHB\t0-15
GPU1\tPHB\t X \t0-15"""
    assert hardware.interconnect(nvlink) == "NVLink"
    assert hardware.interconnect(pcie) == "PCIe"
    assert hardware.interconnect(None) is None


V100_BUILD = ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120")  # torch 2.14.1+cu130
# torch sees four V100s (is_available() is True) but its build has no kernels for sm_70.
V100S = Machine(gpus=0, listed_gpus=4, driver="580.65.06", torch_cuda="13.0", cpu_cores=32,
                unserved_gpus=tuple(f"cuda:{i} Tesla V100-SXM2-16GB (sm_70)" for i in range(4)),
                cuda_archs=V100_BUILD)


@pytest.mark.parametrize("capability, archs, served", [
    ((7, 0), V100_BUILD, False),               # V100 against a cu130 build
    ((6, 1), V100_BUILD, False),               # Pascal
    ((7, 5), V100_BUILD, True),                # T4: its own sm_75
    ((8, 9), V100_BUILD, True),                # L4: sm_86 runs on 8.9 (same major, newer)
    ((9, 0), ("sm_80", "sm_90a"), True),       # H100: sm_90a is 9.0's own
    ((10, 0), ("sm_80", "sm_90a"), False),     # sm_90a runs on 9.0 alone
    ((10, 0), ("sm_80", "compute_80"), True),  # PTX compiles for anything newer
    ((7, 0), ("sm_80", "compute_80"), False),  # ... but not older
    ((7, 0), (), True),                        # no list (no driver to ask): torch says nothing
])
def test_what_a_build_serves_follows_its_arch_list(capability, archs, served):
    assert hardware.serves(capability, archs) is served


def test_gpus_the_build_cannot_serve_count_as_none_and_doctor_says_why(no_fashion):
    p = get(V100S, no_fashion)
    assert (p.name, p.device, p.ddp_device) == ("cpu", "cpu", "cpu")
    problem = V100S.unserved_gpus_problem()
    assert "no kernels for cuda:0 Tesla V100-SXM2-16GB (sm_70)" in problem
    assert "sm_75 sm_80" in problem and problem in p.notes
    report = doctor.report(no_fashion, machine=V100S)
    assert "GPUs PyTorch can use: none (it sees 4, and this build has no kernels for them)" \
        in report
    assert f"problem: {problem}" in report
    assert sum(problem in line for line in report) == 1  # said once, not again as a note
    with pytest.raises(CourseError, match="needs a GPU that PyTorch can use"):
        get(V100S, no_fashion, name="gpu")
    assert FOUR_GPUS.unserved_gpus_problem() is None


class FakeCuda:
    """torch.cuda as it answers on a machine with GPUs of ``capabilities``."""

    def __init__(self, capabilities, archs, name="Tesla V100-SXM2-16GB"):
        self.capabilities, self.archs, self.name = capabilities, archs, name

    def install(self, monkeypatch):
        cuda = hardware.torch.cuda
        monkeypatch.setattr(cuda, "is_available", lambda: True)
        monkeypatch.setattr(cuda, "device_count", lambda: len(self.capabilities))
        monkeypatch.setattr(cuda, "get_arch_list", lambda: list(self.archs))
        monkeypatch.setattr(cuda, "get_device_capability", lambda i: self.capabilities[i])
        monkeypatch.setattr(cuda, "get_device_name", lambda i: self.name)
        monkeypatch.setattr(cuda, "get_device_properties",
                            lambda i: type("Properties", (), {"total_memory": 16 * 2**30}))
        monkeypatch.setattr(hardware, "_nvidia_smi_gpus",
                            lambda: (len(self.capabilities), "580.65.06"))
        monkeypatch.setattr(hardware, "gpu_topology", lambda: None)


@pytest.mark.parametrize("capabilities, usable", [
    ([(7, 0)] * 2, 0),             # two V100s, a cu130 build: none usable
    ([(8, 0), (7, 0)], 0),         # one of them unserved: ranks take cuda:0, cuda:1, ...
    ([(8, 0), (8, 0)], 2),         # two A100s
])
def test_detection_counts_only_gpus_the_build_serves(capabilities, usable, monkeypatch):
    FakeCuda(capabilities, V100_BUILD).install(monkeypatch)
    machine = hardware.detect.__wrapped__()
    assert machine.gpus == hardware.usable_gpus() == usable
    assert machine.cuda_archs == V100_BUILD
    assert len(machine.unserved_gpus) == sum(c == (7, 0) for c in capabilities)
    assert (machine.unserved_gpus_problem() is None) == (usable > 0)
    assert machine.unusable_gpus_problem() is None  # the unserved problem says it
    if usable:
        assert hardware.pick_device("auto").type == "cuda"
    else:
        assert hardware.pick_device("auto").type == "cpu"
        with pytest.raises(CourseError, match="has no kernels for this GPU"):
            hardware.pick_device("cuda")


def test_a_job_describes_its_hardware_once_from_rank_0(tmp_path, monkeypatch):
    """hardware.describe() runs nvidia-smi twice (the GPUs, then ``topo -m``): rank 0
    records it in the run log; the other ranks' logs are off and ask nothing."""
    import argparse

    from workshop_lib import runlog

    asked = []
    monkeypatch.setattr(hardware, "describe", lambda: asked.append(1) or {"gpus": []})
    args = argparse.Namespace(epochs=1)
    runlog.RunLog(tmp_path / "other", enabled=False).start("train_ddp", args, world_size=2)
    assert asked == []
    (tmp_path / "rank0").mkdir()
    runlog.RunLog(tmp_path / "rank0").start("train_ddp", args, world_size=2)
    assert asked == [1]
    assert runlog.read(tmp_path / "rank0").start["hardware"] == {"gpus": []}


X86_LAPTOP = Machine(gpus=0, cpu_cores=8, onednn_cpu=True)


@pytest.mark.parametrize("machine", [LAPTOP, X86_LAPTOP, FOUR_GPUS])
def test_the_training_layout_is_channels_last_where_asked_or_on_a_onednn_cpu(machine):
    """The CPU's convolutions in channels_last where oneDNN runs them (its fastest layout
    there), GPUs' where --channels-last asks; NCHW otherwise. The doctor says which."""
    import torch

    cpu = hardware.memory_format("cpu", machine=machine)
    assert cpu == (torch.channels_last if machine.onednn_cpu else torch.contiguous_format)
    assert hardware.memory_format("cpu", channels_last=True, machine=machine) \
        == torch.channels_last
    assert hardware.memory_format("cuda:1", machine=machine) == torch.contiguous_format
    assert hardware.memory_format("cuda:1", True, machine) == torch.channels_last
    said = "convolutions through oneDNN" in "\n".join(doctor.report(machine=machine))
    assert said == machine.onednn_cpu


def test_the_cpu_layout_changes_the_speed_not_the_training():
    """Five steps of the course's CNN from one initialisation, on the same batches, in NCHW
    and in channels_last: the same parameters (to float32 rounding of the kernels' order)."""
    import torch

    from workshop_lib import data, models, optim, train

    train_set, _, info = data.load("digits")
    images, labels = train_set.tensors
    trained = []
    for layout in (torch.contiguous_format, torch.channels_last):
        torch.manual_seed(0)
        model = models.build("cnn", info).to(memory_format=layout)
        optimizer = optim.build("sgd", model.parameters(), 0.05, optim.MOMENTUM,
                                optim.WEIGHT_DECAY)
        for step in range(5):
            batch = slice(64 * step, 64 * (step + 1))
            train.train_step(model, optimizer,
                             images[batch].contiguous(memory_format=layout), labels[batch])
        trained.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert torch.allclose(*trained, atol=1e-5), (trained[0] - trained[1]).abs().max()
