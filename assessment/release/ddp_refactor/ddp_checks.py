"""The assessment's checks: launch a training script under torchrun, then test what it did.

The test cells of the assessment notebook call this module:

    run = ddp_checks.launch("train_digits_ddp.py", ddp_checks.Config(epochs=3))
    ddp_checks.check_shards_disjoint_and_cover(run)

``launch`` starts the script once with torchrun, with this file as every process's entry
point. In each process it records what the script does while the script runs unchanged:
which training and validation samples each DataLoader hands out, what the process prints
and writes, what it saves with torch.save, and its model at the end (found as the module
that the optimizer trains). Each process writes that record as JSON; the ``check_*``
functions judge one requirement each from the records of all processes, and raise
``RequirementNotMet`` with the reason when it is not met. Nothing reads the script's
source: any correct way of writing it passes.

Your copy of this file is replaced by the instructor's when your work is graded.

The kernel side (``launch`` and the checks) needs only the standard library: importing
torch in the notebook kernel would add seconds to every graded notebook.
"""
import base64
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from array import array
from dataclasses import dataclass
from pathlib import Path

RUN_DIR = Path("grading_run")  # under the notebook's folder: the evidence and --out of a run
TIME_LIMIT_ENV = "DDP_CHECKS_TIME_LIMIT_S"  # instructor's override of Config.time_limit_s
NPROC_ENV = "DDP_CHECKS_NPROC"  # instructor's override of the number of processes
CPU_PROCESSES = 2  # processes to launch where there are fewer than two GPUs
METRIC_LINE = re.compile(r"val_(acc|loss)")  # a line of the per-epoch table
ACC_TOLERANCE = 1e-4  # well under one validation sample (1/360)
LOSS_RTOL = 1e-3  # float32 sums in another order differ by ~1e-6
PARAM_ATOL = 1e-6


@dataclass(frozen=True)
class Config:
    """One graded run: the script's flags, the accuracy to reach and the time allowed."""

    epochs: int = 3
    batch_size: int = 32
    seed: int = 0
    target_accuracy: float = 0.85
    time_limit_s: float = 300


class RequirementNotMet(AssertionError):
    """A requirement the run does not meet; shown as its message alone, no traceback."""

    def _render_traceback_(self):
        return [f"\x1b[0;31mRequirement not met\x1b[0m: {self}"]


# --------------------------------------------------------------------------------------
# Kernel side: launch the script once, load the records.
# --------------------------------------------------------------------------------------

def visible_gpus():
    """How many GPUs a launched process would see (without importing torch)."""
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    count = sum(1 for line in listed.splitlines() if line.startswith("GPU "))
    selected = os.environ.get("CUDA_VISIBLE_DEVICES")
    if selected is not None:
        ids = [s for s in selected.split(",") if s.strip()]
        # CUDA stops at the first invalid entry ("-1" hides every GPU).
        valid = next((i for i, s in enumerate(ids) if s.strip().startswith("-")), len(ids))
        count = min(count, valid)
    return count


def process_layout():
    """``(processes, on_gpu)``: one process per GPU where there are two or more GPUs,
    otherwise ``CPU_PROCESSES`` processes on the CPU (one GPU cannot be shared by two
    NCCL ranks). ``DDP_CHECKS_NPROC`` sets the number of CPU processes or GPUs to use.
    """
    gpus = visible_gpus()
    wanted = int(os.environ.get(NPROC_ENV, 0)) or None
    if gpus >= 2:
        return min(wanted or gpus, gpus), True
    return wanted or CPU_PROCESSES, False


