"""The assessment's checks: launch a training script under torchrun, then judge what it did.

The test cells of the assessment notebook call this module, one check per test cell, each
named after the cell's grade id:

    run = ddp_checks.launch("train_digits_ddp.py", ddp_checks.Config(epochs=3))
    ddp_checks.check_shards_disjoint_and_cover(run)

``launch`` starts the script once with torchrun, with ``ddp_recorder.py`` (next to this
file) as every process's entry point: it runs the script unchanged and records what each
rank does (ddp_recorder.py says what, and how). Each ``check_<grade id>`` function judges
one requirement from the records of all ranks, prints ``PASS: ...`` or raises
``RequirementNotMet`` with the reason in one line. Nothing reads the script's source: any
correct way of writing it passes. ``report`` adds up the points and says whether they reach
the pass mark.

Your copy of this file is replaced by the instructor's when your work is graded.

Standard library only: importing torch in the notebook's kernel would add seconds to every
graded notebook.
"""
import base64
import contextlib
import io
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
RECORDER = Path(__file__).resolve().with_name("ddp_recorder.py")
TIME_LIMIT_ENV = "DDP_CHECKS_TIME_LIMIT_S"  # instructor's override of Config.time_limit_s
NPROC_ENV = "DDP_CHECKS_NPROC"  # instructor's override of the number of processes
CPU_PROCESSES = 2  # processes to launch where there are fewer than two GPUs
ACC_TOLERANCE = 1e-4  # well under one validation sample (1/360)
LOSS_RTOL = 1e-3  # float32 sums in another order differ by ~1e-6
PARAM_RTOL = 1e-6  # ranks that average their gradients hold bit-identical parameters
START_RTOL = 1e-6  # ranks that start from rank 0's parameters hold exactly those
# A replay on the CPU in float32 matches a correct job within ~1e-6 of the update; a job
# that sums its gradients is off by ~1 update, one whose ranks step alone by ~0.5.
REPLAY_RTOL = 0.02
LR_RTOL = 1e-3

# The requirements, in the notebook's order: grade id -> points.
REQUIREMENTS = {
    "runs_and_reaches_target_accuracy": 1,
    "shards_disjoint_and_cover": 2,
    "shards_reshuffled_each_epoch": 1,
    "gradients_averaged_over_ranks": 3,
    "rank0_only_logs_and_writes": 1,
    "checkpoint_loads_into_plain_model": 1,
    "validation_metrics_are_global": 2,
    "learning_rate_follows_global_batch": 1,
}
# The pass mark: this many points, with these requirements among those met.
PASS_POINTS = 9
PASS_REQUIRES = ("runs_and_reaches_target_accuracy", "gradients_averaged_over_ranks")


def passes(met):
    """Whether a learner who met the requirements ``met`` (grade ids) passes."""
    points = sum(REQUIREMENTS[grade_id] for grade_id in met)
    return points >= PASS_POINTS and all(grade_id in met for grade_id in PASS_REQUIRES)


def pass_rule():
    """The pass mark, in words."""
    return (f"at least {PASS_POINTS} of the {sum(REQUIREMENTS.values())} points, "
            f"including {' and '.join(PASS_REQUIRES)}")


@dataclass(frozen=True)
class Config:
    """One graded run: the script's flags, the accuracy to reach and the time allowed."""

    epochs: int = 3
    batch_size: int = 32
    lr: float = 0.05
    seed: int = 0
    target_accuracy: float = 0.85
    time_limit_s: float = 300


class RequirementNotMet(AssertionError):
    """A requirement the run does not meet; shown as its message alone, no traceback."""

    def _render_traceback_(self):
        return [f"\x1b[0;31mRequirement not met\x1b[0m: {self}"]


# --------------------------------------------------------------------------------------
# Launch the script once and load the records.
# --------------------------------------------------------------------------------------

