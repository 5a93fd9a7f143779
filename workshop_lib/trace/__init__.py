"""Where a DDP step's time goes: a profiler timeline of the course's own step (notebook 05).

    torchrun --standalone --nproc-per-node=2 -m workshop_lib.trace --out runs/trace
    torchrun --standalone --nproc-per-node=gpu -m workshop_lib.trace --out runs/trace --amp bf16

Every rank trains a few warm-up steps of the course's step (``train_ddp.wrap`` around the
course's model, ``train.train_step``), then profiles the next ``--steps`` with
``torch.profiler`` and writes:

- ``trace_rank{r}.json``: the rank's timeline, to open in https://ui.perfetto.dev (or
  chrome://tracing): the training thread's operators, and on a CPU gloo's worker
  threads (``pt_gloo_runloop``) running each all-reduce; on GPUs the kernels, NCCL's
  ``ncclDevKernel_AllReduce_...`` on a stream of their own;
- ``summary.json``: per rank and per step, the step's measured time and its compute,
  communication, overlapped and exposed milliseconds (``timeline`` says how each is read
  off the events), with the intervals that ``plots.plot_step_timeline`` draws.

Modules: ``capture`` (one rank's training and profiling), ``timeline`` (the events'
arithmetic), ``__main__`` (the command).
"""
