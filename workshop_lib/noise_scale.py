"""The gradient noise scale: about where a larger batch stops buying progress per step
(notebook 03, "How large can the batch go?").

McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training"): a mini-batch gradient
G_B over B samples has E|G_B|^2 = |G|^2 + tr(S)/B, with G the true gradient and S the
covariance of the per-sample gradients. The simple noise scale B_noise = tr(S)/|G|^2 is the
batch at which a step's noise is as large as its signal. Well below it a step is
noise-dominated, and k times the batch buys about k times the progress per step (the linear
rule's regime); well above it a step is signal-dominated, and a larger batch buys little
per step for its extra samples. Their measured critical batch sizes, past which the
trade-off turns, track B_noise, and B_noise grows as training lowers the loss.

Estimated from two batch sizes (their Appendix A), |G_b|^2 averaged over batches of each:
    |G|^2 ~ (big |G_big|^2 - small |G_small|^2) / (big - small)
    tr(S) ~ (|G_small|^2 - |G_big|^2) / (1/small - 1/big)
With BatchNorm a batch's gradient is not exactly a mean of independent per-sample ones (each
sample is normalised with its batch's statistics): read the figure as an order of
magnitude, as the paper does.
"""
import copy

import torch
import torch.nn.functional as F

from workshop_lib import checkpoint, data, models

# Batches of each size averaged: about 5 s per estimate on the CPU profile; three seeds'
# estimates at initialization (digits, the course CNN, 32 and 512) fell within 10% of their
# mean with 24 batches (55, 62, 67), and the notebook reports one.
BATCHES = 16


def squared_gradient_norm(model, x, y):
    """|g|^2 of the mean cross-entropy's gradient on one batch (one host sync)."""
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    return float(torch.stack([p.grad.pow(2).sum() for p in model.parameters()
                              if p.grad is not None]).sum())


def mean_squared_gradient_norm(model, dataset, batch, batches, generator, device):
    """|G_batch|^2 averaged over ``batches`` batches of distinct samples drawn at random."""
    total = 0.0
    for _ in range(batches):
        index = torch.randperm(len(dataset), generator=generator)[:batch]
        x, y = dataset[index]
        total += squared_gradient_norm(model, x.to(device), y.to(device))
    return total / batches


def estimate(model, dataset, small, big, batches=BATCHES, seed=0):
    """B_noise of ``model`` on ``dataset`` (a ``TensorDataset``) from batches of ``small``
    and ``big`` samples. ``b_noise`` is None where the estimate does not resolve a
    positive signal and noise (noise-dominated past both batches, or too few batches)."""
    device = next(model.parameters()).device
    probe = copy.deepcopy(model).train()  # BatchNorm's running statistics stay the caller's
    generator = torch.Generator().manual_seed(seed)
    g2_small, g2_big = (mean_squared_gradient_norm(probe, dataset, b, batches, generator,
                                                   device) for b in (small, big))
    signal = (big * g2_big - small * g2_small) / (big - small)
    noise = (g2_small - g2_big) / (1 / small - 1 / big)
    return {"small": small, "big": big, "batches": batches, "g2_small": g2_small,
            "g2_big": g2_big, "signal": signal, "noise": noise,
            "b_noise": noise / signal if signal > 0 and noise > 0 else None}


def at_start_and_trained(model_name, dataset_name, small, big, trained_checkpoint,
                         device="cpu", seed=0):
    """``estimate`` for a freshly built ``model_name`` (seed ``seed``) and for the model a
    run saved in ``trained_checkpoint``, on ``dataset_name``'s training set, on ``device``."""
    train_set, _, info = data.load(dataset_name)
    torch.manual_seed(seed)
    model = models.build(model_name, info).to(device)
    start = estimate(model, train_set, small, big, seed=seed)
    model.load_state_dict(checkpoint.load(trained_checkpoint, map_location=device)["model"])
    return {"start": start, "trained": estimate(model, train_set, small, big, seed=seed)}
