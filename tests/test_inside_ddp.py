"""Inside DDP (notebook 07): overlap, buckets and ZeRO-1 on 2 gloo ranks, each against one
process on the global batch and against PyTorch's own (DDP, ZeroRedundancyOptimizer).

Two spawns of 2 ranks (about 10 s each to start): one trains every stage and its PyTorch
counterpart on both models of ``replay``; the other trains deliberately broken variants,
and measures optimizer-state memory and the timing function's output.
"""
import ast
import functools
import inspect
from pathlib import Path

import pytest
import torch
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

from conftest import run_in_ranks
from workshop_lib import data, models
from workshop_lib.inside_ddp import buckets, overlap, replay, timing, zero1
from workshop_lib.inside_ddp.edge_cases import EdgeCaseNet

FILES = Path(__file__).resolve().parent.parent / "workshop_lib" / "labs" / "files"
SMALL_BUCKET = 4096  # several buckets even for replay's small CNN
TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}  # float32 rounding of the same sums in other orders


def sgd(params):
    optimizer_class, settings = replay.OPTIMIZERS["sgd"]
    return optimizer_class(params, **settings)


def torch_ddp(model, kind):
    return DDP(model, find_unused_parameters=kind == "edge")  # edge: a branch some skip


def every_stage(rank, world_size):
    """``(model, variant) -> parameters after replay.STEPS steps`` on this rank."""
    out = {}
    for kind in replay.MODELS:
        def train(wrap, make_optimizer=sgd, kind=kind):
            return replay.train(rank, world_size, kind, wrap, make_optimizer)

        ddp = functools.partial(torch_ddp, kind=kind)
        out[kind, "overlap"] = train(overlap.OverlappedDataParallel)
        out[kind, "buckets"] = train(lambda m: buckets.BucketedDataParallel(m, SMALL_BUCKET))
        out[kind, "one_bucket"] = train(buckets.BucketedDataParallel)
        out[kind, "ddp"] = train(ddp)
        for name, (optimizer_class, settings) in replay.OPTIMIZERS.items():
            out[kind, f"zero1_{name}"] = train(
                overlap.OverlappedDataParallel,
                functools.partial(zero1.ShardedOptimizer, optimizer_class=optimizer_class,
                                  **settings))
            out[kind, f"torch_zero_{name}"] = train(
                ddp, functools.partial(ZeroRedundancyOptimizer, optimizer_class=optimizer_class,
                                       **settings))
    return out


@pytest.fixture(scope="module")
def stages(tmp_path_factory):
    return run_in_ranks(every_stage, 2, tmp_path_factory.mktemp("stages"))


CASES = [(kind, variant) for kind in replay.MODELS
         for variant in ("overlap", "buckets", "one_bucket", "zero1_sgd", "zero1_adam")]


def optimizer_of(variant):
    return "adam" if variant.endswith("adam") else "sgd"


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "variant"), CASES)
def test_every_stage_matches_one_process_on_the_global_batch(stages, kind, variant):
    single = replay.replay(kind, optimizer_of(variant), world_size=2)
    start = list(replay.build(kind, replay.START_SEED).parameters())
    assert replay.max_difference(single, start) > 1e-3, "training must move the weights"
    for rank in stages:
        for ours, reference in zip(rank[kind, variant], single, strict=True):
            torch.testing.assert_close(ours, reference, **TOLERANCE)


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "variant"), CASES)
def test_every_stage_matches_its_pytorch_counterpart(stages, kind, variant):
    theirs = {"overlap": "ddp", "buckets": "ddp", "one_bucket": "ddp",
              "zero1_sgd": "torch_zero_sgd", "zero1_adam": "torch_zero_adam"}[variant]
    for rank in stages:
        for ours, reference in zip(rank[kind, variant], rank[kind, theirs], strict=True):
            torch.testing.assert_close(ours, reference, **TOLERANCE)


@pytest.mark.slow
def test_edge_cases_frozen_stays_put_and_the_rarely_used_branch_trains(stages):
    start = replay.build("edge", replay.START_SEED)
    for variant in ("overlap", "buckets", "zero1_adam"):
        after = dict(zip((name for name, _ in start.named_parameters()),
                         stages[1]["edge", variant], strict=True))
        assert torch.equal(after["frozen.weight"], start.frozen.weight), variant
        assert not torch.equal(after["branch.weight"], start.branch.weight), variant
        assert "decode.weight" not in after, "a tied weight is one parameter"


