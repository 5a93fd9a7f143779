"""``torch.compile`` with DDP: what compiling costs, and what a compiled step saves.

Notebook 07, "Inside DDP", section 6 ("What comes next") shows these numbers (when its
``compile_ddp`` parameter is True: compiling takes minutes on a small CPU). Compile the
DDP-wrapped model, ``torch.compile(DistributedDataParallel(model))``: TorchDynamo then
splits the captured graph at DDP's bucket boundaries (its "DDPOptimizer",
``torch._dynamo.config.optimize_ddp``), so that each bucket's all-reduce can still start
while the rest of backward runs, and Inductor compiles each piece into fused kernels
(C++/OpenMP on a CPU, Triton on a GPU). The first step pays for the compilation; the
later ones run the compiled code.

``compare`` trains one model (the course CNN by default; notebook 07 asks for its profile's
model and batch) from one start on the same batches with DDP as it is and
with DDP compiled (a collective) and records the first compiled step's seconds, both step
times (``timing.timed_window``: the slowest rank's, medians over windows), and the largest
parameter difference after the first step (the same arithmetic, up to float rounding:
Inductor may sum in another order) and at the end (where training has amplified it). On a
GPU both run in full float32 with cuDNN's deterministic algorithms
(``equivalence.full_float32``): TF32's rounding and cuDNN's choice of algorithm would
otherwise decide "the same", not compiling.
"""
import copy
import statistics

import torch

from workshop_lib import data, models, train_ddp
from workshop_lib.equivalence import full_float32
from workshop_lib.inside_ddp import replay
from workshop_lib.inside_ddp.timing import timed_window, train_step
from workshop_lib.stopwatch import Stopwatch

WINDOWS, STEPS, BATCH_SIZE, LR = 3, 10, 32, 0.01


@full_float32()
def compare(rank, world_size, device, dataset="digits", windows=WINDOWS, steps=STEPS,
            batch_size=BATCH_SIZE, model_name="cnn"):
    """``{"compile_s", "step_ms": {"eager", "compiled"}, "first_step_difference",
    "max_difference", "steps"}``."""
    train_set, _, info = data.load(dataset)
    batches = replay.rank_batches(train_set, rank, world_size, batch_size,
                                  1 + windows * steps, device)
    torch.manual_seed(0)
    start = models.build(model_name, info).to(device)
    out, firsts, finals = {"step_ms": {}}, {}, {}
    for name in ("eager", "compiled"):
        model = train_ddp.wrap(copy.deepcopy(start), device)
        runnable = torch.compile(model) if name == "compiled" else model
        optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
        with Stopwatch(device) as watch:
            train_step(runnable, optimizer, *batches[0])  # the compiled run compiles here
        out[f"first_step_{name}_s"] = watch.seconds
        firsts[name] = [p.detach().clone() for p in model.module.parameters()]
        rest = iter(batches[1:])
        out["step_ms"][name] = statistics.median(
            1000 * timed_window(runnable, optimizer, rest, steps, device)
            for _ in range(windows))
        finals[name] = [p.detach() for p in model.module.parameters()]
    out["compile_s"] = out["first_step_compiled_s"]
    out["first_step_difference"] = replay.max_difference(firsts["compiled"], firsts["eager"])
    out["max_difference"] = replay.max_difference(finals["compiled"], finals["eager"])
    out["steps"] = 1 + windows * steps
    out.update(model=model_name, batch_size=batch_size)
    return out
