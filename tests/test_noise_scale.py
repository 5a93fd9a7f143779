"""The gradient noise scale's two-batch estimate against the truth, computed from every
per-sample gradient of a model small enough to take them all (softmax regression: the
gradient of one sample's cross-entropy is (softmax - onehot) x^T, and its bias part)."""
import torch

from workshop_lib import noise_scale


def per_sample_gradients(model, x, y):
    p = torch.softmax(model(x), dim=1)
    err = p - torch.nn.functional.one_hot(y, p.shape[1]).float()
    return torch.cat([(err[:, :, None] * x[:, None, :]).flatten(1), err], dim=1)


def test_the_estimate_finds_the_true_noise_scale():
    torch.manual_seed(0)
    n, features, classes = 4000, 10, 3
    x = torch.randn(n, features)
    y = (x[:, 0] + 0.5 * torch.randn(n) > 0).long() + (x[:, 1] > 1).long()
    model = torch.nn.Linear(features, classes)
    with torch.no_grad():
        g = per_sample_gradients(model, x, y)
    mean = g.mean(0)
    truth = float(((g - mean) ** 2).sum(1).mean() / mean.pow(2).sum())
    dataset = torch.utils.data.TensorDataset(x, y)
    est = noise_scale.estimate(model, dataset, small=4, big=64, batches=400)
    # Sampling without replacement from n shrinks a batch's variance by (n - b)/(n - 1):
    # under 2% here; 400 batches of each size leave a few percent of sampling error.
    assert abs(est["b_noise"] / truth - 1) < 0.15, (est["b_noise"], truth)
    assert est["g2_small"] > est["g2_big"] > 0


def test_samples_that_all_agree_have_no_noise_to_scale():
    """Every sample alike: every batch has the same gradient, so B_noise is ~0 (any batch is
    signal-dominated), up to float rounding."""
    x = torch.ones(64, 2)
    y = torch.zeros(64, dtype=torch.long)
    model = torch.nn.Linear(2, 2)
    est = noise_scale.estimate(model, torch.utils.data.TensorDataset(x, y), 4, 16, batches=4)
    assert est["g2_small"] == est["g2_big"] or abs(est["g2_small"] / est["g2_big"] - 1) < 1e-5
    assert est["b_noise"] is None or est["b_noise"] < 1e-3
