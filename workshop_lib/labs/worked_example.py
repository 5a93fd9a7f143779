"""Notebook 05, "Fit the global batch": the worked example's out-of-memory remedies.

The premise: your GPU holds the activations of a batch of 64, and the job needs the
worked example's global batch of 256 with its accuracy. The learner picks the training
script's flags (``--batch-size``, ``--accumulate``, ``--grad-checkpointing``, ``--amp``);
the check trains with them and judges the run's record: the global batch (batch x
accumulation) is 256, the bytes the first batch saved for backward stay within what
batch 64 saves in float32 (the budget, measured on the spot), and the model learns.
"""
import contextlib
import io
import shlex
import tempfile

import torch

from workshop_lib import data, memory, models, runlog
from workshop_lib.labs import Exercise, Verdict, register
from workshop_lib.precision import PLAIN

GLOBAL_BATCH, BUDGET_BATCH, ACCURACY_BAR = 256, 64, 0.95
BASE = ["--device", "cpu", "--dataset", "digits", "--epochs", "6", "--lr", "0.01",
        "--lr-ref-batch", "32", "--lr-scaling", "linear", "--warmup-epochs", "1",
        "--no-progress"]


def budget_bytes():
    """What batch 64 saves for backward in float32 with the course CNN: the budget."""
    train_set, _, info = data.load("digits")
    torch.manual_seed(0)
    x, y = (t[:BUDGET_BATCH] for t in train_set.tensors)
    return memory.saved_bytes_per_step(models.build("cnn", info), x, y, PLAIN)


def check(my_flags):
    from workshop_lib import train

    out = tempfile.mkdtemp(prefix="lab-fit-")
    try:
        with contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()) as errors:
            train.main([*BASE, *shlex.split(my_flags), "--out", out])
    except SystemExit:
        return Verdict(False, f"the script refused the flags: {errors.getvalue().strip()}")
    run, budget = runlog.read(out), budget_bytes()
    saved = run.epochs[0]["saved_activation_bytes"]
    problems = []
    if run.start["global_batch_size"] != GLOBAL_BATCH:
        problems.append(f"the global batch is {run.start['global_batch_size']}, not "
                        f"{GLOBAL_BATCH} (batch x accumulation)")
    if saved > budget:
        problems.append(f"a step saves {saved / 2**20:.2f} MiB for backward, over the "
                        f"{budget / 2**20:.2f} MiB batch {BUDGET_BATCH} needs (the budget): "
                        f"it would not fit")
    if run.final["val_acc"] < ACCURACY_BAR:
        problems.append(f"validation accuracy {run.final['val_acc']:.3f}, under the bar "
                        f"{ACCURACY_BAR}")
    details = {"saved_bytes": saved, "budget_bytes": budget, "run": out}
    if problems:
        return Verdict(False, "; ".join(problems), details)
    return Verdict(True, f"global batch {GLOBAL_BATCH} in {saved / 2**20:.2f} MiB of saved "
                         f"activations (budget {budget / 2**20:.2f} MiB), validation accuracy "
                         f"{run.final['val_acc']:.3f}", details)


register(Exercise("fit_in_memory", "05_worked_example", "train at global batch 256 where "
                  "only batch 64 fits",
                  writes="my_flags: train.py flags that fit global batch 256 in the budget",
                  check=check, stub=lambda: "--batch-size 256",
                  solution=lambda: "--batch-size 64 --accumulate 4",
                  stub_reason="it would not fit"))