@dataclass
class Run:
    """What one launch did: exit status, time, output, and each rank's record."""

    script: str
    config: Config
    nproc: int
    on_gpu: bool
    time_limit_s: float
    returncode: int | None = None
    timed_out: bool = False
    elapsed_s: float = 0.0
    output: str = ""
    ranks: list | None = None
    out_dir: Path | None = None
    missing_script: bool = False

    @property
    def failure(self):
        """Why the job cannot be graded (a sentence for the learner), or None."""
        if self.missing_script:
            return (f"{self.script} does not exist: run the cell that writes it "
                    f"(%%writefile {self.script}).")
        if self.timed_out:
            last = _tail(self.output, 1)
            return (f"the job did not finish within {self.time_limit_s:.0f} s and was "
                    f"stopped. Look for an endless loop, or for a collective (all_reduce, "
                    f"barrier, ...) that not every rank reaches."
                    + (f" The last line it printed: {last!r}" if last else ""))
        for rank, record in enumerate(self.ranks or []):
            if record and record.get("error"):
                error = record["error"]
                message = f": {error['message']}" if error["message"] else ""
                reason = f"rank {rank} stopped with {error['type']}{message} ({error['where']})."

                if error["type"] == "NotImplementedError":
                    reason += " A place marked '# YOUR CODE HERE' still needs your code."
                return reason
        if self.returncode != 0:
            return (f"the job exited with status {self.returncode}. The end of its "
                    f"output:\n{_tail(self.output)}")
        for rank, record in enumerate(self.ranks or []):
            if record is None:
                return f"rank {rank} finished without reporting what it did."
            if not record["data_loaded"]:
                return ("the script never called digits_data.load_data(): keep loading "
                        "the data with it.")
        return None

    @property
    def ok(self):
        return self.failure is None

    def summary(self):
        where = f"{self.nproc} GPUs (NCCL)" if self.on_gpu else f"{self.nproc} CPU processes"
        head = (f"{self.script} on {where}, {self.config.epochs} epochs, batch size "
                f"{self.config.batch_size} per process, seed {self.config.seed}: ")
        if self.ok:
            return head + f"finished in {self.elapsed_s:.1f} s."
        return head + "could not be graded: " + self.failure


def _tail(text, lines=12):
    """The end of torchrun's output, without its routine warnings."""
    kept = [line for line in text.splitlines()
            if line.strip() and not re.match(r"^[WI]\d{4} ", line) and "*****" not in line]
    return "\n".join(kept[-lines:])


def _kill(proc, evidence_dir):
    """Stop torchrun and its workers. torchrun starts each worker in a session of its
    own, so killing torchrun's process group would leave them running: kill each worker's
    group by the pid it recorded at start-up, then torchrun's."""
    for pid_file in evidence_dir.glob("pid.*"):
        try:
            os.killpg(int(pid_file.read_text()), signal.SIGKILL)
        except (ValueError, ProcessLookupError, PermissionError):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def launch(script, config=Config(), nproc=None):
    """Run ``script`` once under torchrun with ``config``'s flags; return a ``Run``.

    Never raises for the learner's failures (crash, hang, missing file): they become
    ``Run.failure``, which every check reports.
    """
    layout_nproc, on_gpu = process_layout()
    nproc = nproc or layout_nproc
    time_limit = float(os.environ.get(TIME_LIMIT_ENV, config.time_limit_s))
    run = Run(script=str(script), config=config, nproc=nproc, on_gpu=on_gpu,
              time_limit_s=time_limit)
    if not Path(script).is_file():
        run.missing_script = True
        print(run.summary())
        return run

    # A fresh folder each time: nothing left from an earlier run can count for this one.
    shutil.rmtree(RUN_DIR, ignore_errors=True)
    evidence_dir = (RUN_DIR / "evidence").resolve()
    evidence_dir.mkdir(parents=True)
    run.out_dir = (RUN_DIR / "out").resolve()
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={nproc}", str(Path(__file__).resolve()), "record",
        str(evidence_dir), str(run.out_dir), str(script),
        "--epochs", str(config.epochs), "--batch-size", str(config.batch_size),
        "--seed", str(config.seed), "--out", str(run.out_dir),
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           # Spinning OpenMP threads on shared cores slow CPU ranks down many times over.
           "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    if not on_gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""  # one GPU cannot host two NCCL ranks: use the CPU
    start = time.perf_counter()
    # stderr joins stdout: a test cell that writes to stderr scores 0, and torchrun
    # always warns there.
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", env=env, start_new_session=True)
    try:
        run.output, _ = proc.communicate(timeout=time_limit)
    except subprocess.TimeoutExpired:
        run.timed_out = True
        _kill(proc, evidence_dir)
        try:
            run.output, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            run.output = ""
    run.elapsed_s = time.perf_counter() - start
    run.returncode = proc.returncode
    run.ranks = []
    for rank in range(nproc):
        path = evidence_dir / f"rank{rank}.json"
        run.ranks.append(json.loads(path.read_text()) if path.is_file() else None)
    print(run.summary())
    if run.ok:
        print("\n".join(run.ranks[0]["stdout"][-(config.epochs + 4):]))
    return run


