"""DDP in real gloo process groups: the numbers match one process, and metrics are global."""
import copy

import pytest
import torch
from torch.utils.data.distributed import DistributedSampler

from conftest import run_in_ranks
from workshop_lib import data, metrics, models, train, train_ddp
from workshop_lib.precision import PLAIN

pytestmark = pytest.mark.slow  # starts processes: torchrun, spawned ranks, papermill

STEPS, BATCH_PER_RANK, LR = 6, 16, 0.1


def make_model():
    torch.manual_seed(0)
    info = data.DATASETS["digits"]
    return models.SmallCNN(info.in_channels, info.num_classes, width=8, batch_norm=False)


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, weight_decay=5e-4)


def constant_schedule(optimizer):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


def rank_shard(rank, world_size):
    """This rank's first STEPS batches of DistributedSampler's epoch 3."""
    train_set, _, _ = data.load("digits")
    sampler = DistributedSampler(train_set, world_size, rank, shuffle=True, seed=0)
    sampler.set_epoch(3)
    return list(sampler)[:STEPS * BATCH_PER_RANK]


def ddp_epoch(rank, world_size):
    """The DDP script's own wrap and training epoch over STEPS batches of this rank's
    shard; returns the parameters."""
    train_set, _, _ = data.load("digits")
    model = train_ddp.wrap(make_model(), torch.device("cpu"))
    optimizer = make_optimizer(model)
    loader = data.TensorLoader(train_set, BATCH_PER_RANK, rank_shard(rank, world_size), "cpu")
    train_ddp.train_epoch(model, loader, optimizer, constant_schedule(optimizer), PLAIN,
                          accumulate=1, progress=False)
    return [p.detach().clone() for p in model.module.parameters()]


def test_two_ranks_match_one_process_with_the_global_batch(tmp_path):
    ranks = run_in_ranks(ddp_epoch, 2, tmp_path)
    for a, b in zip(ranks[0], ranks[1], strict=True):
        assert torch.equal(a, b), "DDP ranks must hold identical parameters"

    # The single-device script's epoch, batch 2b: at step t it sees rank 0's and rank 1's
    # step-t samples together.
    train_set, _, _ = data.load("digits")
    shards = [rank_shard(rank, 2) for rank in range(2)]
    order = [i for t in range(STEPS) for shard in shards
             for i in shard[t * BATCH_PER_RANK:(t + 1) * BATCH_PER_RANK]]
    model = make_model()
    initial = copy.deepcopy(model)
    optimizer = make_optimizer(model)
    loader = data.TensorLoader(train_set, 2 * BATCH_PER_RANK, order, "cpu")
    train.train_epoch(model, loader, optimizer, constant_schedule(optimizer), PLAIN,
                      accumulate=1, progress=False)

    moved = max((p - q).abs().max().item()
                for p, q in zip(model.parameters(), initial.parameters(), strict=True))
    assert moved > 1e-3, "the comparison is only meaningful if training changed the weights"
    for single, distributed in zip(model.parameters(), ranks[0], strict=True):
        torch.testing.assert_close(distributed, single, rtol=1e-5, atol=1e-6)


def test_shard_accuracies_add_up_to_the_global_one_and_differ_from_it():
    _, val_set, info = data.load("digits")
    torch.manual_seed(0)
    model = models.build("cnn", info)
    per_rank, global_accuracy = metrics.shard_accuracies(model, val_set, 2, train_ddp.evaluate)
    assert sum(r["samples"] for r in per_rank) == len(val_set), "unpadded shards, each once"
    assert global_accuracy == pytest.approx(sum(r["correct"] for r in per_rank) / len(val_set))
    whole = train.evaluate(model, data.TensorLoader(val_set, 512, range(len(val_set)), "cpu"))
    assert global_accuracy == pytest.approx(whole[1].item() / whole[2].item())
    assert any(r["accuracy"] != global_accuracy for r in per_rank), \
        "one shard's accuracy is not the global accuracy"


def naive_vs_ddp(rank, world_size):
    from workshop_lib import naive_ddp

    return naive_ddp.compare_with_ddp(rank, world_size, steps=15)


def test_from_scratch_wrapper_matches_distributed_data_parallel(tmp_path):
    differences = run_in_ranks(naive_vs_ddp, 2, tmp_path)
    assert max(differences) < 1e-5


def naive_without_gradient_sync(rank, world_size):
    from workshop_lib import naive_ddp

    naive_ddp.NaiveDataParallel.sync_gradients = lambda self: None
    return naive_ddp.compare_with_ddp(rank, world_size, steps=15)


def test_the_comparison_would_catch_a_wrapper_that_skips_the_all_reduce(tmp_path):
    differences = run_in_ranks(naive_without_gradient_sync, 2, tmp_path)
    assert min(differences) > 1e-3
