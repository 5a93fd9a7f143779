"""The grader inside every rank: run the learner's script unchanged and record what it does.

``ddp_checks.launch`` makes this file every process's entry point:

    torchrun ... ddp_recorder.py SETTINGS_JSON  (EVIDENCE_DIR, OUT_DIR, SCRIPT, its flags)

Each patcher below records one thing and returns the function that undoes it:

- ``digits_data.load_data`` (or the data module DDP_RECORDER_DATA_MODULE names): which
  datasets are the training and the validation set;
- four methods of torch's DataLoader iterators (three private): the sample indices of
  every batch that a DataLoader over those sets hands out, and how long each pass over the
  training set took (pinned by the assessment's fast tests at the torch version in use);
- a global forward pre-hook: the modules called, the model among them;
- ``torch.optim.Optimizer.__init__``: the optimizers created;
- global optimizer step hooks: the learning rate of every step and the training batches
  it consumed (those handed out since the previous step); at the first step the model and
  the process group; and before every ``SEGMENT_STEPS``-th step (the first included) the
  model's parameters and the optimizer's state;
- ``torch.save``, ``open`` and ``os.replace`` / ``os.rename``: the files written, and what
  was saved in ``OUT_DIR``, by path or through a file object, directly or through a
  temporary file renamed into place;
- ``sys.stdout`` and ``sys.stderr``: the lines printed (``logging`` writes to stderr).

When the script returns, each rank writes its steps (``steps_file``); rank 0 replays every
optimizer step of the job in one process, segment by segment (``replay_steps``), and each
rank writes its record, ``rank<RANK>.json``, into EVIDENCE_DIR. The ``check_*`` functions
of ``ddp_checks`` judge the requirements from the records of all ranks.

Your copy of this file is replaced by the instructor's when your work is graded.
"""
import base64
import copy
import io
import json
import os
import re
import runpy
import sys
import time
import traceback
from pathlib import Path

# torch is imported inside the functions that use it: importing it takes seconds, and
# main() first writes the pid file by which the launcher stops a job that runs too long.

# Every optimizer step is replayed, in segments of this many steps, each from the
# parameters and optimizer state the ranks held at its start: a segment is short enough
# that float32 rounding stays ~1e-5 of a step's update, and a job that stops averaging at
# any step fails the segment holding it.
SEGMENT_STEPS = 8
SHARED_CHECK_STEPS = SEGMENT_STEPS  # at most the first epoch's steps: samples of each rank's own
PEER_WAIT_S = 30  # how long rank 0 waits for another rank's record of its steps
# A line of the per-epoch table: val_loss or val_acc given a value ("val_acc 0.93",
# "val_acc=0.93", '"val_acc": 0.93', "val_acc: tensor(0.93)"), on stdout or stderr.
METRIC_LINE = re.compile(r"val_(acc|loss)\b[\"']?\s*[:=]?\s*(tensor\()?[-+]?(\d|nan|inf)",
                         re.I)
DATA_MODULE_ENV = "DDP_RECORDER_DATA_MODULE"
KEPT_SAVES = 8  # the last torch.save calls to a file kept, for the checkpoint check
# A segment matches a replay on averaged gradients within this fraction of a step's update
# (ddp_checks.REPLAY_RTOL, the same bar): a correct job is ~1e-5 off, the mistakes ~0.3 or
# more.
REPLAY_MATCH = 0.02


def steps_file(evidence_dir, rank):
    return Path(evidence_dir) / f"steps.rank{rank}.pt"


def record_file(evidence_dir, rank):
    return Path(evidence_dir) / f"rank{rank}.json"


# --------------------------------------------------------------------------------------
# Patchers: each records one thing for the recorder and returns the function undoing it.
# --------------------------------------------------------------------------------------

def patch_load_data(recorder):
    """Remember the datasets load_data() returns: the training and the validation set.

    The module holding ``load_data`` is ``digits_data`` (the assessment's), or the one the
    environment variable ``DDP_RECORDER_DATA_MODULE`` names (the workshop's notebook 02
    exercise reuses this recorder with its own data).
    """
    import importlib

    module = importlib.import_module(os.environ.get(DATA_MODULE_ENV, "digits_data"))
    original = module.load_data

    def load_data(*args, **kwargs):
        train_set, val_set = original(*args, **kwargs)
        train_set = with_short_last_step(train_set, recorder.world_size,
                                         *flag_values(recorder.script_args, "--batch-size",
                                                      "--accumulate"))
        recorder.train_set, recorder.val_set = train_set, val_set
        recorder.splits = {id(train_set): "train", id(val_set): "val"}
        return train_set, val_set

    module.load_data = load_data
    return lambda: setattr(module, "load_data", original)