# --------------------------------------------------------------------------------------
# Kernel side: one check per requirement.
# --------------------------------------------------------------------------------------

def _require(run):
    if not isinstance(run, Run):
        raise RequirementNotMet("run the cell that launches your script first.")
    if not run.ok:
        raise RequirementNotMet(run.failure)


def _passed(message):
    print(f"PASS: {message}")


def _train_passes(run):
    """``[rank][epoch] -> list of training-set indices`` in the order each rank drew them."""
    passes = [[p["indices"] for p in record["passes"] if p["split"] == "train"]
              for record in run.ranks]
    epochs = run.config.epochs
    for rank, rank_passes in enumerate(passes):
        if len(rank_passes) != epochs:
            raise RequirementNotMet(
                f"rank {rank} went through a DataLoader over train_set {len(rank_passes)} "
                f"times in {epochs} epochs; expected once per epoch. Keep training from a "
                f"DataLoader over train_set (with a sampler, or over a Subset of it).")
    return passes


def check_shards_disjoint_and_cover(run):
    """In every epoch the ranks train on disjoint shards that together cover the data.

    DistributedSampler may repeat up to world_size - 1 samples to make the shards equal
    (or drop as many with drop_last=True); that much overlap or shortfall is allowed.
    """
    _require(run)
    passes = _train_passes(run)
    n_train = run.ranks[0]["n_train"]
    slack = run.nproc - 1
    for epoch in range(run.config.epochs):
        drawn = [passes[rank][epoch] for rank in range(run.nproc)]
        total = sum(len(d) for d in drawn)
        covered = set().union(*map(set, drawn))
        repeats = total - len(covered)
        if repeats > slack:
            sizes = " and ".join(str(len(d)) for d in drawn)
            raise RequirementNotMet(
                f"in epoch {epoch + 1} the ranks drew {sizes} training samples, "
                f"{repeats} of them drawn more than once: the ranks train on overlapping "
                f"data. Give each rank its own shard (DistributedSampler).")
        if len(covered) < n_train - slack:
            raise RequirementNotMet(
                f"in epoch {epoch + 1} {n_train - len(covered)} of the {n_train:,} training "
                f"samples went to no rank: together the shards must cover the training "
                f"set.")
    _passed(f"in each of the {run.config.epochs} epochs the {run.nproc} ranks trained on "
            f"disjoint shards that cover all {n_train:,} training samples.")


def check_shards_reshuffled(run):
    """Each rank's samples come in a different order (or from a different shard) in
    every epoch."""
    _require(run)
    passes = _train_passes(run)
    if run.config.epochs < 2:
        raise RequirementNotMet("this check needs a run of two epochs or more.")
    for rank, rank_passes in enumerate(passes):
        for epoch in range(1, len(rank_passes)):
            if rank_passes[epoch] == rank_passes[epoch - 1]:
                raise RequirementNotMet(
                    f"rank {rank} drew the same samples in the same order in epochs "
                    f"{epoch} and {epoch + 1}. DistributedSampler shuffles by epoch "
                    f"number: call train_sampler.set_epoch(epoch) before each epoch.")
    _passed(f"every rank drew its samples in a new order in each of the "
            f"{run.config.epochs} epochs.")


def _params(record):
    return array("f", base64.b64decode(record["model"]["params_b64"]))


def _model_found(run):
    for rank, record in enumerate(run.ranks):
        if not record["model"]["found"]:
            raise RequirementNotMet(f"rank {rank}: {record['model']['problem']}")


