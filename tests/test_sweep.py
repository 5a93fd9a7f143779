"""Sweeps of single-device runs: one after another on one device, one per GPU on several."""
import re

import pytest

from workshop_lib import hardware, runlog, sweep
from workshop_lib.errors import CourseError
from workshop_lib.hardware import Machine

FOUR_GPUS = Machine(gpus=4, listed_gpus=4, cpu_cores=32)
LAPTOP = Machine(gpus=0, cpu_cores=8)


def test_runs_go_one_per_gpu_on_a_machine_with_several():
    assert sweep.workers_for("auto", "auto", FOUR_GPUS) == [f"cuda:{i}" for i in range(4)]
    assert sweep.workers_for("auto", "cuda", FOUR_GPUS) == [f"cuda:{i}" for i in range(4)]
    assert sweep.workers_for("2", "cuda", FOUR_GPUS) == ["cuda:0", "cuda:1"]


def test_runs_stay_in_this_process_on_one_device():
    assert sweep.workers_for("auto", "auto", LAPTOP) == [None]
    assert sweep.workers_for("auto", "cpu", FOUR_GPUS) == [None], "--device cpu: the CPU"
    assert sweep.workers_for("auto", "cuda", Machine(gpus=1)) == [None]
    assert sweep.workers_for("3", "cpu", LAPTOP) == ["cpu"] * 3


@pytest.mark.parametrize("parallel,device,message", [
    ("5", "cuda", "--parallel 5 but 4 GPU(s)"),
    ("0", "cuda", "--parallel must be at least 1"),
    ("2", "cuda:1", "each take a GPU of their own"),
])
def test_impossible_parallel_requests_are_one_clear_error(parallel, device, message):
    machine = FOUR_GPUS if device != "cuda:1" else LAPTOP
    with pytest.raises(CourseError, match=re.escape(message)):
        sweep.workers_for(parallel, device, machine)


def test_the_device_flag_is_read_from_the_common_flags():
    assert sweep.requested_device(["--epochs", "2", "--device", "cuda"]) == "cuda"
    assert sweep.requested_device(["--device", "cpu", "--device", "cuda:1"]) == "cuda:1"
    assert sweep.requested_device(["--epochs", "2"]) == "auto"


@pytest.mark.slow
def test_parallel_workers_run_every_run_and_share_the_cores(tmp_path):
    """The path a multi-GPU machine takes (a worker per device), run here on the CPU."""
    runs = [("bs32", ["--batch-size", "32"]), ("bs64", ["--batch-size", "64"]),
            ("bs128", ["--batch-size", "128"])]
    common = ["--device", "cpu", "--dataset", "digits", "--epochs", "3"]
    results = sweep.run_sweep(tmp_path, runs, common, parallel="2")
    assert set(results) == {"bs32", "bs64", "bs128"}
    for name, run in results.items():
        assert run.start["device"] == "cpu" and run.end is not None
        assert run.start["threads_per_process"] == hardware.threads_per_process(2)
        assert run.final["val_acc"] > 0.8, (name, run.column("val_acc"))
    assert runlog.read(tmp_path / "bs64").start["batch_size"] == 64
