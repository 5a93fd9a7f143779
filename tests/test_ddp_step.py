"""Notebook 02's picture of a DDP step draws the buckets real DDP forms: the sizes
``ddp_step.buckets`` computes are the ones a 2-rank gloo DDP reports after rebuilding its
buckets in its first steps, and the drawing has one all-reduce per bucket, before the step."""
import matplotlib
import pytest
import torch

from conftest import run_in_ranks
from workshop_lib import data, ddp_step, models, plots

matplotlib.use("Agg")
# DDP's logging data is refreshed at iteration 10 (and 1, 20, 50, ...): run past it.
STEPS = 11


def real_bucket_bytes(rank, world_size, model_name):
    _, _, info = data.load("digits")
    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(models.build(model_name, info))
    for _ in range(STEPS):
        ddp(torch.randn(2, info.in_channels, 8, 8)).sum().backward()
    logged = ddp._get_ddp_logging_data()
    return [int(b) for b in logged["rebuilt_bucket_sizes"].split(",")]


@pytest.mark.slow
def test_the_buckets_are_the_ones_ddp_rebuilds(tmp_path):
    _, _, info = data.load("digits")
    expected = [b.bytes for b in ddp_step.buckets(models.build("wrn-16-4", info))]
    assert len(expected) == 2  # two buckets: the picture has something to overlap
    assert run_in_ranks(real_bucket_bytes, 2, tmp_path, "wrn-16-4") == [expected, expected]


def test_every_trainable_parameter_is_in_one_bucket_last_layer_first():
    _, _, info = data.load("digits")
    model = models.build("cnn", info)
    found = ddp_step.buckets(model)
    names = [n for b in found for n in b.names]
    assert sorted(names) == sorted(n for n, p in model.named_parameters())
    assert names[0].startswith("classifier") and sum(b.numel for b in found) == \
        models.count_parameters(model)
    tiny = ddp_step.buckets(model, bucket_cap_mb=1e-6)  # a byte: every parameter alone
    assert len(tiny) == len(names)


def test_the_picture_has_one_all_reduce_per_bucket_and_says_whether_they_overlap():
    _, _, info = data.load("digits")
    for name, world_size in (("cnn", 2), ("wrn-16-4", 8)):
        found = ddp_step.buckets(models.build(name, info))
        ax = plots.draw_ddp_step(found, world_size, name)
        texts = [t.get_text() for t in ax.texts]
        assert sum(t.startswith("all-reduce") for t in texts) == len(found)
        assert ("nothing to overlap" in ax.get_title()) == (len(found) == 1)
        assert f"rank {world_size - 1}" in texts
