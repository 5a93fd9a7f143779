"""DDP in real gloo process groups: the numbers match one process, and metrics are global."""
import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import SequentialSampler
from torch.utils.data.distributed import DistributedSampler

from conftest import run_in_ranks
from workshop_lib import data, models, train, train_ddp

pytestmark = pytest.mark.slow  # starts processes: torchrun, spawned ranks, papermill

STEPS, BATCH_PER_RANK, LR = 6, 16, 0.1


def make_model():
    torch.manual_seed(0)
    info = data.DATASETS["digits"]
    return models.SmallCNN(info.in_channels, info.num_classes, width=8, batch_norm=False)


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, weight_decay=5e-4)


def ddp_steps(rank, world_size):
    """STEPS of DDP training on this rank's shard; returns the parameters and the shard."""
    train_set, _, _ = data.load("digits")
    sampler = DistributedSampler(train_set, world_size, rank, shuffle=True, seed=0)
    sampler.set_epoch(3)
    loader = data.TensorLoader(train_set, BATCH_PER_RANK, sampler, "cpu")
    model = DDP(make_model())
    optimizer = make_optimizer(model)
    for _, (x, y) in zip(range(STEPS), loader, strict=False):
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    return {"params": [p.detach().clone() for p in model.module.parameters()],
            "indices": list(sampler)[:STEPS * BATCH_PER_RANK]}


def test_two_ranks_match_one_process_with_the_global_batch(tmp_path):
    ranks = run_in_ranks(ddp_steps, 2, tmp_path)
    for a, b in zip(ranks[0]["params"], ranks[1]["params"], strict=True):
        assert torch.equal(a, b), "DDP ranks must hold identical parameters"

    # One process, batch 2b: at step t it sees rank 0's and rank 1's step-t samples.
    train_set, _, _ = data.load("digits")
    x_all, y_all = train_set.tensors
    model = make_model()
    initial = copy.deepcopy(model)
    optimizer = make_optimizer(model)
    for t in range(STEPS):
        step = slice(t * BATCH_PER_RANK, (t + 1) * BATCH_PER_RANK)
        idx = torch.tensor(ranks[0]["indices"][step] + ranks[1]["indices"][step])
        optimizer.zero_grad()
        F.cross_entropy(model(x_all[idx]), y_all[idx]).backward()
        optimizer.step()

    moved = max((p - q).abs().max().item()
                for p, q in zip(model.parameters(), initial.parameters(), strict=True))
    assert moved > 1e-3, "the comparison is only meaningful if training changed the weights"
    for single, distributed in zip(model.parameters(), ranks[0]["params"], strict=True):
        torch.testing.assert_close(distributed, single, rtol=1e-5, atol=1e-6)


def sharded_evaluate(rank, world_size):
    """The DDP script's own evaluation path: unpadded shard, then an all-reduce of sums."""
    _, val_set, info = data.load("digits")
    torch.manual_seed(0)
    model = models.build("cnn", info)
    loader = data.TensorLoader(val_set, 64, data.ShardSampler(val_set, rank, world_size), "cpu")
    sums = train_ddp.evaluate(model, loader)
    local = sums.clone()
    dist.all_reduce(sums)
    return {"global": sums, "local": local}


def test_validation_metrics_are_the_global_ones(tmp_path):
    ranks = run_in_ranks(sharded_evaluate, 2, tmp_path)
    _, val_set, info = data.load("digits")
    torch.manual_seed(0)
    model = models.build("cnn", info)
    loader = data.TensorLoader(val_set, 64, SequentialSampler(val_set), "cpu")
    single = train.evaluate(model, loader)

    assert single[2] == len(val_set) == 359  # odd: the two shards differ in size
    for rank in ranks:
        assert torch.equal(rank["global"][1:], single[1:]), "correct and sample counts are exact"
        torch.testing.assert_close(rank["global"][0], single[0], rtol=1e-5, atol=1e-4)
    assert ranks[0]["local"][2] + ranks[1]["local"][2] == 359
    assert ranks[0]["local"][1] != single[1], "one shard's accuracy is not the global accuracy"


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