def flag_values(args, *flags):
    """The whole-number values of ``flags`` in ``args`` (``--flag N`` or ``--flag=N``), None
    for a flag that is absent."""
    found = dict.fromkeys(flags)
    for i, arg in enumerate(args):
        name, _, value = arg.partition("=")
        if name in found:
            value = value or (args[i + 1] if i + 1 < len(args) else "")
            found[name] = int(value) if value.isdigit() else None
    return list(found.values())


def short_step_size(n, world_size, batch_size, accumulate):
    """The largest training-set size up to ``n`` whose every epoch ends, on every rank, in a
    short accumulation step (fewer than ``accumulate`` batches left): the step a script can
    get wrong (dividing by ``accumulate`` anyway, or never stepping on it). At most
    ``world_size * batch_size * accumulate`` samples fewer; ``n`` where none is needed."""
    if not batch_size or not accumulate or accumulate < 2:
        return n
    for size in range(n, max(0, n - world_size * batch_size * accumulate) - 1, -1):
        per_rank = -(-size // world_size)  # DistributedSampler pads every rank to this
        if -(-per_rank // batch_size) % accumulate:  # the rank's batches
            return size
    return n


def with_short_last_step(train_set, world_size, batch_size, accumulate):
    """The graded run's training set: its first ``short_step_size`` samples."""
    import torch.utils.data

    size = short_step_size(len(train_set), world_size, batch_size, accumulate)
    if size == len(train_set):
        return train_set
    if isinstance(train_set, torch.utils.data.TensorDataset):
        return torch.utils.data.TensorDataset(*(t[:size] for t in train_set.tensors))
    return torch.utils.data.Subset(train_set, range(size))


def _dataset_indices(dataset):
    """``(base dataset, function from an index into dataset to an index into base)``,
    through any Subsets on top."""
    from torch.utils.data import Subset

    chain = []  # the Subsets' index lists, outermost first
    while isinstance(dataset, Subset):
        chain.append(dataset.indices)
        dataset = dataset.dataset

    def resolve(i):
        i = int(i)
        for indices in chain:
            i = int(indices[i])
        return i

    return dataset, resolve


def patch_dataloader_iterators(recorder):
    """Record the sample indices of each batch of every pass over the training or the
    validation set, and the time each pass took. A pass starts when an iterator is made
    (``__init__``) or restarted by a persistent-worker loader (``_reset``);
    ``_next_index`` draws one batch's indices (a multi-worker loader draws ahead);
    ``__next__`` hands the next batch to the script, or ends the pass (StopIteration)."""
    from torch.utils.data import dataloader

    base = dataloader._BaseDataLoaderIter
    originals = base.__init__, base._reset, base._next_index, base.__next__
    original_init, original_reset, original_next_index, original_next = originals
    import torch

    def settled():
        """Now, once the GPU has run what was queued: CUDA runs asynchronously, so a pass
        would otherwise end when its last step was launched, not when it was computed."""
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()
        return time.perf_counter()

    def start_pass(iterator, dataset):
        iterator._ddp_recorder_pass = None
        dataset, resolve = _dataset_indices(dataset)
        split = recorder.splits.get(id(dataset))
        if split and recorder.recording:
            batches = []
            record = {"split": split, "batches": batches, "seconds": None}
            recorder.passes.append(record)
            iterator._ddp_recorder_pass = (batches, resolve)
            iterator._ddp_recorder_record = record
            iterator._ddp_recorder_handed = 0
            iterator._ddp_recorder_start = settled()

    def __init__(iterator, loader, *args, **kwargs):
        # Before the original: a multi-worker iterator draws indices in __init__.
        start_pass(iterator, loader.dataset)
        original_init(iterator, loader, *args, **kwargs)

    def _reset(iterator, loader, first_iter=False):
        if not first_iter:
            start_pass(iterator, loader.dataset)
        return original_reset(iterator, loader, first_iter=first_iter)

    def _next_index(iterator):
        index = original_next_index(iterator)
        current = getattr(iterator, "_ddp_recorder_pass", None)
        if current:
            batches, resolve = current
            batch = index.tolist() if hasattr(index, "tolist") else index
            batches.append([resolve(i) for i in (batch if isinstance(batch, (list, tuple))
                                                 else [batch])])
        return index

    def __next__(iterator):
        current = getattr(iterator, "_ddp_recorder_pass", None)
        try:
            data = original_next(iterator)
        except StopIteration:
            if current:  # the pass is over: its time, from the iterator's start
                iterator._ddp_recorder_record["seconds"] = (
                    settled() - iterator._ddp_recorder_start)
            raise
        if current:
            # Batches come out in the order their indices were drawn (DataLoader's
            # in_order=True, its default): this one is the pass's next.
            batches, _ = current
            if iterator._ddp_recorder_record["split"] == "train":
                recorder.handed_out.append(batches[iterator._ddp_recorder_handed])
            iterator._ddp_recorder_handed += 1
        return data

    base.__init__, base._reset, base._next_index, base.__next__ = (
        __init__, _reset, _next_index, __next__)

    def undo():
        base.__init__, base._reset, base._next_index, base.__next__ = originals

    return undo


def hook_module_calls(recorder):
    """Every module called in a forward pass: the model is one of them."""
    from torch.nn.modules.module import register_module_forward_pre_hook

    def seen(module, inputs):
        recorder.modules.setdefault(id(module), module)

    return register_module_forward_pre_hook(seen).remove


def patch_optimizer_init(recorder):
    """Every optimizer created."""
    import torch

    original = torch.optim.Optimizer.__init__

    def __init__(optimizer, *args, **kwargs):
        original(optimizer, *args, **kwargs)
        recorder.optimizers.append(optimizer)

    torch.optim.Optimizer.__init__ = __init__
    return lambda: setattr(torch.optim.Optimizer, "__init__", original)


def hook_optimizer_steps(recorder):
    """The optimizer that steps first is the one that trains the model: its learning rate
    at every step, the training batches each step consumed (the batches handed out since
    the previous step: one, or several when the script accumulates gradients), and, before
    every SEGMENT_STEPS-th step, the model's parameters and the optimizer's state (taken
    before the step, so that whatever the script does to the parameters between steps is
    part of the segment that ends there)."""
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    def before(optimizer, args, kwargs):
        if recorder.optimizer is None:
            recorder.start_first_steps(optimizer)
        if optimizer is recorder.optimizer:
            if recorder.steps % SEGMENT_STEPS == 0:
                recorder.snapshot()
            recorder.lrs.append([float(group["lr"]) for group in optimizer.param_groups])
            recorder.step_batches.append(recorder.handed_out)
            recorder.handed_out = []

    def after(optimizer, args, kwargs):
        if optimizer is recorder.optimizer:
            recorder.steps += 1

    handles = [register_optimizer_step_pre_hook(before),
               register_optimizer_step_post_hook(after)]
    return lambda: [handle.remove() for handle in handles]


def _file_path(f):
    """The absolute path torch.save writes to, for a path or a file object (one opened by
    open(), os.fdopen() or tempfile: its descriptor names the file); None for an in-memory
    buffer."""
    if isinstance(f, (str, bytes, os.PathLike)):
        return os.path.abspath(os.fsdecode(f))
    try:
        target = os.readlink(f"/proc/self/fd/{f.fileno()}")
        if target.startswith("/"):
            return target
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        pass
    name = getattr(f, "name", None)
    return os.path.abspath(os.fsdecode(name)) if isinstance(name, (str, bytes)) else None


def patch_torch_save(recorder):
    """Files written by torch.save (it opens them in C++, past the open() recorded below),
    given a path or a file object, and a copy of everything saved to a file: another rank
    may overwrite the file itself, and a file saved under a temporary name counts under
    the name it is renamed to (patch_rename)."""
    import torch

    original = torch.save

    def save(obj, f, *args, **kwargs):
        path = _file_path(f) if recorder.recording else None
        result = original(obj, f, *args, **kwargs)
        if path is not None:
            recorder.writes.append(path)
            buffer = io.BytesIO()
            original(obj, buffer)
            recorder.saves = [*recorder.saves, [path, buffer.getvalue()]][-KEPT_SAVES:]
        return result

    torch.save = save
    return lambda: setattr(torch, "save", original)


def patch_rename(recorder):
    """Files renamed into place (os.replace and os.rename; pathlib, shutil.move and
    tempfile-based atomic writes go through them): the destination is written, and what
    torch.save wrote under the old name now lives under the new one."""
    originals = os.replace, os.rename

    def renamer(original):
        def rename(src, dst, *args, **kwargs):
            result = original(src, dst, *args, **kwargs)
            if recorder.recording and isinstance(src, (str, bytes, os.PathLike)) \
                    and isinstance(dst, (str, bytes, os.PathLike)):
                old, new = (os.path.abspath(os.fsdecode(p)) for p in (src, dst))
                recorder.writes = [new if path == old else path for path in recorder.writes]
                if new not in recorder.writes:
                    recorder.writes.append(new)
                for save in recorder.saves:
                    if save[0] == old:
                        save[0] = new
            return result
        return rename

    os.replace, os.rename = (renamer(original) for original in originals)

    def undo():
        os.replace, os.rename = originals

    return undo


def patch_open(recorder):
    """Files opened for writing."""
    import builtins

    original = builtins.open

    def recorded_open(file, mode="r", *args, **kwargs):
        if (recorder.recording and isinstance(file, (str, bytes, os.PathLike))
                and any(flag in mode for flag in "wax+")):
            path = os.path.abspath(os.fsdecode(file))
            if not path.startswith(("/dev/", "/proc/", "/sys/")):
                recorder.writes.append(path)
        return original(file, mode, *args, **kwargs)

    builtins.open = io.open = recorded_open

    def undo():
        builtins.open = io.open = original

    return undo


class _Tee:
    """A stream (sys.stdout, sys.stderr) that also keeps the lines written."""

    def __init__(self, stream, lines):
        self._stream, self._lines, self._partial = stream, lines, ""

    def write(self, text):
        self._stream.write(text)
        *complete, self._partial = (self._partial + text).split("\n")
        self._lines.extend(complete)
        return len(text)

    def flush(self):
        self._stream.flush()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def tee_output(recorder):
    """The lines the script prints on stdout and writes to stderr (``logging``'s handlers
    look sys.stderr up when they are made, after this, or when they write)."""
    originals = sys.stdout, sys.stderr
    sys.stdout = _Tee(originals[0], recorder.stdout)
    sys.stderr = _Tee(originals[1], recorder.stderr)

    def undo():
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = originals

    return undo


PATCHERS = (patch_load_data, patch_dataloader_iterators, hook_module_calls,
            patch_optimizer_init, hook_optimizer_steps, patch_torch_save, patch_rename,
            patch_open, tee_output)


# --------------------------------------------------------------------------------------
# The recorder: what one rank did.
# --------------------------------------------------------------------------------------

def _cpu_state(module):
    return {name: value.detach().to("cpu", copy=True) for name, value
            in module.state_dict().items()}


class Recorder:
    def __init__(self, rank, world_size, evidence_dir, out_dir, script):
        import torch

        self.rank, self.world_size = rank, world_size
        self.evidence_dir, self.out_dir = Path(evidence_dir), Path(out_dir).resolve()
        self.script = Path(script)
        self._save = torch.save  # the original: records are not the script's writes
        self.recording = True
        self.splits = {}  # id(dataset) -> "train" / "val"
        self.train_set = self.val_set = None
        self.script_args = []
        self.passes = []  # {"split", "batches", "seconds"} per DataLoader pass, in order
        self.handed_out = []  # training batches handed to the script since the last step
        self.step_batches = []  # the training batches of each step
        self.modules = {}  # every module called, by id: the model is among them
        self.optimizers = []
        self.optimizer = None  # the one that steps first
        self.process_group_size = None  # at the first step
        self.lrs = []  # each step's learning rate, per parameter group
        self.steps = 0
        self.first_steps = None  # the model's parameter groups at the first step, or a problem
        self.snapshots = []  # (step, parameters, optimizer state) every SEGMENT_STEPS steps
        self.model = None  # the model found at the first step
        self.saves = []  # [path, bytes] of the last KEPT_SAVES torch.save calls to a file
        self.writes = []
        self.stdout = []
        self.stderr = []
        self.error = None
        self._undo = []

    def install(self):
        folder = str(self.script.resolve().parent)
        sys.path.insert(0, folder)  # digits_data, found where the script finds it
        self._undo.append(lambda: folder in sys.path and sys.path.remove(folder))
        for patch in PATCHERS:
            self._undo.append(patch(self))

    def uninstall(self):
        self.recording = False
        while self._undo:
            self._undo.pop()()

    def run(self, script_args):
        """Run the script as ``python SCRIPT ARGS`` would, recording; never raises."""
        self.script_args = list(script_args)
        argv = sys.argv
        try:
            self.install()
            sys.argv = [str(self.script), *script_args]
            runpy.run_path(str(self.script), run_name="__main__")
        except SystemExit as stop:
            if stop.code not in (None, 0):
                # Why it exited is its last line on stderr (argparse's error, for one).
                said = next((line.strip() for line in reversed(self.stderr) if line.strip()),
                            "")
                self.error = {"type": "SystemExit", "where": "sys.exit",
                              "message": f"exit status {stop.code}"
                              + (f", its last line on stderr: {said[:300]}" if said else "")}
        except BaseException as error:  # noqa: B036 - a KeyboardInterrupt is a failure too
            traceback.print_exc()
            self.error = self.describe(error)
        finally:
            sys.argv = argv
            self.uninstall()
            self.save_steps()

    def describe(self, error):
        frames = traceback.extract_tb(error.__traceback__)
        mine = [f for f in frames if Path(f.filename).name == self.script.name]
        frame = (mine or frames or [None])[-1]
        where = (f"{Path(frame.filename).name} line {frame.lineno}, in {frame.name}: "
                 f"{(frame.line or '').strip()}") if frame else "unknown place"
        message = str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
        return {"type": type(error).__name__, "message": message, "where": where}

    # -- the steps, for the replay ------------------------------------------------------

    def find_model(self):
        """``(model, problem)``: the module the script trains, called in forward passes,
        its parameters in an optimizer, and not part of a larger such module. DDP wrappers
        are skipped (their .module is the model)."""
        from torch.nn.parallel import DistributedDataParallel

        candidates = [m for m in self.modules.values()
                      if not isinstance(m, DistributedDataParallel)]
        inner = {id(sub) for m in candidates for sub in m.modules() if sub is not m}
        trained = {id(p) for o in self.optimizers for g in o.param_groups for p in g["params"]}
        roots = [m for m in candidates if id(m) not in inner
                 and any(id(p) in trained for p in m.parameters())]
        if not roots:
            return None, ("found no model that is both called in training and updated by "
                          "an optimizer.")
        return max(roots, key=lambda m: sum(p.numel() for p in m.parameters())), None

    def start_first_steps(self, optimizer):
        """At the first step: the model, the process group and the optimizer's parameter
        groups (by the model's parameter names)."""
        import torch.distributed as dist

        self.optimizer = optimizer
        self.process_group_size = (dist.get_world_size() if dist.is_available()
                                   and dist.is_initialized() else 1)
        self.model, problem = self.find_model()
        if self.model is None:
            self.first_steps = {"problem": problem}
            return
        names = {id(p): name for name, p in self.model.named_parameters()}
        groups = [[names.get(id(p)) for p in group["params"]]
                  for group in optimizer.param_groups]
        if any(name is None for group in groups for name in group):
            self.first_steps = {"problem": "the optimizer updates tensors that are not "
                                           "parameters of the model."}
            return
        self.first_steps = {"param_groups": groups}

    def snapshot(self):
        """The model's parameters and the optimizer's state now, before step self.steps."""
        if self.first_steps is None or "problem" in self.first_steps:
            return
        self.snapshots.append((self.steps, _cpu_state(self.model),
                               _to_cpu(copy.deepcopy(self.optimizer.state_dict()))))

    def save_steps(self):
        """Write this rank's steps for rank 0's replay: the parameters and optimizer state
        at each segment's start, the parameters at the end, each step's batches and
        learning rates. Atomically: rank 0 reads it as soon as it exists."""
        steps = dict(self.first_steps or {"problem": "the script made no optimizer step."})
        if "problem" not in steps:
            steps.update(steps=self.steps, snapshots=self.snapshots,
                         theta_end=_cpu_state(self.model),
                         optimizer_end=_to_cpu(self.optimizer.state_dict()),
                         batches=self.step_batches[:self.steps], lrs=self.lrs[:self.steps])
        path = steps_file(self.evidence_dir, self.rank)
        partial = path.with_name(path.name + ".part")
        self._save(steps, partial)
        os.replace(partial, path)

    # -- rank 0: the replay --------------------------------------------------------------

    def wait_for_steps(self):
        """Every rank's steps (None for a rank that wrote none in time)."""
        import torch

        deadline = time.monotonic() + PEER_WAIT_S
        paths = [steps_file(self.evidence_dir, r) for r in range(self.world_size)]
        while not all(p.exists() for p in paths) and time.monotonic() < deadline:
            time.sleep(0.1)
        return [torch.load(p, map_location="cpu", weights_only=False) if p.exists() else None
                for p in paths]

    def replay_steps(self):
        """Replay every optimizer step of the job in this process, on the CPU in float32,
        segment by segment: each segment of SEGMENT_STEPS steps from the parameters and
        optimizer state rank 0 held at its start, each step on the ranks' batches of that
        step together (all the batches each rank was handed since its previous step, the
        mean loss over them: averaged gradients). Each rank's parameters at the segment's
        end (the next segment's start, or the end of training) are compared with the
        replay's, relative to the replay's mean update per step. At the first segment that
        does not match, two replays name the mistake: the sum of the ranks' mean losses
        (summed gradients) and, from each rank's own start, its own batches alone (local).
        Also returns how many of the samples of the first SHARED_CHECK_STEPS steps more
        than one rank trained on (then the replay cannot tell averaged gradients from ranks
        that each train alone)."""
        import torch

        ranks = self.wait_for_steps()
        for rank, steps in enumerate(ranks):
            if steps is None:
                return {"problem": f"rank {rank} recorded no optimizer step within "
                                   f"{PEER_WAIT_S} s of rank 0's end."}
            if "problem" in steps:
                return {"problem": f"rank {rank}: {steps['problem']}"}
            if steps["steps"] != ranks[0]["steps"]:
                return {"problem": f"rank {rank} made {steps['steps']} optimizer steps and "
                                   f"rank 0 {ranks[0]['steps']}: every rank must take the "
                                   f"same steps."}
            for step, batches in enumerate(steps["batches"]):
                if not batches:
                    return {"problem": f"rank {rank}'s optimizer step {step + 1} came after "
                                       f"no new batch of train_set: the grader replays each "
                                       f"step on the batches the DataLoader handed out since "
                                       f"the previous step."}
        x, y = self.train_set.tensors

        def batches(rank, step):
            """``[(inputs, targets)]``: the batches rank took for this step."""
            return [(x[b].float(), y[b]) for b in ranks[rank]["batches"][step]]

        def union(step):
            """The step on the global batch: the mean loss over all its samples."""
            inputs, targets = zip(*(b for r in range(len(ranks)) for b in batches(r, step)),
                                  strict=True)
            return [(torch.cat(inputs), torch.cat(targets), 1.0)]

        def averaged(step):
            """What DDP computes: the mean over ranks of each rank's loss, itself the mean
            of its batches' mean losses (one batch, or several accumulated, each divided
            by their number). With batches all of one size this is the union's mean."""
            sizes = {len(b) for r in range(len(ranks)) for b in ranks[r]["batches"][step]}
            if len(sizes) == 1:
                return union(step)
            return [(inputs, targets, 1.0 / (len(ranks) * len(ranks[r]["batches"][step])))
                    for r in range(len(ranks)) for inputs, targets in batches(r, step)]

        def summed(step):
            return [(inputs, targets, 1.0 / len(ranks[r]["batches"][step]))
                    for r in range(len(ranks)) for inputs, targets in batches(r, step)]

        def local(rank, step):
            return [(inputs, targets, 1.0 / len(ranks[rank]["batches"][step]))
                    for inputs, targets in batches(rank, step)]

        total = ranks[0]["steps"]
        # The samples of each rank's first steps, up to SHARED_CHECK_STEPS and within the
        # first epoch (until a rank meets a sample it trained on before).
        first_epoch = min(SHARED_CHECK_STEPS, *(_steps_before_a_repeat(steps["batches"])
                                                 for steps in ranks))
        trained_on = [{i for b in steps["batches"][:first_epoch] for batch in b
                       for i in batch} for steps in ranks]
        shared = {i for r, mine in enumerate(trained_on) for i in mine
                  if any(i in theirs for theirs in trained_on[r + 1:])}
        # Ranks that average their gradients end with the same optimizer state too (the
        # momentum follows the gradients), even where parameters averaged after a step of
        # their own would agree.
        momentum = _flat_tensors(ranks[0]["optimizer_end"])
        result = {"steps": total, "shared": len(shared), "shared_steps": first_epoch,
                  "samples": [len(mine) for mine in trained_on],
                  # Each rank's batches per step: the accumulation the script did.
                  "micro_batches": [[len(b) for b in steps["batches"]] for steps in ranks],
            "optimizer_end_gap": [_gap(_flat_tensors(steps["optimizer_end"]), momentum)
                                  for steps in ranks]}
        start = ranks[0]["snapshots"][0][1]
        starts = [_distance(steps["snapshots"][0][1], start, scale=_norm(start))
                  for steps in ranks]
        worst = [0.0] * len(ranks)
        segments = ranks[0]["snapshots"]
        replayer = self.replayer()
        try:
            for index, (first, theta, optimizer_state) in enumerate(segments):
                last = segments[index + 1][0] if index + 1 < len(segments) else total
                ends = [steps["snapshots"][index + 1][1] if index + 1 < len(segments)
                        else steps["theta_end"] for steps in ranks]
                lrs = ranks[0]["lrs"][first:last]
                theta_avg, scale = replayer(theta, optimizer_state, lrs,
                                            lambda t, f=first: averaged(f + t))
                errors = [_distance(end, theta_avg, scale=scale) for end in ends]
                if max(errors) > REPLAY_MATCH and any(
                        len(averaged(step)) > 1 for step in range(first, last)):
                    # Batches of unequal sizes: a job may weigh every sample alike instead.
                    theta_avg, scale = replayer(theta, optimizer_state, lrs,
                                                lambda t, f=first: union(f + t))
                    errors = [min(e, _distance(end, theta_avg, scale=scale))
                              for e, end in zip(errors, ends, strict=True)]
                worst = [max(w, e) for w, e in zip(worst, errors, strict=True)]
                if max(errors) <= REPLAY_MATCH:
                    continue
                theta_sum, sum_scale = replayer(theta, optimizer_state, lrs,
                                                lambda t, f=first: summed(f + t))
                mine = []
                for r, steps in enumerate(ranks):
                    _, own, own_state = steps["snapshots"][index]
                    theta_own, own_scale = replayer(own, own_state, steps["lrs"][first:last],
                                                    lambda t, f=first, r=r: local(r, f + t))
                    mine.append(_distance(ends[r], theta_own, scale=own_scale))
                result.update(segment=[first + 1, last], ranks=[{
                    "start": starts[r], "averaged": errors[r],
                    "summed": _distance(ends[r], theta_sum, scale=sum_scale),
                    "local": mine[r]} for r in range(len(ranks))])
                return result
        except Exception as error:
            return {"problem": f"the grader could not replay your training steps "
                               f"({type(error).__name__}: {error})."}
        result["ranks"] = [{"start": starts[r], "averaged": worst[r], "summed": None,
                            "local": None} for r in range(len(ranks))]
        return result

    def replayer(self):
        """``replay(theta, optimizer_state, lrs, batches_of_step) -> (state, step size)``:
        the model's state after ``len(lrs)`` steps of an optimizer of the script's class
        loaded with ``optimizer_state``, from ``theta``, and the size of one step (the
        distance moved over the number of steps); the loss of a step is the sum of
        weight x F.cross_entropy (mean) over the ``(inputs, targets, weight)`` of
        ``batches_of_step(step)``.
        One model and one optimizer serve every call: a replay of a segment loads both."""
        import torch
        import torch.nn.functional as F

        model = copy.deepcopy(self.model).to("cpu", torch.float32).train()
        parameters = dict(model.named_parameters())
        groups = [{"params": [parameters[name] for name in names]}
                  for names in self.first_steps["param_groups"]]
        lr = self.lrs[0][0] if self.lrs else 0.001
        try:
            optimizer = type(self.optimizer)(groups)
        except TypeError:  # an optimizer whose learning rate has no default
            optimizer = type(self.optimizer)(groups, lr=lr)

        def replay(theta, optimizer_state, lrs, batches_of_step):
            model.load_state_dict(theta)
            start = _flat(theta)
            # load_state_dict may keep the given tensors: give it copies, the snapshot stays.
            optimizer.load_state_dict(_to_cpu(optimizer_state))
            for step in range(len(lrs)):
                for group, lr in zip(optimizer.param_groups, lrs[step], strict=True):
                    group["lr"] = lr
                optimizer.zero_grad()
                loss = sum(weight * F.cross_entropy(model(inputs), targets)
                           for inputs, targets, weight in batches_of_step(step))
                loss.backward()
                optimizer.step()
            state = _cpu_state(model)
            return state, (_flat(state) - start).norm().item() / max(len(lrs), 1)

        return replay

    # -- the record ----------------------------------------------------------------------

    def evaluate(self, model):
        """Loss and correctness of every validation sample under this rank's model."""
        import torch
        import torch.nn.functional as F

        if self.val_set is None:
            return {"error": "load_data() was not called."}
        x, y = self.val_set.tensors
        device = next(model.parameters()).device
        model.eval()
        losses, correct = [], []
        try:
            with torch.no_grad():
                for start in range(0, len(y), 512):
                    logits = model(x[start:start + 512].to(device)).float()
                    target = y[start:start + 512].to(device)
                    losses += F.cross_entropy(logits, target, reduction="none").tolist()
                    correct += (logits.argmax(dim=1) == target).int().tolist()
        except Exception as error:
            return {"error": f"the model does not accept a batch of validation samples "
                             f"({type(error).__name__}: {error})."}
        return {"loss": losses, "correct": correct}

    def check_checkpoint(self, model):
        """Whether the last thing saved into OUT_DIR (by path, through a file object, or
        under a temporary name renamed into OUT_DIR) loads into the plain model and holds
        its final parameters. What was saved may be a dict holding the state dict, the
        state dict itself, or the module."""
        import torch

        saves = [data for path, data in self.saves if Path(path).is_relative_to(self.out_dir)]
        if not saves:
            return {"saved": False}
        result = {"saved": True, "loads": False, "matches_final": False, "problem": ""}
        try:
            saved = torch.load(io.BytesIO(saves[-1]), map_location="cpu",
                               weights_only=False)
        except Exception as error:
            result["problem"] = f"torch.load fails ({type(error).__name__}: {error})."
            return result
        state = None
        if isinstance(saved, torch.nn.Module):
            saved = saved.state_dict()
        if isinstance(saved, dict):
            state = next((saved[k] for k in ("model", "model_state_dict", "state_dict")
                          if isinstance(saved.get(k), dict)), None)
            if state is None and saved and all(isinstance(v, torch.Tensor)
                                               for v in saved.values()):
                state = saved
        if state is None:
            result["problem"] = ("it holds no state dict (expected a dict with the model's "
                                 "state_dict under 'model').")
            return result
        plain = copy.deepcopy(model).cpu()
        try:
            plain.load_state_dict(state)
        except Exception as error:
            first = str(error).strip().splitlines()
            result["problem"] = " ".join(line.strip() for line in first[:3])[:400]
            return result
        result["loads"] = True
        final = _cpu_state(model)
        result["matches_final"] = all(torch.equal(final[k], v.detach().cpu())
                                      for k, v in plain.state_dict().items())
        return result

    def record(self):
        """This rank's record, as JSON-ready data."""
        record = {
            "rank": self.rank,
            "error": self.error,
            "data_loaded": self.train_set is not None,
            "n_train": len(self.train_set) if self.train_set is not None else 0,
            "passes": self.passes,
            "process_group_size": self.process_group_size,
            "lrs": [max(step) for step in self.lrs],
            "writes": sorted(set(self.writes)),
            "metric_lines": [line for line in self.stdout if METRIC_LINE.search(line)][:20],
            "stderr_metric_lines": [line for line in self.stderr
                                    if METRIC_LINE.search(line)][:20],
            "stdout": self.stdout[-50:],
            "model": {"found": False},
            "val_eval": {"error": "no model was found."},
            "checkpoint": {"saved": False},
        }
        model, problem = self.find_model()
        if model is None:
            record["model"]["problem"] = problem
            return record
        record["model"] = {"found": True, "params_b64": _params_b64(model)}
        record["val_eval"] = self.evaluate(model)
        record["checkpoint"] = self.check_checkpoint(model)
        if self.rank == 0 and self.error is None:
            record["replay"] = (self.replay_steps() if self.model is not None
                                else {"problem": (self.first_steps or {}).get(
                                    "problem", "the script made no optimizer step.")})
        return record


def _flat(state):
    import torch

    return torch.cat([state[k].detach().double().flatten() for k in sorted(state)
                      if state[k].is_floating_point()])


def _norm(state):
    return _flat(state).norm().item()


def _distance(state, reference, scale):
    """``|state - reference| / scale``: 0 where both are equal, even at a scale of 0."""
    a, b = _flat(state), _flat(reference)
    if a.shape != b.shape:
        return float("inf")
    gap = (a - b).norm().item()
    return gap / scale if scale > 0 else (0.0 if gap == 0 else float("inf"))


def _steps_before_a_repeat(step_batches):
    """How many of a rank's first steps hold no sample twice: its first epoch's steps."""
    seen = set()
    for step, batches in enumerate(step_batches):
        samples = [i for batch in batches for i in batch]
        if seen.intersection(samples):
            return step
        seen.update(samples)
    return len(step_batches)


def _flat_tensors(value):
    """Every floating-point tensor in a nested state (an optimizer's state_dict), in one
    float64 vector, in a fixed order."""
    import torch

    found = []

    def walk(item):
        if isinstance(item, torch.Tensor):
            if item.is_floating_point():
                found.append(item.detach().double().flatten())
        elif isinstance(item, dict):
            for key in sorted(item, key=str):
                walk(item[key])
        elif isinstance(item, (list, tuple)):
            for element in item:
                walk(element)

    walk(value)
    return torch.cat(found) if found else torch.zeros(0, dtype=torch.float64)


def _gap(a, b):
    """The largest elementwise difference of two vectors, relative to 1 + |b|."""
    if a.shape != b.shape:
        return float("inf")
    return ((a - b).abs() / (1 + b.abs())).max().item() if len(a) else 0.0


def _to_cpu(value):
    """An optimizer's state_dict with every tensor copied to the CPU."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value


def _params_b64(model):
    import torch

    state = model.state_dict()
    flat = torch.cat([state[k].detach().float().cpu().flatten() for k in sorted(state)])
    return base64.b64encode(flat.numpy().astype("float32").tobytes()).decode()


def main(evidence_dir, out_dir, script, *script_args):
    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    evidence_dir = Path(evidence_dir)
    # First of all: the launcher kills this pid's group if the job outlives its time.
    (evidence_dir / f"pid.{rank}").write_text(str(os.getpid()))
    recorder = Recorder(rank, world_size, evidence_dir, out_dir, script)
    recorder.run(script_args)
    try:
        record = recorder.record()
    except Exception as error:  # the record must be written whatever the script did
        record = {"rank": rank, "data_loaded": recorder.train_set is not None,
                  "error": recorder.error or {
                      "type": type(error).__name__, "where": "ddp_recorder",
                      "message": f"the grader could not inspect the model: {error}"}}
    path = record_file(evidence_dir, rank)
    partial = path.with_name(path.name + ".part")
    partial.write_text(json.dumps(record))
    os.replace(partial, path)
    return 1 if recorder.error else 0


if __name__ == "__main__":
    # The launcher's settings come in a file of the job's private folder, not on the command
    # line, which every account on the machine can read: the graded run's flags are hidden.
    if len(sys.argv) != 2:
        sys.exit(f"usage: {Path(__file__).name} SETTINGS_JSON (evidence_dir, out_dir, "
                 f"script, args: the script's sys.argv[1:])")
    settings = json.loads(Path(sys.argv[1]).read_text())
    status = main(settings["evidence_dir"], settings["out_dir"], settings["script"],
                  *settings["args"])
    # The record is written: leave without Python's shutdown. A gloo group's worker
    # threads outlive destroy_process_group once DDP has used it (torch 2.14), and one that
    # drops a tensor while Python shuts down aborts the process (PyTorch issue 190489): the
    # job would fail, and the learner be marked down, after the script did all its work.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
