"""Every NCCL rank makes its own GPU the current CUDA device before it joins the group.

Object collectives (``dist.all_gather_object``, ``broadcast_object_list``, ...) put their
objects on the *current* CUDA device, and ``init_process_group(device_id=...)`` does not
set it (torch 2.14's ``all_gather_object`` docstring: "it is the user's responsibility to
ensure that this is set so that each rank has an individual GPU, via
torch.cuda.set_device()"). Without it every rank sends from cuda:0 and NCCL fails. No GPU
here: the CUDA calls are replaced by recorders, and the tests check the order of calls.
"""
import ast
import json

import pytest
import torch
import torch.distributed as dist

from conftest import REPO
from workshop_lib import distributed, hardware, train_ddp


@pytest.fixture
def calls(monkeypatch):
    """Record set_device and init/destroy of the process group, in order; run nothing."""
    seen = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: seen.append(
        ("set_device", torch.device(device))))
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kwargs: seen.append(
        ("init", backend, kwargs.get("device_id"))))
    monkeypatch.setattr(dist, "destroy_process_group", lambda *a: seen.append(("destroy",)))
    return seen


def test_the_process_group_helper_sets_the_current_gpu_before_joining(calls):
    gpu = torch.device("cuda", 3)
    with distributed.process_group("nccl", device=gpu):
        pass
    assert calls == [("set_device", gpu), ("init", "nccl", gpu), ("destroy",)]


def test_the_process_group_helper_leaves_cuda_alone_on_the_cpu(calls):
    with distributed.process_group("gloo", device=torch.device("cpu")):
        pass
    assert calls == [("init", "gloo", None), ("destroy",)]


def test_train_ddp_sets_the_current_gpu_before_joining(calls, monkeypatch, tmp_path):
    gpu = torch.device("cuda", 1)  # local rank 1 of two on a two-GPU machine
    for name, value in {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2",
                        "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(hardware, "pick_device", lambda requested, local_rank, local_world_size:
                        torch.device("cuda", local_rank))
    monkeypatch.setattr(train_ddp, "fit", lambda *args: calls.append(("fit",)))
    train_ddp.main(["--device", "cuda", "--out", str(tmp_path)])
    assert calls == [("set_device", gpu), ("init", "nccl", gpu), ("fit",), ("destroy",)]


# -- Every entry point, read from its source -------------------------------------------


def sources():
    """``(where, source)`` of the library, the exercise files and the notebooks' and the
    assessment's ``%%writefile`` scripts."""
    for path in sorted((REPO / "workshop_lib").rglob("*.py")):
        yield str(path.relative_to(REPO)), path.read_text()
    for notebook in [*sorted((REPO / "notebooks").glob("*.ipynb")),
                     *sorted((REPO / "assessment/source").rglob("*.ipynb"))]:
        for cell in json.loads(notebook.read_text())["cells"]:
            source = "".join(cell["source"])
            if source.startswith("%%writefile ") and source.split()[1].endswith(".py"):
                first, body = source.split("\n", 1)
                yield f"{notebook.name}: {first}", body


def called(node, name):
    function = node.func if isinstance(node, ast.Call) else None
    return (isinstance(function, ast.Attribute) and function.attr == name) or \
        (isinstance(function, ast.Name) and function.id == name)


def gloo_only(call):
    return bool(call.args) and isinstance(call.args[0], ast.Constant) and \
        call.args[0].value == "gloo"


def unset_current_devices():
    """Process groups that may be NCCL joined without the current device being set:
    ``process_group(...)`` without ``device=``, or ``init_process_group`` in a function
    that does not call ``set_device`` before it."""
    problems = []
    for where, source in sources():
        for function in ast.walk(ast.parse(source)):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            nodes = [n for n in ast.walk(function) if isinstance(n, ast.Call)]
            set_at = [n.lineno for n in nodes if called(n, "set_device")]
            for call in nodes:
                if gloo_only(call) or function.name == "process_group":
                    continue
                if called(call, "process_group") and not any(
                        k.arg == "device" for k in call.keywords):
                    problems.append(f"{where}:{call.lineno} process_group without device=")
                if called(call, "init_process_group") and not any(
                        line < call.lineno for line in set_at):
                    problems.append(f"{where}:{call.lineno} init_process_group before any "
                                    f"torch.cuda.set_device")
    return problems


def test_every_group_that_may_be_nccl_sets_the_current_device_first():
    assert unset_current_devices() == []


def test_the_reader_finds_a_missing_set_device(monkeypatch):
    monkeypatch.setattr(f"{__name__}.sources", lambda: [("job.py", (
        "def main(device):\n"
        "    dist.init_process_group('nccl')\n"
        "    with distributed.process_group(backend_for(device)):\n"
        "        pass\n"))])
    assert unset_current_devices() == [
        "job.py:2 init_process_group before any torch.cuda.set_device",
        "job.py:3 process_group without device="]