def check_parameters_identical(run):
    """After training, every rank holds the same parameters as rank 0."""
    _require(run)
    _model_found(run)
    for rank, record in enumerate(run.ranks):
        if record["process_group_size"] != run.nproc:
            raise RequirementNotMet(
                f"rank {rank} trained outside a process group of all {run.nproc} ranks "
                f"(dist.init_process_group was not called before training): nothing kept "
                f"the ranks' models in step.")
    reference = _params(run.ranks[0])
    for rank, record in enumerate(run.ranks[1:], start=1):
        params = _params(record)
        if len(params) != len(reference):
            raise RequirementNotMet(f"rank {rank}'s model has a different size from "
                                    f"rank 0's.")
        worst = max(abs(a - b) / (1 + abs(b)) for a, b in zip(params, reference, strict=True))
        if worst > PARAM_ATOL:
            raise RequirementNotMet(
                f"after training, rank {rank}'s parameters differ from rank 0's (by up to "
                f"{worst:.3g}): the gradients were not averaged over the ranks. Wrap the "
                f"model in DistributedDataParallel.")
    _passed(f"the {run.nproc} ranks hold identical parameters after training.")


def check_rank0_only_writes(run):
    """Rank 0, and only rank 0, prints the per-epoch table and writes files."""
    _require(run)
    for rank, record in enumerate(run.ranks[1:], start=1):
        if record["writes"]:
            names = ", ".join(sorted({_short(p, run) for p in record["writes"]})[:4])
            raise RequirementNotMet(
                f"rank {rank} wrote {names}: only rank 0 may write the log and the "
                f"checkpoint (every other rank would overwrite the same files).")
        if record["metric_lines"]:
            raise RequirementNotMet(
                f"rank {rank} printed the per-epoch table too, e.g. "
                f"{record['metric_lines'][0]!r}: only rank 0 should print it.")
    rank0 = run.ranks[0]
    missing = [name for name in ("log.jsonl", "checkpoint.pt")
               if not (run.out_dir / name).is_file()]
    if missing or not any(_under(path, run.out_dir) for path in rank0["writes"]):
        raise RequirementNotMet(f"rank 0 did not write {' and '.join(missing) or 'anything'}"
                                f" in the --out folder.")
    if not rank0["metric_lines"]:
        raise RequirementNotMet("rank 0 did not print the per-epoch table (val_loss, "
                                "val_acc).")
    _passed("only rank 0 printed the table and wrote log.jsonl and checkpoint.pt.")


def check_checkpoint_loads(run):
    """What rank 0 saved last loads into the plain model (no DDP) and holds the trained
    parameters."""
    _require(run)
    _model_found(run)
    checkpoint = run.ranks[0]["checkpoint"]
    if not checkpoint["saved"]:
        raise RequirementNotMet("rank 0 saved nothing with torch.save in the --out folder.")
    if not checkpoint["loads"]:
        raise RequirementNotMet(
            f"the checkpoint rank 0 saved does not load into the plain model with "
            f"load_state_dict: {checkpoint['problem']} Save model.module.state_dict(), "
            f"the model without its DDP wrapper.")
    if not checkpoint["matches_final"]:
        raise RequirementNotMet("the last checkpoint rank 0 saved does not hold the "
                                "parameters the model has at the end of training.")
    _passed("the checkpoint loads into the plain model and holds the trained parameters.")


def _expected_metrics(run):
    """The global validation metrics for what the ranks evaluated: each rank's final model
    on the validation samples of its last pass over val_set, summed over ranks. With no
    such pass on any rank, rank 0's model on the whole validation set."""
    loss_sum = correct = count = 0
    for record in run.ranks:
        shard = [p["indices"] for p in record["passes"] if p["split"] == "val"]
        if shard:
            losses, hits = record["val_eval"]["loss"], record["val_eval"]["correct"]
            loss_sum += sum(losses[i] for i in shard[-1])
            correct += sum(hits[i] for i in shard[-1])
            count += len(shard[-1])
    if count == 0:
        evaluation = run.ranks[0]["val_eval"]
        loss_sum, correct = sum(evaluation["loss"]), sum(evaluation["correct"])
        count = len(evaluation["loss"])
    return loss_sum / count, correct / count


