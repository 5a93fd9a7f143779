"""Optimizers the scripts can use: SGD with momentum, and LARS for very large batches.

LARS (You, Gitman & Ginsburg 2017, "Large Batch Training of Convolutional Networks")
scales each layer's step by a trust ratio ``||w|| / ||g + wd*w||``, so that no layer's
update is large relative to its weights. It is meant to let the linear scaling rule's
large learning rates work where plain SGD diverges, with a warmup and a rate of its own;
notebook 03 runs it at plain SGD's settings and says what that shows.
"""
import torch

OPTIMIZERS = ("sgd", "lars")
# The training scripts' defaults (--lr, --momentum, --weight-decay), which the bench and the
# trace use too: their timings do not depend on them, but they time the course's step.
LR, MOMENTUM, WEIGHT_DECAY = 0.05, 0.9, 5e-4


class LARS(torch.optim.Optimizer):
    """SGD with momentum whose per-tensor step is scaled by a trust ratio.

    Biases and normalisation parameters (tensors with one dimension) are excluded from
    the trust ratio and from weight decay, as in the paper's implementations.
    """

    def __init__(self, params, lr, momentum=0.9, weight_decay=0.0, trust_coefficient=0.02,
                 eps=1e-9):
        defaults = dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                        trust_coefficient=trust_coefficient, eps=eps)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                update = p.grad
                if p.ndim > 1:
                    update = update.add(p, alpha=group["weight_decay"])
                    w_norm, u_norm = torch.linalg.vector_norm(p), torch.linalg.vector_norm(update)
                    trust = torch.where(
                        (w_norm > 0) & (u_norm > 0),
                        group["trust_coefficient"] * w_norm / (u_norm + group["eps"]),
                        torch.ones_like(w_norm))
                    update = update * trust
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = update.clone()
                else:
                    state["momentum_buffer"].mul_(group["momentum"]).add_(update)
                p.add_(state["momentum_buffer"], alpha=-group["lr"])
        return loss


def build(name, params, lr, momentum, weight_decay):
    """The optimizer ``name`` (see OPTIMIZERS) over ``params``."""
    if name == "lars":
        return LARS(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