def visible_gpus():
    """How many GPUs a launched process can use, as PyTorch counts them.

    nvidia-smi lists the GPUs the driver sees, also those PyTorch cannot use (a driver
    too old for its CUDA, CUDA_VISIBLE_DEVICES); only where it lists two or more is PyTorch
    asked, in a subprocess (importing torch in this kernel would slow every graded
    notebook by seconds).
    """
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    if sum(1 for line in listed.splitlines() if line.startswith("GPU ")) < 2:
        return 0
    try:
        asked = subprocess.run(
            [sys.executable, "-c", "import torch; print(torch.cuda.device_count() "
                                   "if torch.cuda.is_available() else 0)"],
            capture_output=True, text=True, timeout=120, check=False)
        return int(asked.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return 0


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
                return ("the script never called load_data(): keep loading the data "
                        "with it.")
        return None

    @property
    def ok(self):
        return self.failure is None

    def summary(self):
        where = f"{self.nproc} GPUs (NCCL)" if self.on_gpu else f"{self.nproc} CPU processes"
        head = (f"{self.script} on {where}, {self.config.epochs} epochs, batch size "
                f"{self.config.batch_size} per process, --lr {self.config.lr}, seed "
                f"{self.config.seed}: ")
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
        f"--nproc-per-node={nproc}", str(RECORDER), str(evidence_dir), str(run.out_dir),
        str(script), "--epochs", str(config.epochs), "--batch-size", str(config.batch_size),
        "--lr", str(config.lr), "--seed", str(config.seed), "--out", str(run.out_dir),
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
# One check per requirement, named after its test cell's grade id.
# --------------------------------------------------------------------------------------

def _require(run):
    if not isinstance(run, Run):
        raise RequirementNotMet("run the cell that launches your script first.")
    if not run.ok:
        raise RequirementNotMet(run.failure)


def _require_model(run):
    _require(run)
    for rank, record in enumerate(run.ranks):
        if not record["model"]["found"]:
            raise RequirementNotMet(f"rank {rank}: {record['model']['problem']}")


def _passed(message):
    print(f"PASS: {message}")


def check_runs_and_reaches_target_accuracy(run):
    """The job finishes in time on every rank, and rank 0's final model reaches the
    target accuracy on the whole validation set."""
    _require_model(run)
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


def _train_passes(run):
    """``[rank][epoch] -> list of batches``, each the training-set indices of one batch."""
    passes = [[p["batches"] for p in record["passes"] if p["split"] == "train"]
              for record in run.ranks]
    epochs = run.config.epochs
    for rank, rank_passes in enumerate(passes):
        if len(rank_passes) != epochs:
            raise RequirementNotMet(
                f"rank {rank} went through a DataLoader over train_set {len(rank_passes)} "
                f"times in {epochs} epochs; expected once per epoch. Keep training from a "
                f"DataLoader over train_set (with a sampler, or over a Subset of it).")
    return passes


def _samples(batches):
    return [i for batch in batches for i in batch]


def _droppable(batches):
    """How many samples a pass may have left out of a last, incomplete batch: none if its
    last batch is smaller than the others (nothing was dropped); otherwise up to one batch
    less one (DataLoader(drop_last=True))."""
    if not batches:
        return 0
    size = max(len(batch) for batch in batches)
    return size - 1 if all(len(batch) == size for batch in batches) else 0


def check_shards_disjoint_and_cover(run):
    """In every epoch the ranks train on disjoint shards that together cover the data.

    DistributedSampler may repeat up to world_size - 1 samples to make the shards equal,
    or leave out as many (drop_last=True); a DataLoader with drop_last=True leaves out each
    rank's last incomplete batch. That much overlap, or shortfall, is allowed.
    """
    _require(run)
    passes = _train_passes(run)
    n_train = run.ranks[0]["n_train"]
    sampler_slack = run.nproc - 1
    for epoch in range(run.config.epochs):
        drawn = [_samples(passes[rank][epoch]) for rank in range(run.nproc)]
        total = sum(len(d) for d in drawn)
        covered = set().union(*map(set, drawn))
        repeats = total - len(covered)
        if repeats > sampler_slack:
            sizes = " and ".join(str(len(d)) for d in drawn)
            raise RequirementNotMet(
                f"in epoch {epoch + 1} the ranks drew {sizes} training samples, "
                f"{repeats} of them drawn more than once: the ranks train on overlapping "
                f"data. Give each rank its own shard (DistributedSampler).")
        allowed = sampler_slack + sum(_droppable(passes[rank][epoch])
                                      for rank in range(run.nproc))
        if len(covered) < n_train - allowed:
            raise RequirementNotMet(
                f"in epoch {epoch + 1} {n_train - len(covered)} of the {n_train:,} training "
                f"samples went to no rank (at most {allowed} may be left out by drop_last): "
                f"together the shards must cover the training set.")
    _passed(f"in each of the {run.config.epochs} epochs the {run.nproc} ranks trained on "
            f"disjoint shards that cover the {n_train:,} training samples.")


def check_shards_reshuffled_each_epoch(run):
    """Each rank's samples come in a different order (or from a different shard) in
    every epoch."""
    _require(run)
    passes = _train_passes(run)
    if run.config.epochs < 2:
        raise RequirementNotMet("this check needs a run of two epochs or more.")
    for rank, rank_passes in enumerate(passes):
        for epoch in range(1, len(rank_passes)):
            if _samples(rank_passes[epoch]) == _samples(rank_passes[epoch - 1]):
                raise RequirementNotMet(
                    f"rank {rank} drew the same samples in the same order in epochs "
                    f"{epoch} and {epoch + 1}. DistributedSampler shuffles by epoch "
                    f"number: call set_epoch(epoch) on it before each epoch.")
    _passed(f"every rank drew its samples in a new order in each of the "
            f"{run.config.epochs} epochs.")


def _params(record):
    return array("f", base64.b64decode(record["model"]["params_b64"]))


def _replay_verdict(run, replay):
    """The mistake the replay shows, as a reason; None when the first steps are right."""
    steps, ranks = replay["steps"], replay["ranks"]
    moved = [r for r, result in enumerate(ranks) if result["start"] > START_RTOL]
    if moved:
        return (f"the ranks started training from different parameters (rank {moved[0]}'s "
                f"differ from rank 0's by {ranks[moved[0]]['start']:.2g} of their size): "
                f"start every rank from rank 0's parameters (DistributedDataParallel "
                f"broadcasts them when it wraps the model).")
    if all(result["averaged"] <= REPLAY_RTOL for result in ranks):
        return None
    if all(result["summed"] <= REPLAY_RTOL for result in ranks):
        return (f"after {steps} steps the ranks' parameters equal a replay in which the "
                f"ranks' gradients are summed, not averaged: divide the all-reduced "
                f"gradients by the world size (DistributedDataParallel averages them).")
    if all(result["local"] <= REPLAY_RTOL for result in ranks):
        return (f"after {steps} steps each rank's parameters equal a replay of its own "
                f"batches alone: each rank stepped on its own gradients. Average the "
                f"gradients over the ranks at every step (DistributedDataParallel does it "
                f"in backward()); averaging the parameters now and then is not the same.")
    worst = max(range(len(ranks)), key=lambda r: ranks[r]["averaged"])
    return (f"after {steps} steps rank {worst}'s parameters differ from a single-process "
            f"replay of the same global batches by {ranks[worst]['averaged']:.2g} of the "
            f"update (at most {REPLAY_RTOL} allowed). The replay trains on each step's "
            f"batches of all ranks with F.cross_entropy (mean) and your optimizer: one "
            f"optimizer step per batch, and no dropout.")


def check_gradients_averaged_over_ranks(run):
    """Every rank's parameters after the first optimizer steps equal a single-process
    replay of those steps on the global batch (all ranks' batches of each step), and all
    ranks hold identical parameters at the end."""
    _require_model(run)
    replay = run.ranks[0].get("replay") or {"problem": "rank 0 recorded no replay."}
    if "problem" in replay:
        raise RequirementNotMet(f"the first training steps could not be checked: "
                                f"{replay['problem']}")
    reason = _replay_verdict(run, replay)
    if reason:
        raise RequirementNotMet(reason)
    reference = _params(run.ranks[0])
    for rank, record in enumerate(run.ranks[1:], start=1):
        params = _params(record)
        if len(params) != len(reference):
            raise RequirementNotMet(f"rank {rank}'s model has a different size from "
                                    f"rank 0's.")
        worst = max(abs(a - b) / (1 + abs(b)) for a, b in zip(params, reference, strict=True))
        if worst > PARAM_RTOL:
            raise RequirementNotMet(
                f"the first {replay['steps']} steps match a single-process replay, but "
                f"after training rank {rank}'s parameters differ from rank 0's (by up to "
                f"{worst:.3g}): average the gradients over the ranks at every step.")
    error = max(result["averaged"] for result in replay["ranks"])
    _passed(f"for the first {replay['steps']} steps every rank's parameters equal a "
            f"single-process replay on the global batch (within {error:.1g} of the update), "
            f"and the {run.nproc} ranks hold identical parameters after training.")


def _under(path, folder):
    return folder is not None and Path(path).is_relative_to(folder)


def _short(path, run):
    for base in (run.out_dir.parent, Path.cwd()):
        if Path(path).is_relative_to(base):
            return str(Path(path).relative_to(base))
    return path


def check_rank0_only_logs_and_writes(run):
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


def check_checkpoint_loads_into_plain_model(run):
    """What rank 0 saved last loads into the plain model (no DDP) and holds the trained
    parameters."""
    _require_model(run)
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
        shard = [_samples(p["batches"]) for p in record["passes"] if p["split"] == "val"]
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


def check_validation_metrics_are_global(run):
    """The validation loss and accuracy in the log are over the whole validation set
    (every rank's share), not one rank's."""
    _require_model(run)
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


def scaled_learning_rates(lr, world_size):
    """``{rule: learning rate}``: ``lr``, tuned for one process's batch, scaled to a global
    batch world_size times as large (notebook 03)."""
    return {"linear": lr * world_size, "square-root": lr * math.sqrt(world_size)}


def check_learning_rate_follows_global_batch(run):
    """The learning rate the optimizer uses (its peak over the run, so warmup is allowed)
    is --lr scaled from one process's batch to the global batch, by the linear or the
    square-root rule."""
    _require(run)
    base, world = run.config.lr, run.nproc
    allowed = scaled_learning_rates(base, world)
    for rank, record in enumerate(run.ranks):
        if not record["lrs"]:
            raise RequirementNotMet(f"rank {rank} made no optimizer step.")
        peak = max(record["lrs"])
        if not any(math.isclose(peak, lr, rel_tol=LR_RTOL) for lr in allowed.values()):
            rules = " or ".join(f"{lr:.4g} ({rule})" for rule, lr in allowed.items())
            raise RequirementNotMet(
                f"rank {rank}'s optimizer trained with a learning rate of at most "
                f"{peak:.4g}; the global batch is {world} x --batch-size, so scale --lr "
                f"{base:g} by the world size: {rules}.")
    rule = next(rule for rule, lr in allowed.items()
                if math.isclose(max(run.ranks[0]["lrs"]), lr, rel_tol=LR_RTOL))
    _passed(f"the learning rate peaks at {max(run.ranks[0]['lrs']):.4g}: --lr {base:g} "
            f"scaled to a global batch {world} times as large ({rule} rule).")


CHECKS = {grade_id: globals()[f"check_{grade_id}"] for grade_id in REQUIREMENTS}


def report(run):
    """Print each requirement's verdict, the points and whether they reach the pass mark;
    return ``(points, passed)``."""
    met, lines = set(), []
    for grade_id, points in REQUIREMENTS.items():
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                CHECKS[grade_id](run)
        except RequirementNotMet:
            lines.append(f"  not met  {grade_id} (0 of {points})")
        else:
            met.add(grade_id)
            lines.append(f"  met      {grade_id} ({points} of {points})")
    points = sum(REQUIREMENTS[grade_id] for grade_id in met)
    passed = passes(met)
    print("\n".join(lines))
    print(f"Total: {points} of {sum(REQUIREMENTS.values())} points. Pass mark: "
          f"{pass_rule()}. Result: {'PASSED' if passed else 'NOT PASSED'}.")
    return points, passed