def _reported_metrics(run):
    log = run.out_dir / "log.jsonl"
    if not log.is_file():
        raise RequirementNotMet("there is no log.jsonl in the --out folder.")
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    try:
        last = json.loads(lines[-1])
        return float(last["val_loss"]), float(last["val_acc"])
    except (IndexError, ValueError, KeyError, TypeError):
        raise RequirementNotMet("the last line of log.jsonl is not a JSON record with "
                                "val_loss and val_acc.") from None


def check_metrics_global(run):
    """The validation loss and accuracy in the log are over the whole validation set
    (every rank's share), not one rank's."""
    _require(run)
    _model_found(run)
    for rank, record in enumerate(run.ranks):
        if "error" in record["val_eval"]:
            raise RequirementNotMet(f"rank {rank}: {record['val_eval']['error']}")
    loss, acc = _reported_metrics(run)
    expected_loss, expected_acc = _expected_metrics(run)
    if (abs(acc - expected_acc) > ACC_TOLERANCE
            or not math.isclose(loss, expected_loss, rel_tol=LOSS_RTOL, abs_tol=1e-4)):
        raise RequirementNotMet(
            f"the last epoch's log reports val_loss {loss:.4f}, val_acc {acc:.4f}; over "
            f"the whole validation set the model scores val_loss {expected_loss:.4f}, "
            f"val_acc {expected_acc:.4f}. Each rank evaluates only its share: sum the "
            f"ranks' sums (dist.all_reduce) before dividing.")
    _passed(f"the log reports the global validation metrics (val_loss {loss:.4f}, "
            f"val_acc {acc:.4f}).")


def check_target_accuracy(run):
    """The job finishes in time on every rank, and rank 0's final model reaches the
    target accuracy on the whole validation set."""
    _require(run)
    _model_found(run)
    evaluation = run.ranks[0]["val_eval"]
    if "error" in evaluation:
        raise RequirementNotMet(f"rank 0: {evaluation['error']}")
    acc = sum(evaluation["correct"]) / len(evaluation["correct"])
    target = run.config.target_accuracy
    if acc < target:
        raise RequirementNotMet(
            f"after {run.config.epochs} epochs the model classifies {acc:.1%} of the "
            f"validation set correctly; the target is {target:.0%}.")
    _passed(f"after {run.config.epochs} epochs the model classifies {acc:.1%} of the "
            f"validation set correctly (target {target:.0%}), in {run.elapsed_s:.0f} s.")


def _under(path, folder):
    return folder is not None and Path(path).is_relative_to(folder)


def _short(path, run):
    for base in (run.out_dir.parent, Path.cwd()):
        if Path(path).is_relative_to(base):
            return str(Path(path).relative_to(base))
    return path


# --------------------------------------------------------------------------------------
# Rank side: run the script in this process and record what it does.
# --------------------------------------------------------------------------------------

class _Tee:
    """sys.stdout that also keeps the lines written, for the record."""

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


