"""A CPU tensor inside device code, caught on a machine without a GPU.

On a GPU, ``torch.stack``/``cat`` and elementwise operations refuse a CPU tensor beside CUDA
ones ("Expected all tensors to be on the same device"); a ``torch.tensor(n)`` or
``torch.zeros(3)`` without ``device=`` in a training loop is that bug. The meta device
(tensors with a shape and no data) refuses them too ("Tensor on device cpu is not on the
expected device meta!"), so every script below runs its device code once on ``meta``: the
course's training steps and evaluations, the exercise scripts and their reference answers,
the assessment's scripts, the trace's step and the BatchNorm/accumulation comparison.

Three stand-ins make that possible without processes or a GPU:

- ``SameDevice``: meta is lenient where CUDA is not (an in-place ``meta.add_(cpu)`` or
  ``cpu.add_(meta)`` passes), so every operation is checked as CUDA would: no CPU tensor of
  one or more dimensions beside a tensor on the device (0-dim CPU tensors are scalars CUDA
  accepts; indexing and copies move their CPU operands themselves);
- ``PassThroughDDP``: DDP cannot wrap a meta model (its constructor reads the parameters'
  values), and one process has no peers; the stand-in keeps the interface the scripts use
  (``.module``, ``no_sync``, ``register_comm_hook``);
- ``Collectives`` in place of a script's ``dist``: each collective checks that its tensor is
  on the run's device (NCCL refuses a CPU tensor).

Work that reads values (``.item()``, ``.tolist()``, saving files) cannot run on meta and is
left out; each script's device code ends in tensors that the driver checks are on the
device. To guard a new script, add one line to ``CASES``.
"""
import ast
import contextlib
import importlib.util
import inspect
import json
import uuid
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from conftest import REPO
from workshop_lib import data, equivalence, input_pipeline, models, train, train_ddp
from workshop_lib.precision import PLAIN
from workshop_lib.trace import capture

META = torch.device("meta")
FILES = REPO / "workshop_lib/labs/files"
ASSESSMENT = REPO / "assessment/source/ddp_refactor"
RANK, WORLD_SIZE = 0, 2  # the rank each run plays, of a two-rank job

# Operations that take CPU operands beside device ones on a GPU too: indices (moved to the
# device by the kernel) and copies between devices (what .to() does).
MOVES_ITS_OPERANDS = {torch.ops.aten.index.Tensor, torch.ops.aten.index_put.default,
                      torch.ops.aten.index_put_.default, torch.ops.aten._index_put_impl_.default,
                      torch.ops.aten.copy_.default, torch.ops.aten._to_copy.default}


class SameDevice(TorchDispatchMode):
    """Raise where an operation mixes tensors on ``device`` with a CPU tensor that CUDA
    would refuse there."""

    def __init__(self, device):
        super().__init__()
        self.device = device

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if func not in MOVES_ITS_OPERANDS and any(t.device == self.device for t in tensors):
            stray = [t for t in tensors if t.device.type == "cpu" and t.dim() > 0]
            if stray:
                raise RuntimeError(f"{func}: a CPU tensor of shape {tuple(stray[0].shape)} "
                                   f"beside tensors on {self.device}")
        return func(*args, **kwargs)


class PassThroughDDP(torch.nn.Module):
    """DistributedDataParallel's interface, as the scripts use it, without communication."""

    def __init__(self, module, device_ids=None, **kwargs):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def no_sync(self):
        return contextlib.nullcontext()

    def register_comm_hook(self, state, hook):
        pass


class Collectives:
    """``torch.distributed`` as a script of rank ``RANK`` calls it: every collective checks
    that its tensor is on the run's device, and changes nothing (one process, no peers)."""

    def __init__(self, device):
        self.device = device
        self.ReduceOp = torch.distributed.ReduceOp
        self.calls = []

    def get_rank(self, group=None):
        return RANK

    def get_world_size(self, group=None):
        return WORLD_SIZE

    def _collective(self, name, tensor):
        assert tensor.device == self.device, \
            f"dist.{name} of a tensor on {tensor.device}, not on {self.device}"
        self.calls.append(name)

    def all_reduce(self, tensor, op=None, group=None, async_op=False):
        self._collective("all_reduce", tensor)

    def broadcast(self, tensor, src=0, group=None, async_op=False):
        self._collective("broadcast", tensor)

    def barrier(self, group=None):
        self.calls.append("barrier")