# -- The comparisons catch what is broken ---------------------------------------------------


class DroppedBucket(buckets.BucketedDataParallel):
    """A bug: the first bucket is never all-reduced (each rank keeps its own gradient)."""

    def all_reduce(self, g):
        if g == 0:
            torch.cat([self.params[i].grad.flatten() for i in self.groups[g]], out=self.flat[g])
            return _Done()
        return super().all_reduce(g)


class _Done:
    def wait(self):
        return True


class ZerosForUnused(overlap.OverlappedDataParallel):
    """Another policy: a parameter no rank used gets a zero gradient, not ``None``."""

    def _send_zeros_for_missing(self):
        super()._send_zeros_for_missing()
        return []  # so sync_gradients never restores None


class NoBroadcast(zero1.ShardedOptimizer):
    """A bug: each rank steps its share and never sends it."""

    @torch.no_grad()
    def step(self):
        self.local.step()


def broken_and_measured(rank, world_size):
    out = {}
    for kind in replay.MODELS:
        out[kind, "dropped_bucket"] = replay.train(
            rank, world_size, kind, lambda m: DroppedBucket(m, SMALL_BUCKET), sgd)
        out[kind, "no_broadcast"] = replay.train(
            rank, world_size, kind, overlap.OverlappedDataParallel,
            functools.partial(NoBroadcast, optimizer_class=torch.optim.SGD,
                              **replay.OPTIMIZERS["sgd"][1]))
    out["edge", "zeros_for_unused"] = replay.train(rank, world_size, "edge", ZerosForUnused, sgd)
    out["edge", "ddp"] = replay.train(rank, world_size, "edge",
                                      functools.partial(torch_ddp, kind="edge"), sgd)
    out["memory"] = state_memory()
    out["timing"] = timing.measure(rank, world_size, rounds=1, steps=2,
                                   sweep_bytes=(SMALL_BUCKET,))
    return out


def state_memory():
    """Optimizer-state bytes per rank on the course's CNN: ours and PyTorch's ZeRO-1."""
    result = {}
    for name, optimizer_class in (("sgd", torch.optim.SGD), ("adam", torch.optim.Adam)):
        settings = {"lr": 0.01, **({"momentum": 0.9} if name == "sgd" else {})}
        torch.manual_seed(0)
        model = models.build("cnn", data.DATASETS["digits"])
        result[name] = zero1.compare_state_memory(model, optimizer_class, **settings)
        theirs = ZeroRedundancyOptimizer(model.parameters(), optimizer_class, **settings)
        for param in model.parameters():
            param.grad = torch.zeros_like(param)
        theirs.step()
        result[name]["torch_zero"] = zero1.state_bytes_per_rank(theirs)
    return result


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    return run_in_ranks(broken_and_measured, 2, tmp_path_factory.mktemp("broken"))


@pytest.mark.slow
@pytest.mark.parametrize("kind", replay.MODELS)
def test_the_comparisons_catch_a_bucket_that_is_never_all_reduced(broken, stages, kind):
    single = replay.replay(kind, "sgd", world_size=2)
    for rank in (0, 1):
        params = broken[rank][kind, "dropped_bucket"]
        assert replay.max_difference(params, single) > 1e-4
        assert replay.max_difference(params, stages[rank][kind, "ddp"]) > 1e-4
    assert replay.max_difference(broken[0][kind, "dropped_bucket"],
                                 broken[1][kind, "dropped_bucket"]) > 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("kind", replay.MODELS)
def test_the_comparisons_catch_zero1_without_the_broadcast(broken, stages, kind):
    single = replay.replay(kind, "sgd", world_size=2)
    for rank in (0, 1):
        assert replay.max_difference(broken[rank][kind, "no_broadcast"], single) > 1e-4
        assert replay.max_difference(broken[rank][kind, "no_broadcast"],
                                     stages[rank][kind, "torch_zero_sgd"]) > 1e-4


