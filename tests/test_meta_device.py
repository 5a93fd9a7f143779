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
  accepts as inputs), no CPU tensor written by an operation on device tensors (``total =
  torch.zeros(()); total += loss``), and only copies and indexing's indices move their
  CPU operands themselves;
- ``PassThroughDDP``: DDP cannot wrap a meta model (its constructor reads the parameters'
  values), and one process has no peers; the stand-in keeps the interface the scripts use
  (``.module``, ``no_sync``, ``register_comm_hook``);
- ``Collectives`` in place of a script's ``dist``: each collective checks that its tensor is
  on the run's device (NCCL refuses a CPU tensor).

Work that reads values (``.item()``, ``.tolist()``, saving files) cannot run on meta and is
left out; each script's device code ends in tensors that the driver checks are on the
device. To guard a new script, add one line to ``CASES``. The library's other device
paths (``LIBRARY_PATHS``: ``train_ddp.fit``, the from-scratch wrappers, inside_ddp's
measurements, ``dataparallel``, ``memory``, the all-reduce sweep, the bench, record shards
and uneven inputs) run on meta up to their first read of a value
(``until_a_value_is_read``), their collectives checked as above.
"""
import ast
import contextlib
import importlib.util
import inspect
import itertools
import json
import re
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
from workshop_lib import (
    allreduce_model,
    data,
    dataparallel,
    equivalence,
    input_pipeline,
    memory,
    models,
    naive_ddp,
    shards,
    throughput,
    train,
    train_ddp,
    uneven_inputs,
)
from workshop_lib.precision import PLAIN
from workshop_lib.trace import capture

META = torch.device("meta")
FILES = REPO / "workshop_lib/labs/files"
ASSESSMENT = REPO / "assessment/source/ddp_refactor"
RANK, WORLD_SIZE = 0, 2  # the rank each run plays, of a two-rank job

# Operations whose CPU operands CUDA takes beside device ones: copies between devices
# (what .to() and .cpu() do) move them whole; advanced indexing moves its CPU *indices*,
# and only those (index_put_'s values obey the rule of any other operand).
MOVES_ITS_OPERANDS = {torch.ops.aten.copy_.default, torch.ops.aten._to_copy.default}
MOVES_ITS_INDICES = {torch.ops.aten.index.Tensor, torch.ops.aten.index_put.default,
                     torch.ops.aten.index_put_.default, torch.ops.aten._index_put_impl_.default}


def operands(func, args, kwargs):
    """``(argument name, written by the operation, tensor)`` for every tensor of a call,
    named by the operator's schema (``Tensor(a!)`` marks an argument written in place,
    ``self`` of ``add_`` or ``out=``)."""
    schema = func._schema.arguments
    written = {a.name for a in schema if a.alias_info is not None and a.alias_info.is_write}
    named = [*zip((a.name for a in schema), args, strict=False), *kwargs.items()]
    for name, value in named:
        for leaf in tree_leaves(value):
            if isinstance(leaf, torch.Tensor):
                yield name, name in written, leaf


class SameDevice(TorchDispatchMode):
    """Raise where an operation mixes tensors on ``device`` with a CPU tensor that CUDA
    would refuse there: a CPU operand of one or more dimensions (a 0-dim CPU tensor is a
    scalar CUDA accepts as an input), and any CPU tensor an operation writes (an in-place
    operation's ``self``, an ``out=``: a device result cannot land in CPU memory, not even
    a 0-dim tensor's)."""

    def __init__(self, device):
        super().__init__()
        self.device = device

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [] if func in MOVES_ITS_OPERANDS else list(operands(func, args, kwargs))
        if any(t.device == self.device for _, _, t in tensors):
            for name, written, t in tensors:
                if t.device.type != "cpu" or (func in MOVES_ITS_INDICES and name == "indices"):
                    continue
                if written:
                    raise RuntimeError(f"{func}: writes into a CPU tensor of shape "
                                       f"{tuple(t.shape)} ({name}) from tensors on "
                                       f"{self.device}")
                if t.dim() > 0:
                    raise RuntimeError(f"{func}: a CPU tensor of shape {tuple(t.shape)} "
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


class Done:
    """The ``Work`` of an ``async_op`` collective that has nothing to wait for."""

    def wait(self, timeout=None):
        return True


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

    def get_backend(self, group=None):
        return "nccl"

    def _collective(self, name, *tensors, async_op=False):
        for tensor in tensors:
            assert tensor.device == self.device, \
                f"dist.{name} of a tensor on {tensor.device}, not on {self.device}"
        self.calls.append(name)
        return Done() if async_op else None

    def all_reduce(self, tensor, op=None, group=None, async_op=False):
        return self._collective("all_reduce", tensor, async_op=async_op)

    def broadcast(self, tensor, src=0, group=None, async_op=False):
        return self._collective("broadcast", tensor, async_op=async_op)

    def all_gather(self, tensors, tensor, group=None, async_op=False):
        return self._collective("all_gather", tensor, *tensors, async_op=async_op)

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
    """The assessment's scripts: ``train_one_epoch`` (accumulating 2 batches a step, its
    short last step included) and ``evaluate`` with a device argument, the MLP on the
    assessment's digits."""
    train_set, val_set = module.load_data()
    torch.manual_seed(0)
    model = module.build_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    assert_on(device, module.train_one_epoch(model, DataLoader(train_set, batch_size=64),
                                             optimizer, device, accumulate=2),
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


def knee_curve(device, monkeypatch, tmp_path):
    """``workshop_lib.throughput``: the step at each batch per device (notebook 05's knee)."""
    train_set, _, info = data.load("digits")
    torch.manual_seed(0)
    model = models.build("cnn", info).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    measured = throughput.curve(model, optimizer, train_set, device, [4, 8], steps=2, rounds=1)
    assert sorted(measured["samples_per_s"]) == [4, 8]


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
    "throughput: the step at each batch per device": knee_curve,
}


@pytest.mark.parametrize("name", CASES)
def test_device_code_makes_its_tensors_on_the_device(name, monkeypatch, tmp_path):
    with SameDevice(META):
        CASES[name](META, monkeypatch, tmp_path)


# -- The library's device paths beyond the training scripts ------------------------------

# Meta has shapes and no values: reading one (.item(), .tolist(), a comparison in an
# ``if``) stops the run there, with one of these errors.
VALUE_READ = "Cannot copy out of meta tensor|cannot be called on meta tensors"


@contextlib.contextmanager
def until_a_value_is_read():
    """Run device code on meta up to its first read of a value; the driver then checks
    what ran before it (the collectives called). A device error is not a value read: it
    goes through."""
    try:
        yield
    except (NotImplementedError, RuntimeError) as error:
        if not re.search(VALUE_READ, str(error)):
            raise
    else:
        pytest.fail("the device code read no value: drive it without until_a_value_is_read")


def digits_batch(device, batch_size=32):
    train_set, _, info = data.load("digits")
    loader = data.TensorLoader(train_set, batch_size, DistributedSampler(
        train_set, WORLD_SIZE, RANK, seed=0), device)
    return info, next(iter(loader))


def cnn(info, device):
    torch.manual_seed(0)
    return models.build("cnn", info).to(device)


def fit_epoch_tail(device, monkeypatch, tmp_path):
    """``train_ddp.fit`` end to end: set-up, an epoch, and its tail (the buffers'
    broadcast, the evaluation, the sums' all-reduces) up to the epoch record, which reads
    the sums."""
    collectives = Collectives(device)
    monkeypatch.setattr(train_ddp, "DDP", PassThroughDDP)
    monkeypatch.setattr(train_ddp, "dist", collectives)
    args = train_ddp.parse_args(["--device", "cpu", "--dataset", "digits", "--epochs", "1",
                                 "--no-progress", "--out", str(tmp_path)])
    with until_a_value_is_read():
        train_ddp.fit(args, device, RANK, WORLD_SIZE)
    assert "broadcast" in collectives.calls
    assert collectives.calls[-2:] == ["all_reduce", "all_reduce"], collectives.calls


def from_scratch_wrappers(device, monkeypatch, tmp_path):
    """Notebook 02's and inside_ddp's wrappers (naive, overlapped, bucketed) with the
    sharded optimizer, a timed window of steps, and the optimizer state's gathering."""
    from workshop_lib.inside_ddp import buckets, overlap, timing, zero1

    collectives = Collectives(device)
    for module in (naive_ddp, overlap, buckets, zero1, timing):
        monkeypatch.setattr(module, "dist", collectives)
    info, (x, y) = digits_batch(device)
    for wrapper in (naive_ddp.NaiveDataParallel, overlap.OverlappedDataParallel,
                    buckets.BucketedDataParallel):
        model = wrapper(cnn(info, device))
        optimizer = zero1.ShardedOptimizer(model.parameters(), torch.optim.SGD, lr=0.05,
                                           momentum=0.9)
        timing.train_step(model, optimizer, x, y)
        assert_on(device, *model.parameters(), *(p.grad for p in model.parameters()))
        with until_a_value_is_read():
            timing.timed_window(model, optimizer, itertools.repeat((x, y)), 2, device)
    with until_a_value_is_read():
        zero1.state_bytes_per_rank(optimizer, device)
    assert collectives.calls[-1] == "all_gather"


def data_parallel_steps(device, monkeypatch, tmp_path):
    """``dataparallel``: its batch and its timed steps (nn.DataParallel passes through
    where no GPU is visible)."""
    _, _, info = data.load("digits")
    x, y = dataparallel.batches(info, 16, device)
    assert_on(device, x, y)
    model = torch.nn.DataParallel(cnn(info, device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    assert dataparallel.timed_steps(model, optimizer, x, y, [device]) >= 0


def memory_of_a_step(device, monkeypatch, tmp_path):
    """``memory``: the bytes saved for backward, and a step of the largest-batch search
    (the CUDA allocator's counters stand in as zeros)."""
    info, (x, y) = digits_batch(device)
    model = cnn(info, device)
    assert memory.saved_bytes_per_step(model, x, y, PLAIN) >= 0
    for counter in ("memory_allocated", "max_memory_allocated", "synchronize",
                    "empty_cache", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, counter, lambda *args, **kwargs: 0)
    assert memory.step_mib(model, info, device, PLAIN, 16) == 0


def allreduce_sweep(device, monkeypatch, tmp_path):
    """``allreduce_model.sweep``: its buffers and the slowest rank's seconds."""
    collectives = Collectives(device)
    monkeypatch.setattr(allreduce_model, "dist", collectives)
    with until_a_value_is_read():
        allreduce_model.sweep(device, sizes=(1024,), reps=2, warmup=1)
    assert collectives.calls == ["all_reduce"] * (1 + 2 * 2 + 1)


def shard_epochs(device, monkeypatch, tmp_path):
    """``shards.ShardLoader`` and ``uneven_inputs``: an epoch of DDP on record shards, in
    equal steps and uneven ones."""
    train_set, val_set, info = data.load("digits")
    folder = tmp_path / "shards"
    shards.write_index(folder, info, list(train_set)[:300], list(val_set)[:100], num_shards=5)
    _, _, shard_info = data.load(data_dir=folder, data_format="shards")
    train_split, _ = shards.open_splits(folder)
    schedule = shards.ShardSchedule(train_split, RANK, WORLD_SIZE, seed=0)
    batches = list(shards.ShardLoader(schedule, 32, device))
    assert batches
    assert_on(device, *(t for batch in batches for t in batch))
    collectives = Collectives(device)
    monkeypatch.setattr(uneven_inputs, "dist", collectives)
    monkeypatch.setattr(train_ddp, "DDP", PassThroughDDP)
    for mode in ("equal", "uneven"):
        assert uneven_inputs.uneven_epoch(folder, mode, 32, device, shard_info) > 0
    assert collectives.calls == ["barrier", "barrier"]


def inside_ddp_measurements(device, monkeypatch, tmp_path):
    """Notebook 07's measurements: the ranks' batches, the communication hooks' training
    runs (up to the first accuracy read), the FSDP memory gathered over the ranks."""
    from workshop_lib.inside_ddp import comm_hooks, fsdp, replay

    train_set, _, _ = data.load("digits")
    batches = replay.rank_batches(train_set, RANK, WORLD_SIZE, 32, 3, device)
    assert_on(device, *(t for batch in batches for t in batch))
    monkeypatch.setattr(train_ddp, "DDP", PassThroughDDP)
    with until_a_value_is_read():
        comm_hooks.compare(RANK, WORLD_SIZE, device, steps=2)
    collectives = Collectives(device)
    monkeypatch.setattr(fsdp, "dist", collectives)
    with until_a_value_is_read():
        fsdp.per_rank({"parameters": 10, "gradients": 10}, device)
    assert collectives.calls == ["all_gather"]


def bench_windows(device, monkeypatch, tmp_path):
    """The bench's quick plan for two processes: every window's run built and timed (a
    window of several ranks up to the slowest rank's seconds, which it reads), and its
    all-reduce sweep up to the first time read."""
    import workshop_lib.bench.__main__ as command
    from workshop_lib.bench import measure, plan

    collectives = Collectives(device)
    monkeypatch.setattr(measure, "dist", collectives)
    monkeypatch.setattr(measure, "DDP", PassThroughDDP)
    monkeypatch.setattr(train_ddp, "DDP", PassThroughDDP)
    bench_plan = plan.make_plan(command.parse_args(["--quick", "--nproc", "2"]),
                                torch.device("cpu"))
    train_set, _, info = data.load("digits")
    world = measure.World(RANK, bench_plan, device, train_set, info)
    windows = [w for w in plan.scaling_windows(bench_plan) if measure.runnable(world, w)]
    assert any(w.world_size > 1 for w in windows)
    for window in windows:
        run = measure.build_run(world, window)
        run.steps = 2
        if window.world_size == 1:
            measure.timed_window(world, run, window)
        else:
            with until_a_value_is_read():
                measure.timed_window(world, run, window)
    with until_a_value_is_read():
        measure.allreduce_sweep(world)


LIBRARY_PATHS = {
    "bench: every window of the quick plan, the all-reduce sweep": bench_windows,
    "inside_ddp: the ranks' batches, communication hooks, FSDP memory":
        inside_ddp_measurements,
    "train_ddp.fit: an epoch and its tail": fit_epoch_tail,
    "naive_ddp and inside_ddp: the from-scratch wrappers, ZeRO-1, a timed window":
        from_scratch_wrappers,
    "dataparallel: its batch and timed steps": data_parallel_steps,
    "memory: saved bytes and a search step": memory_of_a_step,
    "allreduce_model.sweep": allreduce_sweep,
    "shards.ShardLoader and uneven_inputs": shard_epochs,
}


@pytest.mark.parametrize("name", LIBRARY_PATHS)
def test_the_librarys_device_paths_make_their_tensors_on_the_device(name, monkeypatch,
                                                                    tmp_path):
    with SameDevice(META):
        LIBRARY_PATHS[name](META, monkeypatch, tmp_path)


def sync_into_a_cpu_total(self):
    """A from-scratch wrapper's sync that sums the gradients into a 0-dim CPU total."""
    total = torch.zeros(())
    for param in self.module.parameters():
        total += param.grad.sum()


def test_a_cpu_tensor_planted_in_a_library_path_fails_its_driver(monkeypatch, tmp_path):
    monkeypatch.setattr(naive_ddp.NaiveDataParallel, "sync_gradients", sync_into_a_cpu_total)
    with pytest.raises(RuntimeError, match="writes into a CPU tensor"), SameDevice(META):
        from_scratch_wrappers(META, monkeypatch, tmp_path)
    monkeypatch.setattr(train_ddp, "evaluate", lambda model, loader: torch.zeros(3))
    with pytest.raises(AssertionError, match="dist.all_reduce of a tensor on cpu"), \
            SameDevice(META):
        fit_epoch_tail(META, monkeypatch, tmp_path)


def test_a_device_error_is_not_taken_for_a_value_read():
    with pytest.raises(RuntimeError, match="beside tensors on meta"), \
            until_a_value_is_read(), SameDevice(META):
        (torch.zeros(2, device=META) + torch.ones(2)).tolist()


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


@torch.no_grad()
def evaluate_into_a_cpu_total(model, loader):
    """A 0-dim CPU total that a device loss is added into: CUDA takes a 0-dim CPU tensor
    as an input, never as the output of device work."""
    total = torch.zeros(())
    for x, y in loader:
        total += F.cross_entropy(model(x), y, reduction="sum")
    return total


@torch.no_grad()
def evaluate_with_cpu_values_put_into_device_sums(model, loader):
    """Counts per class kept with ``index_put_`` from CPU values: its indices may be on
    the CPU, its values may not."""
    counts = torch.zeros(10, device=next(model.parameters()).device)
    for x, y in loader:
        model(x)
        counts.index_put_((y,), torch.ones(len(y)), accumulate=True)
    return counts


@pytest.mark.parametrize("evaluate, message", [
    (evaluate_with_a_cpu_count, "Tensor on device cpu is not on the expected device meta"),
    (evaluate_into_a_cpu_vector, "a CPU tensor of shape (2,) beside tensors on meta"),
    (evaluate_into_a_cpu_total, "add_.Tensor: writes into a CPU tensor of shape () (self)"),
    (evaluate_with_cpu_values_put_into_device_sums,
     "index_put_.default: a CPU tensor of shape (180,) beside tensors on meta"),
])
def test_a_cpu_tensor_beside_device_tensors_fails_the_guard(evaluate, message):
    _, val_set, info = data.load("digits")
    model = models.build("cnn", info).to(META)
    loader = data.TensorLoader(val_set, 512, data.ShardSampler(val_set, 0, 2), META)
    with pytest.raises(RuntimeError, match=message.replace("(", r"\(").replace(")", r"\)")), \
            SameDevice(META):
        evaluate(model, loader)


def test_what_cuda_accepts_passes_the_guard():
    """The guard is no stricter than CUDA: 0-dim CPU inputs, CPU indices, a copy across."""
    sums = torch.zeros(3, device=META)
    with SameDevice(META):
        total = torch.zeros(()) + sums.sum()  # a 0-dim CPU input: the result on the device
        sums += torch.tensor(2.0)
        sums[torch.tensor([0, 2])] = sums[torch.tensor([1, 1])]  # CPU indices
        sums.index_put_((torch.tensor([1]),), torch.tensor(1.0), accumulate=True)
        sums.copy_(torch.ones(3))  # a copy across devices (meta has no data to copy out)
    assert_on(META, total, sums)


def test_a_collective_of_a_cpu_tensor_fails_the_guard():
    with pytest.raises(AssertionError, match="dist.all_reduce of a tensor on cpu"):
        Collectives(META).all_reduce(torch.zeros(3))


TRAINING_CODE = {"train_epoch", "train_one_epoch", "evaluate", "Trainer"}


def training_code(source):
    return {node.name for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.FunctionDef | ast.ClassDef)} & TRAINING_CODE


def training_scripts(repo=REPO):
    """``{where: text}`` of every script the course has: the library and its subpackages
    (the exercise files among them), and the notebooks' and the assessment's ``%%writefile``
    scripts."""
    scripts = {str(p.relative_to(repo)): p.read_text()
               for p in sorted((repo / "workshop_lib").rglob("*.py"))}
    for notebook in [*sorted((repo / "notebooks").glob("*.ipynb")),
                     *sorted((repo / "assessment/source").rglob("*.ipynb"))]:
        scripts |= {cell_key(notebook, name): text
                    for name, text in writefile_cells(notebook).items() if name.endswith(".py")}
    return scripts


def unguarded(scripts):
    """The scripts that define a training or evaluation loop and are not in CASES (nor a
    copy of one that is: notebook 04's my_debug_job.py)."""
    copies = {text.strip("\n") for text in GUARDED.values()}
    return [name for name, text in scripts.items() if training_code(text)
            and name not in GUARDED and text.strip("\n") not in copies]


def test_every_script_with_a_training_loop_is_guarded():
    assert not unguarded(training_scripts()), \
        f"training code that no meta-device run covers (add to CASES): " \
        f"{unguarded(training_scripts())}"


def test_a_training_loop_in_a_subpackage_is_seen(tmp_path):
    part = tmp_path / "workshop_lib/inside_ddp/new_part.py"
    part.parent.mkdir(parents=True)
    part.write_text("def evaluate(model, loader):\n    return model(next(iter(loader)))\n")
    (tmp_path / "notebooks").mkdir()
    assert unguarded(training_scripts(tmp_path)) == ["workshop_lib/inside_ddp/new_part.py"]