def load_script(path, monkeypatch, device):
    """Import a script by its path (not run as __main__), with its DDP and its collectives
    replaced by the stand-ins."""
    spec = importlib.util.spec_from_file_location(f"meta_{path.stem}_{uuid.uuid4().hex}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if hasattr(module, "dist"):
        monkeypatch.setattr(module, "dist", Collectives(device))
    if hasattr(module, "DDP"):
        monkeypatch.setattr(module, "DDP", PassThroughDDP)
    return module


def writefile_cells(notebook):
    """``{file name: the text it gets}`` for each ``%%writefile`` cell of a notebook."""
    cells = ["".join(c["source"]) for c in json.loads(notebook.read_text())["cells"]
             if c["cell_type"] == "code"]
    return {c.split("\n", 1)[0].split()[1]: c.split("\n", 1)[1] for c in cells
            if c.startswith("%%writefile ")}


def cell_source(notebook, name):
    return writefile_cells(notebook)[name]


def cell_key(notebook, name):
    return f"{notebook.name}: %%writefile {name}"


def call(function, **available):
    """``function`` called with the arguments it names, picked from ``available``."""
    names = inspect.signature(function).parameters
    return function(**{k: v for k, v in available.items() if k in names})


def assert_on(device, *tensors):
    for t in tensors:
        assert t.device == device, f"a result on {t.device}, not on {device}"


# -- Drivers: one per shape of script --------------------------------------------------


def course_functions(module, device, monkeypatch, wrapped=False):
    """The course's ``train_epoch``/``evaluate`` (train.py, train_ddp.py, notebook 04's jobs):
    the course CNN on digits, batches from ``data.TensorLoader`` on the device."""
    train_set, val_set, info = data.load("digits")
    torch.manual_seed(0)
    model = models.build("cnn", info).to(device)
    wrapper = PassThroughDDP(model) if wrapped else model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    if hasattr(module, "train_epoch"):
        loader = data.TensorLoader(train_set, 64, DistributedSampler(
            train_set, WORLD_SIZE, RANK, seed=0), device)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        # accumulate=2: the no_sync path of train_ddp, and the plain one at the end.
        sums, _ = module.train_epoch(wrapper, loader, optimizer, scheduler, PLAIN, 2, False)
        assert_on(device, sums)
    val_loader = data.TensorLoader(val_set, 512, data.ShardSampler(val_set, RANK, WORLD_SIZE),
                                   device)
    assert_on(device, module.evaluate(model, val_loader))


def exercise_trainer(module, device, monkeypatch):
    """Notebook 02's conversion script (stub, answer, the notebook's cell): its ``Trainer``
    trains one epoch and evaluates (its ``save`` reads values, and is left out)."""
    train_set, val_set = module.load_data()
    torch.manual_seed(0)
    model = PassThroughDDP(module.Net().to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sampler = DistributedSampler(train_set, WORLD_SIZE, RANK, seed=0)
    trainer = call(module.Trainer, model=model, optimizer=optimizer, device=device,
                   train_loader=DataLoader(train_set, batch_size=64, sampler=sampler),
                   val_loader=DataLoader(val_set, batch_size=256), out=None, rank=RANK)
    call(trainer.run_epoch, epoch=1)
    assert_on(device, trainer.evaluate())


def assessment_functions(module, device, monkeypatch):
    """The assessment's scripts: ``train_one_epoch`` and ``evaluate`` with a device
    argument, the MLP on the assessment's digits."""
    train_set, val_set = module.load_data()
    torch.manual_seed(0)
    model = module.build_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    assert_on(device, module.train_one_epoch(model, DataLoader(train_set, batch_size=64),
                                             optimizer, device),
              module.evaluate(model, DataLoader(val_set, batch_size=256), device))


def trace_step(device, monkeypatch, tmp_path):
    """``workshop_lib.trace``: its batches and its timed step, profiled and not."""
    train_set, _, info = data.load("digits")
    torch.manual_seed(0)
    model = PassThroughDDP(models.build("cnn", info).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    batches = capture.batches(train_set, 32, device, RANK, WORLD_SIZE)
    for profiled in (True, False):
        seconds = capture.timed_steps(model, optimizer, batches, PLAIN, device, 2, profiled)
        assert len(seconds) == 2


def input_feeds(device, monkeypatch, tmp_path):
    """``workshop_lib.input_pipeline``: the step fed by the host DataLoader and by the
    device-resident loader (notebook 05's input-bound check)."""
    train_set, _, info = data.load("digits")
    torch.manual_seed(0)
    model = models.build("cnn", info).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    measured = input_pipeline.feeds(model, optimizer, train_set, 32, device, steps=2, rounds=1)
    assert measured["steps"] == 2


def equivalence_helpers(device, monkeypatch, tmp_path):
    """``workshop_lib.equivalence``: the ranks' batches, DDP against one process for each
    variant (SyncBatchNorm included: without a process group it normalises as BatchNorm
    does), and the accumulation loops of the training scripts."""
    monkeypatch.setattr(equivalence, "DDP", PassThroughDDP)
    monkeypatch.setattr(equivalence, "dist", Collectives(device))
    monkeypatch.setattr(train_ddp, "DDP", PassThroughDDP)
    train_set, _, info = data.load("digits")
    mine, union = equivalence.batches(train_set, RANK, WORLD_SIZE, 8, device)
    assert_on(device, *(t for step in mine + union for t in step))
    for variant in ("bn_free", "batchnorm", "sync_batchnorm"):
        assert_on(device, equivalence.compare(variant, info, mine, union, device))
    assert_on(device, equivalence.accumulation(info, mine, device)["max_abs_difference"])


# Each case is called as case(device, monkeypatch, tmp_path).
GUARDED = {}  # the scripts CASES runs: path (in the repository) or notebook cell -> text


def module_functions(module, **options):
    GUARDED[str(Path(module.__file__).relative_to(REPO))] = Path(module.__file__).read_text()
    return lambda device, monkeypatch, tmp_path: course_functions(module, device, monkeypatch,
                                                                  **options)


def script(path, driver):
    GUARDED[str(path.relative_to(REPO))] = path.read_text()
    return lambda device, monkeypatch, tmp_path: driver(load_script(path, monkeypatch, device),
                                                        device, monkeypatch)


def cell_script(notebook, name, driver, syspath=None):
    GUARDED[cell_key(notebook, name)] = cell_source(notebook, name)

    def run(device, monkeypatch, tmp_path):
        if syspath:  # where the cell's script finds its neighbours (digits_data.py)
            monkeypatch.syspath_prepend(str(syspath))
        path = tmp_path / name
        path.write_text(cell_source(notebook, name))
        return driver(load_script(path, monkeypatch, device), device, monkeypatch)
    return run


ASSESSMENT_NOTEBOOK = ASSESSMENT / "ddp_refactor.ipynb"
NOTEBOOK_02 = REPO / "notebooks/02_from_one_gpu_to_many.ipynb"
CASES = {
    "train.py": module_functions(train),
    "train_ddp.py": module_functions(train_ddp, wrapped=True),
    "debugging_stub.py": script(FILES / "debugging_stub.py", course_functions),
    "debugging_solution.py": script(FILES / "debugging_solution.py", course_functions),
    "eval_debugging_stub.py": script(FILES / "eval_debugging_stub.py", course_functions),
    "eval_debugging_solution.py": script(FILES / "eval_debugging_solution.py",
                                         course_functions),
    "conversion_stub.py": script(FILES / "conversion_stub.py", exercise_trainer),
    "conversion_solution.py": script(FILES / "conversion_solution.py", exercise_trainer),
    "notebook 02: my_train_ddp.py": cell_script(NOTEBOOK_02, "my_train_ddp.py",
                                                exercise_trainer),
    "assessment: train_digits.py": cell_script(ASSESSMENT_NOTEBOOK, "train_digits.py",
                                               assessment_functions, syspath=ASSESSMENT),
    "assessment: train_digits_ddp.py (the reference)": cell_script(
        ASSESSMENT_NOTEBOOK, "train_digits_ddp.py", assessment_functions, syspath=ASSESSMENT),
    "trace: the profiled step": trace_step,
    "equivalence: DDP against one process, accumulation": equivalence_helpers,
    "input pipeline: a DataLoader against the resident loader": input_feeds,
}


@pytest.mark.parametrize("name", CASES)
def test_device_code_makes_its_tensors_on_the_device(name, monkeypatch, tmp_path):
    with SameDevice(META):
        CASES[name](META, monkeypatch, tmp_path)


# -- The guard itself: it fails where a GPU would ----------------------------------------


@torch.no_grad()
def evaluate_with_a_cpu_count(model, loader):
    """The bug of notebook 02's first conversion script: a CPU count beside device sums."""
    sums = torch.zeros(3, device=next(model.parameters()).device)
    for x, y in loader:
        logits = model(x)
        sums += torch.stack([F.cross_entropy(logits, y, reduction="sum"),
                             (logits.argmax(1) == y).sum(), torch.tensor(len(y))])
    return sums


@torch.no_grad()
def evaluate_into_a_cpu_vector(model, loader):
    """A CPU vector added in place into device sums: meta alone lets this pass, CUDA
    does not."""
    sums = torch.zeros(2, device=next(model.parameters()).device)
    for x, y in loader:
        logits = model(x)
        sums += torch.stack([F.cross_entropy(logits, y, reduction="sum"),
                             (logits.argmax(1) == y).sum()])
        sums += torch.tensor([0.0, 0.0])  # e.g. a correction kept as CPU numbers
    return sums


@pytest.mark.parametrize("evaluate, message", [
    (evaluate_with_a_cpu_count, "Tensor on device cpu is not on the expected device meta"),
    (evaluate_into_a_cpu_vector, "a CPU tensor of shape (2,) beside tensors on meta"),
])
def test_a_cpu_tensor_beside_device_tensors_fails_the_guard(evaluate, message):
    _, val_set, info = data.load("digits")
    model = models.build("cnn", info).to(META)
    loader = data.TensorLoader(val_set, 512, data.ShardSampler(val_set, 0, 2), META)
    with pytest.raises(RuntimeError, match=message.replace("(", r"\(").replace(")", r"\)")), \
            SameDevice(META):
        evaluate(model, loader)


def test_a_collective_of_a_cpu_tensor_fails_the_guard():
    with pytest.raises(AssertionError, match="dist.all_reduce of a tensor on cpu"):
        Collectives(META).all_reduce(torch.zeros(3))


TRAINING_CODE = {"train_epoch", "train_one_epoch", "evaluate", "Trainer"}


def training_code(source):
    return {node.name for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.FunctionDef | ast.ClassDef)} & TRAINING_CODE


def test_every_script_with_a_training_loop_is_guarded():
    """A script, exercise or notebook-written file that defines a training or evaluation
    loop is in CASES (or is a copy of one that is: notebook 04's my_debug_job.py)."""
    scripts = {str(p.relative_to(REPO)): p.read_text() for p in [
        *sorted((REPO / "workshop_lib").glob("*.py")), *sorted(FILES.glob("*.py"))]}
    for notebook in [*sorted((REPO / "notebooks").glob("*.ipynb")), ASSESSMENT_NOTEBOOK]:
        scripts |= {cell_key(notebook, name): text
                    for name, text in writefile_cells(notebook).items() if name.endswith(".py")}
    copies = {text.strip("\n") for text in GUARDED.values()}
    unguarded = [name for name, text in scripts.items() if training_code(text)
                 and name not in GUARDED and text.strip("\n") not in copies]
    assert not unguarded, f"training code that no meta-device run covers (add to CASES): " \
                          f"{unguarded}"
