"""Where the training time goes: scaling, loop overhead, communication, data path.

    python -m workshop_lib.bench --out runs/bench.json
    python -m workshop_lib.bench --quick                # a smoke run (tests use it)
    python -m workshop_lib.bench --batch-size 128 --width 64   # scale another step

One command measures, side by side, and prints a table (``--out`` gets the same figures
as JSON):

1. Scaling: samples/s with 1, 2, ... N processes at a fixed per-process batch (weak
   scaling) and at a fixed global batch (strong scaling); efficiency = speed-up / N,
   beside the efficiency predicted from one process's step time and the all-reduce floor.
2. Loop overhead: ``train.train_epoch`` fed by ``data.TensorLoader`` against a bare loop
   over the same model and data already on the device, as a ratio.
3. Communication: the all-reduce time from 1 KB to 256 MB (and on to the largest
   gradients), and a model fitted to it, ``latency + 2(N-1)/N * bytes / bus bandwidth``:
   the floor no implementation of one all-reduce beats. DDP's step against the same step
   under ``no_sync`` (no gradient all-reduce): the exposed communication, split into
   synchronisation (what an all-reduce of one float per step costs), the model's latency
   and bandwidth terms at the gradients' size, and the rest; against DDP with its
   defaults (BatchNorm buffers re-sent before every forward); and trials of changes to
   the course's DDP step at its batch (DDP options, accumulation, pinning each rank to a
   core, gloo's device and threads), each against the course's step of the same rounds.
4. Data path: the device-resident ``TensorLoader`` against a ``DataLoader`` with workers.
5. Precision and checkpointing: one process's step in fp32, bf16 and fp16 (autocast, as
   ``--amp``) and with gradient checkpointing, its speed and the memory it keeps for
   backward (on GPUs also its peak allocation).

Every timed step is ``train.train_step`` and every DDP model is wrapped by
``train_ddp.wrap``: the bench times what learners run.

Everything happens in one launch: the bench spawns N worker processes (one per GPU with
NCCL; on a CPU ``hardware.CPU_PROCESSES`` processes of one thread each with gloo), joins
them in one process group and takes sections 1 and 3 there; smaller worlds use subgroups
of it while the other ranks wait. Then the group is left, the other ranks exit, and rank 0
takes sections 2, 4 and 5 alone. Runs that are compared are interleaved round by round, so a
change in the machine's load hits both sides alike; each figure is the median over the
rounds with its min..max and n, and ratios are taken within a round. Warm-up is excluded
and GPU work is synchronized before every clock read.
BENCHMARKS.md records what this command measured, and on which machine.

Modules: ``plan`` (what to measure), ``workers`` (the processes), ``measure`` (sections 1
and 3, all ranks), ``solo`` (sections 2, 4 and 5, rank 0 alone), ``analyse`` (figures from
timings), ``report`` (the table), ``__main__`` (the command).
"""