@pytest.mark.slow
def test_zero_gradients_for_unused_parameters_is_not_what_ddp_does(broken):
    """Momentum and weight decay keep moving a parameter whose gradient is zero; DDP (and
    ``overlap``) leave ``.grad`` None where no rank used it, so the optimizer skips it."""
    names = [name for name, _ in replay.build("edge", 0).named_parameters()]
    zeros = dict(zip(names, broken[0]["edge", "zeros_for_unused"], strict=True))
    ddp = dict(zip(names, broken[0]["edge", "ddp"], strict=True))
    assert (zeros["branch.weight"] - ddp["branch.weight"]).abs().max() > 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_zero1_holds_each_parameters_state_on_one_rank_only(broken, optimizer):
    memory = broken[0]["memory"][optimizer]
    per_parameter = 1 if optimizer == "sgd" else 2  # momentum; exp_avg and exp_avg_sq
    assert memory["replicated"] >= per_parameter * memory["parameter_bytes"]
    assert sum(memory["sharded"]) == memory["replicated"]
    assert max(memory["sharded"]) < memory["replicated"]
    assert memory["sharded"] == memory["torch_zero"], "the same split as PyTorch's ZeRO-1"
    print(f"\n{optimizer}: optimizer state per rank, replicated {memory['replicated']} B, "
          f"ZeRO-1 {memory['sharded']} B (parameters {memory['parameter_bytes']} B)")


@pytest.mark.slow
def test_the_timing_function_reports_every_variant(broken):
    result = broken[0]["timing"]
    expected = {"local", "naive", "overlap", "buckets", "ddp", f"buckets_{SMALL_BUCKET}"}
    assert set(result["step_ms"]) == expected
    assert all(v["median"] > 0 and v["n"] == 1 for v in result["step_ms"].values())
    assert result == broken[1]["timing"], "every rank returns the same figures"


# -- Without processes -----------------------------------------------------------------------


def test_buckets_fill_in_reverse_order_up_to_their_size():
    params = [torch.zeros(n) for n in (100, 300, 10, 2000, 50)][::-1]  # launch order
    assert buckets.plan_buckets(params, 1600) == [[0], [1], [2, 3], [4]]
    assert buckets.plan_buckets(params, 10**9) == [[0, 1, 2, 3, 4]]
    mixed = [torch.zeros(10), torch.zeros(10, dtype=torch.float64), torch.zeros(10)]
    assert buckets.plan_buckets(mixed, 10**9) == [[0], [1], [2]]


def test_partition_balances_elements_largest_first():
    params = [torch.zeros(n) for n in (5, 100, 60, 50, 1)]
    owners = zero1.partition(params, 2)
    # 100 -> rank 0; 60 -> 1; 50 -> 1 (60 < 100); 5 -> 0 (100 < 110); 1 -> 0 (105 < 110)
    assert owners == [0, 0, 1, 1, 0]
    assert zero1.partition(params, 3) == [2, 0, 1, 2, 2]  # 100 | 60 | 50 + 5 + 1


def test_edge_case_net_ties_one_parameter_and_freezes_one_layer():
    model = EdgeCaseNet()
    assert model.decode.weight is model.encode.weight
    names = [name for name, _ in model.named_parameters()]
    assert "decode.weight" not in names
    assert not model.frozen.weight.requires_grad


def provided_code(path):
    """Source of each function and method that does not raise NotImplementedError."""
    tree = ast.parse(Path(path).read_text())
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    found[f"{node.name}.{item.name}"] = item
        elif isinstance(node, ast.FunctionDef) and node.col_offset == 0:
            found[node.name] = node
    return {name: ast.unparse(node) for name, node in found.items()
            if "NotImplementedError" not in ast.unparse(node)}


@pytest.mark.parametrize("key", ["overlap", "buckets", "zero1"])
def test_exercise_stubs_keep_the_reference_code_they_provide(key):
    """A stub copies the code the learner does not write; it must not drift from the
    library's (the check's reference)."""
    stub = provided_code(FILES / f"{key}_stub.py")
    reference = provided_code(inspect.getsourcefile(
        {"overlap": overlap, "buckets": buckets, "zero1": zero1}[key]))
    assert stub, "the stub provides some code"
    for name, source in stub.items():
        assert ast.unparse(ast.parse(source)) == reference.get(name), name

