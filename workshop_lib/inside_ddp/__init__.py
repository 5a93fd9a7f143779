"""Inside DDP: the reference implementations of notebook 07, each checked against PyTorch.

Notebook 02 builds data parallelism from two collectives (``naive_ddp``): broadcast the
weights once, all-reduce every gradient after backward. This package goes the rest of
the way to what DistributedDataParallel and ZeroRedundancyOptimizer do, one idea per
module, in the order notebook 07 ("Inside DDP") teaches them:

- ``overlap``: each gradient's all-reduce starts from a hook during backward
  (``OverlappedDataParallel``), in one fixed order on every rank, and handles parameters
  that are frozen, unused in a step, or tied; section 1.
- ``buckets``: gradients packed into flat buckets of a given size, one all-reduce per
  bucket (``BucketedDataParallel``); section 2.
- ``zero1``: optimizer state sharded over the ranks (``ShardedOptimizer``) and what it
  saves (``state_bytes_per_rank``, ``compare_state_memory``); section 3.
- ``edge_cases``: a network with a frozen layer, tied weights and a branch some ranks skip
  (``EdgeCaseNet``); section 4.
- ``replay``: the yardstick, N ranks after k steps against one process on the global batch.
- ``verify``: the torchrun job behind the exercises' checks (``labs.inside_ddp``).
- ``timing``: step times of naive, overlapped, bucketed and PyTorch's DDP, and the bucket
  size sweep (``measure``; the bench can call it); section 5.
- ``allreduce``: one all-reduce's time against its size, fitted as a latency plus a
  bandwidth term, and what a list of buckets costs by that fit; section 5.
- ``comm_hooks``: DDP's communication hooks (fp16, bf16, PowerSGD), their bytes a step and
  where they leave the training; section 6.
- ``compiled``: ``torch.compile`` of a DDP model, its compile time and step time; section 6.
- ``fsdp``: what a rank holds under DDP, ZeRO-1, ZeRO-2 and FSDP, from a parameter count,
  and FSDP2 (``fully_shard``) against DDP, measured; section 6.
- ``experiments``: the notebook's one torchrun job, every measurement above in turn;
  ``plots``: its figures (``findings.inside_ddp`` judges its numbers).

``tests/test_inside_ddp.py`` checks every stage against one process and against PyTorch
(DDP, ZeroRedundancyOptimizer), and that the comparison catches a broken variant.
"""
