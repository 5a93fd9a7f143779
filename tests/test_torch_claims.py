"""What the notebooks say torch does, pinned to the installed torch: each test runs (or
reads) the torch code a sentence describes, and checks the notebook says what it does."""
import inspect
import json
import types

import torch
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.rendezvous import dynamic_rendezvous

from conftest import REPO


def markdown(name):
    cells = json.loads((REPO / "notebooks" / name).read_text())["cells"]
    return " ".join(" ".join("".join(c["source"]).split()) for c in cells
                    if c["cell_type"] == "markdown")


def node_ranks(arrivals):
    """The node ranks c10d's dynamic rendezvous gives nodes that joined in ``arrivals``'
    order, from its own code that completes a round."""
    state = types.SimpleNamespace(participants={}, complete=False, deadline=None, round=0)
    for node in arrivals:
        state.participants[node] = 0  # what joining records
    executor = types.SimpleNamespace(_state=state, _node=arrivals[0], _record=lambda **_: None,
                                     _settings=types.SimpleNamespace(run_id="job"))
    dynamic_rendezvous._DistributedRendezvousOpExecutor._mark_rendezvous_complete(executor)
    return {(node.addr, node.pid): rank for node, rank in state.participants.items()}


def test_node_ranks_follow_host_name_then_pid_not_arrival():
    node = dynamic_rendezvous._NodeDesc
    across_hosts = node_ranks([node("node-b", 10, 0), node("node-a", 20, 0)])
    assert across_hosts == {("node-b", 10): 1, ("node-a", 20): 0}
    one_machine = node_ranks([node("host", 200, 0), node("host", 100, 0)])
    assert one_machine == {("host", 200): 1, ("host", 100): 0}
    said = markdown("06_beyond_one_machine.ipynb")
    assert "order the agents arrive: no node" not in said
    assert "sorts its participants" in said and "ordered by process id" in said


def test_torchrun_gives_every_worker_master_addr_and_port():
    source = inspect.getsource(LocalElasticAgent._start_workers)
    assert '"MASTER_ADDR": worker_group.master_addr' in source
    assert '"MASTER_PORT": str(worker_group.master_port)' in source
    said = markdown("06_beyond_one_machine.ipynb")
    assert "older launchers" not in said
    assert "torchrun sets all of them in every worker" in said


def test_accumulation_equals_a_larger_batch_only_without_batchnorm():
    """Both course models have BatchNorm; 05 must not say accumulation is the larger batch
    without saying the comparison ran without it."""
    from workshop_lib import equivalence, models

    assert equivalence.ACCUMULATION_MODEL == "bn_free"
    said = markdown("05_worked_example.ipynb")
    assert "k micro-batches are one k-times larger batch" not in said
    assert "*without* BatchNorm" in said
    info = types.SimpleNamespace(in_channels=1, num_classes=10)
    for name in models.MODELS:
        assert any(isinstance(m, torch.nn.BatchNorm2d)
                   for m in models.build(name, info).modules()), name


def test_bucketed_wrapper_inherits_the_librarys_overlap_class():
    from workshop_lib.inside_ddp import buckets, overlap

    assert buckets.BucketedDataParallel.__bases__ == (overlap.OverlappedDataParallel,)
    stub = (REPO / "workshop_lib/labs/files/buckets_stub.py").read_text()
    assert "from workshop_lib.inside_ddp.overlap import OverlappedDataParallel" in stub
    said = markdown("07_inside_ddp.ipynb")
    assert "from your section 1 class" not in said
    assert "the library's section 1 class" in said


def test_a_forward_through_ddp_broadcasts_buffers_after_a_step_with_gradients():
    """Notebook 04's second hang: a forward through the DDP wrapper syncs the module's
    buffers when the wrapper's previous forward ran with gradients (so the first evaluation
    batch after training does, the next ones do not), under ``forward_sync_buffers``, the
    name that replaced ``broadcast_buffers`` in 2.13. Counted on a one-rank group."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    documented = " ".join(DistributedDataParallel.__doc__.split())
    assert "broadcast_buffers (bool or None): Flag that enables syncing (broadcasting) buffers " \
           "of the module at beginning of the ``forward`` function. (default: ``None``) .. " \
           "deprecated:: 2.13 Use ``forward_sync_buffers`` instead." in documented
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(4, 4),
                                                            torch.nn.BatchNorm1d(4)))
        synced, now, sync = [], [], model._sync_buffers
        model._sync_buffers = lambda: (synced.append(now[-1]), sync())
        x = torch.randn(8, 4)
        for phase, grad in [("train 1", True), ("eval 1", False), ("eval 2", False),
                            ("train 2", True), ("train 3", True)]:
            now.append(phase)
            with torch.set_grad_enabled(grad):
                out = model(x)
            if grad:
                out.sum().backward()
        assert synced == ["train 1", "eval 1", "train 3"]
        assert model.forward_sync_buffers
        assert "authoritative_rank = 0" in inspect.getsource(
            DistributedDataParallel._sync_buffers), "broadcast from rank 0"
    finally:
        dist.destroy_process_group()
    said = markdown("04_when_things_go_wrong.ipynb")
    assert "deprecated since PyTorch 2.13" in said
    assert "on after one with gradients (a training step outside `no_sync()`), off after one " \
           "under `torch.no_grad()`" in said
    assert "_sync_module_buffers`, `_default_broadcast_coalesced` and, at the top, " \
           "`_distributed_broadcast_coalesced`" in said, "the frames, in the dump's order"
    assert "evaluating through the DDP wrapper on rank 0 only" not in said, \
        "section 2 does not give the second job's answer away"
