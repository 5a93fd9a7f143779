"""The checks of what rank 0 alone prints and writes: only rank 0 prints the per-epoch
table and writes files (requirement 5), its checkpoint loads into the plain model
(requirement 6), and the validation metrics it logs are over the whole validation set,
every rank's share of it (requirement 7).

They judge from the records of all ranks (the lines each printed, the files each wrote,
what rank 0 saved last, each rank's final model scored on every validation sample) and
from the log.jsonl in the run's --out folder.

Your copy of this file is replaced by the instructor's when your work is graded.

Standard library only: the notebook's kernel imports this file.
"""
import json
import math
from pathlib import Path

from ddp_checks_rules import RequirementNotMet
from ddp_checks_run import _passed, _require, _require_model
from ddp_checks_training import _samples

ACC_TOLERANCE = 1e-4  # well under one validation sample (1/360)
LOSS_RTOL = 1e-3  # float32 sums in another order differ by ~1e-6


def _under(path, folder):
    return folder is not None and Path(path).is_relative_to(folder)


def _short(path, run):
    for base in (run.out_dir.parent, Path.cwd()):
        if Path(path).is_relative_to(base):
            return str(Path(path).relative_to(base))
    return path


def _table_lines(record):
    """``(lines, stream)``: the per-epoch table's lines a rank printed on stdout, else those
    it wrote to stderr (``logging``, ``print(..., file=sys.stderr)``)."""
    if record["metric_lines"]:
        return record["metric_lines"], "stdout"
    return record.get("stderr_metric_lines", []), "stderr"


def check_rank0_only_logs_and_writes(run):
    """Rank 0, and only rank 0, prints the per-epoch table (on stdout or stderr: a line
    giving val_loss or val_acc a value) and writes files."""
    _require(run)
    for rank, record in enumerate(run.ranks[1:], start=1):
        if record["writes"]:
            names = ", ".join(sorted({_short(p, run) for p in record["writes"]})[:4])
            raise RequirementNotMet(
                f"rank {rank} wrote {names}: only rank 0 may write the log and the "
                f"checkpoint (every other rank would overwrite the same files).")
        lines, stream = _table_lines(record)
        if lines:
            raise RequirementNotMet(
                f"rank {rank} printed the per-epoch table too, on {stream}, e.g. "
                f"{lines[0]!r}: only rank 0 should print it.")
    rank0 = run.ranks[0]
    missing = [name for name in ("log.jsonl", "checkpoint.pt")
               if not (run.out_dir / name).is_file()]
    if missing or not any(_under(path, run.out_dir) for path in rank0["writes"]):
        raise RequirementNotMet(f"rank 0 did not write {' and '.join(missing) or 'anything'}"
                                f" in the --out folder.")
    lines, stream = _table_lines(rank0)
    if not lines:
        raise RequirementNotMet("rank 0 did not print the per-epoch table: a line per epoch "
                                "giving val_loss and val_acc their values, on stdout or "
                                "stderr.")
    _passed(f"only rank 0 printed the table (on {stream}"
            + (", where logging writes: stdout and stderr both count" if stream == "stderr"
               else "") + ") and wrote log.jsonl and checkpoint.pt.")


def check_checkpoint_loads_into_plain_model(run):
    """What rank 0 saved last loads into the plain model (no DDP) and holds the trained
    parameters."""
    _require_model(run)
    checkpoint = run.ranks[0]["checkpoint"]
    if not checkpoint["saved"]:
        raise RequirementNotMet("rank 0 saved nothing with torch.save in the --out folder "
                                "(by path, through a file object, or to a temporary file "
                                "renamed into it).")
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