class _Recorder:
    def __init__(self, rank, evidence_dir, out_dir, script):
        self.rank, self.evidence_dir, self.script = rank, evidence_dir, Path(script)
        self.out_dir = Path(out_dir)
        self.recording = True
        self.passes = []  # {"split", "indices"} per DataLoader iteration, in order
        self.datasets = {}  # id -> "train" / "val"
        self.train_set = self.val_set = None
        self.modules = {}  # every module called, by id: the model is among them
        self.optimizers = []
        self.process_group_size = None  # at the first optimizer step
        self.saves = []  # (path, bytes) of each torch.save to a file
        self.writes = []
        self.stdout = []
        self.error = None
        self._module_hook = self._step_hook = None

    # -- what the script calls -----------------------------------------------------------

    def install(self):
        import builtins
        import io

        import torch
        import torch.distributed as dist
        from torch.nn.modules.module import register_module_forward_pre_hook
        from torch.optim.optimizer import register_optimizer_step_pre_hook
        from torch.utils.data import Subset, dataloader

        recorder = self
        sys.path.insert(0, str(self.script.resolve().parent))
        import digits_data

        load_data = digits_data.load_data

        def recorded_load_data(*args, **kwargs):
            train_set, val_set = load_data(*args, **kwargs)
            recorder.train_set, recorder.val_set = train_set, val_set
            recorder.datasets = {id(train_set): "train", id(val_set): "val"}
            return train_set, val_set

        digits_data.load_data = recorded_load_data

        base = dataloader._BaseDataLoaderIter
        base_init, base_reset, base_next_index = base.__init__, base._reset, base._next_index

        def new_pass(iterator, dataset):
            chain = []  # Subset index lists, outermost first
            while isinstance(dataset, Subset):
                chain.append(dataset.indices)
                dataset = dataset.dataset
            iterator._ddp_checks_pass = None
            split = recorder.datasets.get(id(dataset))
            if split and recorder.recording:
                iterator._ddp_checks_pass = ({"split": split, "indices": []}, chain)
                recorder.passes.append(iterator._ddp_checks_pass[0])

        def init(iterator, loader, *args, **kwargs):
            # Before the original: a multi-worker iterator prefetches indices in __init__.
            new_pass(iterator, loader.dataset)
            base_init(iterator, loader, *args, **kwargs)

        def reset(iterator, loader, first_iter=False):
            if not first_iter:  # persistent workers: a new epoch on the same iterator
                new_pass(iterator, loader.dataset)
            return base_reset(iterator, loader, first_iter=first_iter)

        def next_index(iterator):
            index = base_next_index(iterator)
            current = getattr(iterator, "_ddp_checks_pass", None)
            if current:
                record, chain = current
                batch = index.tolist() if hasattr(index, "tolist") else index
                for i in (batch if isinstance(batch, (list, tuple)) else [batch]):
                    i = int(i)
                    for indices in chain:
                        i = int(indices[i])
                    record["indices"].append(i)
            return index

        base.__init__, base._reset, base._next_index = init, reset, next_index

        def seen(module, inputs):
            recorder.modules.setdefault(id(module), module)

        self._module_hook = register_module_forward_pre_hook(seen)

        optimizer_init = torch.optim.Optimizer.__init__

        def recorded_optimizer_init(optimizer, *args, **kwargs):
            optimizer_init(optimizer, *args, **kwargs)
            recorder.optimizers.append(optimizer)

        torch.optim.Optimizer.__init__ = recorded_optimizer_init

        def first_step(optimizer, args, kwargs):
            if recorder.process_group_size is None:
                recorder.process_group_size = (dist.get_world_size() if dist.is_available()
                                               and dist.is_initialized() else 1)

        self._step_hook = register_optimizer_step_pre_hook(first_step)

        save = torch.save

        def recorded_save(obj, f, *args, **kwargs):
            result = save(obj, f, *args, **kwargs)
            if recorder.recording and isinstance(f, (str, os.PathLike)):
                # torch.save opens files in C++, past the open() recorded below.
                recorder.writes.append(os.path.abspath(f))
                # A copy of what this rank wrote: the file itself may be overwritten by
                # another rank before the check reads it.
                buffer = io.BytesIO()
                save(obj, buffer)
                recorder.saves.append((os.path.abspath(f), buffer.getvalue()))
                recorder.saves = recorder.saves[-4:]
            return result

        torch.save = recorded_save

        original_open = builtins.open

        def recorded_open(file, mode="r", *args, **kwargs):
            if (recorder.recording and isinstance(file, (str, bytes, os.PathLike))
                    and any(flag in mode for flag in "wax+")):
                path = os.path.abspath(os.fsdecode(file))
                if not path.startswith(("/dev/", "/proc/", "/sys/")):
                    recorder.writes.append(path)
            return original_open(file, mode, *args, **kwargs)

        builtins.open = io.open = recorded_open
        sys.stdout = _Tee(sys.stdout, self.stdout)

    def run(self, script_args):
        import runpy
        import traceback

        sys.argv = [str(self.script), *script_args]
        try:
            runpy.run_path(str(self.script), run_name="__main__")
        except SystemExit as stop:
            if stop.code not in (None, 0):
                self.error = {"type": "SystemExit", "message": f"exit status {stop.code}",
                              "where": "sys.exit"}
        except BaseException as error:  # noqa: B036 - a KeyboardInterrupt is a failure too
            traceback.print_exc()
            self.error = self._describe(error)
        finally:
            self.recording = False
            self._module_hook.remove()
            self._step_hook.remove()
            sys.stdout.flush()

    def _describe(self, error):
        import traceback

        frames = traceback.extract_tb(error.__traceback__)
        mine = [f for f in frames if Path(f.filename).name == self.script.name]
        frame = (mine or frames or [None])[-1]
        where = (f"{Path(frame.filename).name} line {frame.lineno}, in {frame.name}: "
                 f"{(frame.line or '').strip()}") if frame else "unknown place"
        message = str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
        return {"type": type(error).__name__, "message": message,
                "where": where}

    # -- the record ----------------------------------------------------------------------

    def find_model(self):
        """The module the script trains: called in forward passes, its parameters in an
        optimizer, and not part of a larger such module. DDP wrappers are skipped (their
        .module is the model)."""
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
        import copy
        import io

        import torch

        saves = [data for path, data in self.saves if Path(path).is_relative_to(self.out_dir)]
        if not saves:
            return {"saved": False}
        result = {"saved": True, "loads": False, "matches_final": False, "problem": ""}
        try:
            saved = torch.load(io.BytesIO(saves[-1]), map_location="cpu", weights_only=False)
        except Exception as error:
            result["problem"] = f"torch.load fails ({type(error).__name__}: {error})."
            return result
        state = None
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
        final = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        result["matches_final"] = all(torch.equal(final[k], v.detach().cpu())
                                      for k, v in plain.state_dict().items())
        return result

    def record(self):
        import torch

        record = {
            "rank": self.rank,
            "error": self.error,
            "data_loaded": self.train_set is not None,
            "n_train": len(self.train_set) if self.train_set is not None else 0,
            "passes": self.passes,
            "process_group_size": self.process_group_size,
            "writes": sorted(set(self.writes)),
            "metric_lines": [line for line in self.stdout if METRIC_LINE.search(line)][:20],
            "stdout": self.stdout[-50:],
            "model": {"found": False},
            "val_eval": {"error": "no model was found."},
            "checkpoint": {"saved": False},
        }
        model, problem = self.find_model()
        if model is None:
            record["model"]["problem"] = problem
            return record
        state = model.state_dict()
        flat = torch.cat([state[k].detach().float().cpu().flatten() for k in sorted(state)])
        record["model"] = {"found": True, "params_b64": base64.b64encode(
            flat.numpy().astype("float32").tobytes()).decode()}
        record["val_eval"] = self.evaluate(model)
        record["checkpoint"] = self.check_checkpoint(model)
        return record


