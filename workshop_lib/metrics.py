"""From per-epoch sums to the metrics a run reports, and the early-stop rule.

The training scripts accumulate sums (of losses, correct predictions, samples) rather
than averages, because sums add up across ranks: one all-reduce of the sums gives the
exact global metrics, whatever the shard sizes.
"""
from dataclasses import dataclass


def epoch_record(epoch, train_sums, val_sums, lr, world_size, global_batch_size, epoch_s,
                 elapsed_s, **measured):
    """One run-log record from ``[loss_sum, count]`` and ``[loss_sum, correct, count]``;
    ``measured``: more figures of the epoch (memory, ...), recorded as they are."""
    train_loss_sum, train_count = train_sums.tolist()
    val_loss_sum, val_correct, val_count = val_sums.tolist()
    return dict(
        epoch=epoch,
        train_loss=train_loss_sum / train_count,
        val_loss=val_loss_sum / val_count,
        val_acc=val_correct / val_count,
        val_samples=int(val_count),
        lr=lr,
        world_size=world_size,
        global_batch_size=global_batch_size,
        samples_per_s=train_count / epoch_s,
        epoch_s=epoch_s,
        elapsed_s=elapsed_s,
        **measured,
    )


@dataclass
class TargetAccuracy:
    """Stop once validation accuracy has reached ``target`` for ``patience`` epochs in a row."""

    target: float | None
    patience: int = 1
    streak: int = 0

    def reached(self, val_acc):
        if self.target is None:
            return False
        self.streak = self.streak + 1 if val_acc >= self.target else 0
        return self.streak >= self.patience

    def reason(self):
        return f"val_acc >= {self.target} for {self.patience} epoch(s) in a row"


def shard_accuracies(model, val_set, world_size, evaluate, device="cpu"):
    """Accuracy on each rank's validation shard, and on the whole set (notebook 02).

    ``evaluate(model, loader)`` is the training script's own evaluation (it returns the
    sums [loss, correct, samples]). Shows why a DDP job must all-reduce its metrics: each
    rank alone sees a different number, and the mean of the shard accuracies is not the
    global accuracy either unless the shards are equally large.
    """
    from workshop_lib import data

    per_rank = []
    for rank in range(world_size):
        loader = data.TensorLoader(val_set, data.VAL_BATCH_SIZE,
                                   data.ShardSampler(val_set, rank, world_size), device)
        _, correct, count = evaluate(model, loader).tolist()
        per_rank.append({"rank": rank, "correct": int(correct), "samples": int(count),
                         "accuracy": correct / count})
    total_correct = sum(r["correct"] for r in per_rank)
    total = sum(r["samples"] for r in per_rank)
    return per_rank, total_correct / total
