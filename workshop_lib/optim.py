"""Optimizers the scripts can use: SGD with momentum, and LARS, LAMB and NovoGrad for
very large batches.

LARS (You, Gitman & Ginsburg 2017, "Large Batch Training of Convolutional Networks")
scales each layer's step by a trust ratio ``||w|| / ||g + wd*w||``, so that no layer's
update is large relative to its weights. It is meant to let the linear scaling rule's
large learning rates work where plain SGD diverges, with a warmup and a rate of its own;
notebook 03 runs it at plain SGD's settings and says what that shows. LAMB (You et al.
2019) does the same for Adam's step; NovoGrad (Ginsburg et al. 2019) divides each tensor's
gradient by its running norm instead. Notebook 03 runs both beside LARS, at its settings.
"""
import torch

OPTIMIZERS = ("sgd", "lars", "lamb", "novograd")
# The training scripts' defaults (--lr, --momentum, --weight-decay), which the bench and the
# trace use too: their timings do not depend on them, but they time the course's step.
LR, MOMENTUM, WEIGHT_DECAY = 0.05, 0.9, 5e-4


def trust_ratio(weights, update, coefficient, eps=0.0):
    """``coefficient x ||weights|| / ||update||``: scaled by it, the update moves the tensor
    by that share of its own norm; 1 where either norm is 0."""
    w_norm, u_norm = torch.linalg.vector_norm(weights), torch.linalg.vector_norm(update)
    return torch.where((w_norm > 0) & (u_norm > 0), coefficient * w_norm / (u_norm + eps),
                       torch.ones_like(w_norm))


class _PerTensor(torch.optim.Optimizer):
    """An optimizer whose step updates each tensor that has a gradient by itself
    (``update``), as LARS and LAMB do."""

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self.update(group, p)
        return loss


class LARS(_PerTensor):
    """SGD with momentum whose per-tensor step is scaled by a trust ratio.

    Biases and normalisation parameters (tensors with one dimension) are excluded from
    the trust ratio and from weight decay, as in the paper's implementations.
    """

    def __init__(self, params, lr, momentum=0.9, weight_decay=0.0, trust_coefficient=0.02,
                 eps=1e-9):
        defaults = dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                        trust_coefficient=trust_coefficient, eps=eps)
        super().__init__(params, defaults)

    def update(self, group, p):
        update = p.grad
        if p.ndim > 1:
            update = update.add(p, alpha=group["weight_decay"])
            update = update * trust_ratio(p, update, group["trust_coefficient"], group["eps"])
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = update.clone()
        else:
            state["momentum_buffer"].mul_(group["momentum"]).add_(update)
        p.add_(state["momentum_buffer"], alpha=-group["lr"])


class LAMB(_PerTensor):
    """Adam's step, scaled per tensor by a trust ratio (You et al. 2019, "Large Batch
    Optimization for Deep Learning"): the Adam direction ``r = m / (sqrt(v) + eps)`` (moments
    bias-corrected, ``beta1`` the course's ``--momentum``) plus weight decay, times
    ``trust_coefficient x ||w|| / ||r||``, so every tensor moves by the same share of its
    own norm. As in the course's LARS, tensors with one dimension take no weight decay; unlike
    it they keep the trust ratio, since an Adam step of the full rate would be as large as
    the rate itself whatever the gradient (a tensor still at zero takes the ratio 1)."""

    def __init__(self, params, lr, momentum=0.9, weight_decay=0.0, beta2=0.999,
                 trust_coefficient=0.02, eps=1e-6):
        defaults = dict(lr=lr, beta1=momentum, beta2=beta2, weight_decay=weight_decay,
                        trust_coefficient=trust_coefficient, eps=eps)
        super().__init__(params, defaults)

    def update(self, group, p):
        state = self.state[p]
        if not state:
            state["step"] = 0
            state["m"], state["v"] = torch.zeros_like(p), torch.zeros_like(p)
        state["step"] += 1
        state["m"].mul_(group["beta1"]).add_(p.grad, alpha=1 - group["beta1"])
        state["v"].mul_(group["beta2"]).addcmul_(p.grad, p.grad, value=1 - group["beta2"])
        m_hat = state["m"] / (1 - group["beta1"] ** state["step"])
        v_hat = state["v"] / (1 - group["beta2"] ** state["step"])
        update = m_hat / (v_hat.sqrt() + group["eps"])
        if p.ndim > 1:
            update.add_(p, alpha=group["weight_decay"])
        p.add_(update * trust_ratio(p, update, group["trust_coefficient"]), alpha=-group["lr"])


class NovoGrad(_PerTensor):
    """SGD with momentum on each tensor's gradient divided by its own running norm
    (Ginsburg et al. 2019, "Stochastic Gradient Methods with Layer-wise Adaptive Moments for
    Training of Deep Networks"): ``v = beta2 v + (1 - beta2) ||g||^2`` per tensor (``||g||^2``
    at the first step), then ``m = beta1 m + g / (sqrt(v) + eps) + wd w`` and ``w -= lr m``,
    ``beta1`` the course's ``--momentum``. Each tensor's step has about the same size
    whatever its gradient's scale, as LARS's and LAMB's do; the rate alone sets it (no trust
    ratio), so no tensor's step grows with its weights. Tensors with one dimension take no
    weight decay, as in the course's LARS and LAMB."""

    def __init__(self, params, lr, momentum=0.9, weight_decay=0.0, beta2=0.98, eps=1e-8):
        defaults = dict(lr=lr, beta1=momentum, beta2=beta2, weight_decay=weight_decay, eps=eps)
        super().__init__(params, defaults)

    def update(self, group, p):
        state = self.state[p]
        squared = torch.linalg.vector_norm(p.grad) ** 2
        if not state:
            state["v"], state["m"] = squared, torch.zeros_like(p)
        else:
            state["v"] = group["beta2"] * state["v"] + (1 - group["beta2"]) * squared
        update = p.grad / (state["v"].sqrt() + group["eps"])
        if p.ndim > 1:
            update = update.add(p, alpha=group["weight_decay"])
        state["m"].mul_(group["beta1"]).add_(update)
        p.add_(state["m"], alpha=-group["lr"])


def build(name, params, lr, momentum, weight_decay):
    """The optimizer ``name`` (see OPTIMIZERS) over ``params``."""
    if name == "lamb":
        return LAMB(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "lars":
        return LARS(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "novograd":
        return NovoGrad(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