def _record_main(evidence_dir, out_dir, script, *script_args):
    rank = int(os.environ.get("RANK", 0))
    evidence_dir = Path(evidence_dir)
    # First of all: the launcher kills this pid's group if the job outlives its time.
    (evidence_dir / f"pid.{rank}").write_text(str(os.getpid()))
    write = open  # before install() replaces it
    recorder = _Recorder(rank, evidence_dir, out_dir, script)
    try:
        recorder.install()
    except Exception as error:  # e.g. digits_data.py is missing
        recorder.error = recorder._describe(error)
    else:
        recorder.run(script_args)
    try:
        record = recorder.record()
    except Exception as error:  # the record must be written whatever the script did
        record = {"rank": rank, "data_loaded": recorder.train_set is not None,
                  "error": recorder.error or {
                      "type": type(error).__name__, "where": "ddp_checks",
                      "message": f"the grader could not inspect the model: {error}"}}
    partial = evidence_dir / f"rank{rank}.json.part"
    with write(partial, "w") as f:
        json.dump(record, f)
    os.replace(partial, evidence_dir / f"rank{rank}.json")
    return 1 if recorder.error else 0


if __name__ == "__main__" and len(sys.argv) > 4 and sys.argv[1] == "record":
    sys.exit(_record_main(*sys.argv[2:]))
