"""From per-epoch sums to the metrics a run reports, and the early-stop rule.

The training scripts accumulate sums (of losses, correct predictions, samples) rather
than averages, because sums add up across ranks: one all-reduce of the sums gives the
exact global metrics, whatever the shard sizes.
"""
from dataclasses import dataclass


def epoch_record(epoch, train_sums, val_sums, lr, world_size, global_batch_size, epoch_s,
                 elapsed_s):
    """One run-log record from ``[loss_sum, count]`` and ``[loss_sum, correct, count]``."""
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
