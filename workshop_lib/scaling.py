"""Learning-rate scaling rules and warmup (notebook 03, "Keeping accuracy at scale").

``--lr`` is the rate tuned at a reference global batch (``--lr-ref-batch``). When the
global batch grows k-fold:

- ``none``: keep the rate. Fewer, equally long steps per epoch: large batches fall behind.
- ``linear``: multiply by k (Goyal et al. 2017): k small steps ~ one k-times-longer step.
- ``sqrt``: multiply by sqrt(k). Why: a mini-batch gradient is the mean of the batch's
  per-sample gradients, so its variance falls as 1/batch and its noise (standard
  deviation) as 1/sqrt(batch); a step's noise is the rate times that, so a rate grown by
  sqrt(k) keeps each step as noisy as the small batch's (Krizhevsky 2014, Hoffer et al.
  2017). It takes smaller steps than the linear rule: safer when linear scaling diverges,
  slower when it does not.

Warmup raises the rate linearly over the first epochs, because the linear rule's large
early steps are what diverge. Goyal et al.'s gradual warmup starts from the small-batch
rate (the unscaled ``--lr``) and reaches the scaled one after the warmup epochs
(``--warmup-from base``, the default); ``--warmup-from zero`` starts from ~0 instead.
After warmup the ``cosine`` schedule decays the rate to zero by the last step, so the
final accuracy is not the noise of a large constant step; ``constant`` keeps it.
"""
import math

SCALING_RULES = ("none", "linear", "sqrt")
SCHEDULES = ("cosine", "constant")


def scaled_lr(lr, rule, global_batch_size, ref_batch_size):
    """The learning rate for ``global_batch_size`` under a scaling ``rule``."""
    k = global_batch_size / ref_batch_size
    if rule == "none":
        return lr
    if rule == "linear":
        return lr * k
    if rule == "sqrt":
        return lr * math.sqrt(k)
    raise ValueError(f"unknown scaling rule {rule!r}; choose one of {SCALING_RULES}")


WARMUP_FROM = ("base", "zero")
# ``--warmup-from zero``'s first factor: about 0, and above it, as PyTorch's LinearLR needs
# (its start_factor is in (0, 1]).
ZERO_START = 1e-3


def warmup_start(warmup_from, base_lr, scaled_lr):
    """The factor of the scaled rate that warmup starts from: the base rate's share of it
    (``base``, Goyal et al.: 1/k for a k-times rate), or about 0 (``zero``)."""
    return min(1.0, base_lr / scaled_lr) if warmup_from == "base" else ZERO_START


def lr_factor(step, warmup_steps, total_steps, schedule="cosine", start=ZERO_START):
    """Multiplier for the learning rate at optimizer step ``step`` (0-based): a linear ramp
    from ``start`` at the first step to 1 at step ``warmup_steps`` (Goyal et al.: from the
    base rate, up by the same amount each step, the scaled rate reached after the warmup),
    then the schedule."""
    if step < warmup_steps:
        return start + (1 - start) * step / warmup_steps
    if schedule == "constant" or step >= total_steps:
        return 1.0 if schedule == "constant" else 0.0
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return 0.5 * (1 + math.cos(math.pi * progress))


def warmup_cosine_scheduler(optimizer, warmup_steps, total_steps, start=ZERO_START):
    """``lr_factor``'s warmup and cosine decay as learners write them with PyTorch's own
    schedulers (call ``.step()`` after every optimizer step, as for the course's
    LambdaLR): a LinearLR ramp, then CosineAnnealingLR, chained by SequentialLR at the
    end of warmup. LinearLR, as PyTorch documents it: the first step's rate is the scaled
    rate times ``start_factor`` (1/k: the base rate), and it reaches the scaled rate after
    ``total_iters`` steps; the test pins it to ``lr_factor`` at every step."""
    from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR

    ramp = LinearLR(optimizer, start_factor=start, end_factor=1.0, total_iters=warmup_steps)
    decay = CosineAnnealingLR(optimizer, T_max=total_steps - warmup_steps)
    return SequentialLR(optimizer, [ramp, decay], milestones=[warmup_steps])
