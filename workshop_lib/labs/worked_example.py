"""Notebook 05's exercises: "Find the knee" and "Fit the global batch".

**Find the knee.** The learner writes ``my_knee(samples_per_s)``: from a curve measured by
``throughput.measure`` (``{batch per device: samples/s}``), the smallest batch whose
samples/s is within 10% of the best the curve reached. The check runs it on curves whose
knee is known (``KNEE_CURVES``: recorded on a GPU and on the CPU, in any order, noisy,
still rising, already flat) and compares each answer with the rule's.

**Fit the global batch**, the worked example's out-of-memory remedies.

The premise: your GPU holds the activations of a batch of 64, the job needs the worked
example's global batch of 256 with its accuracy, and an optimizer step may take at most
two micro-batches (the course CNN has BatchNorm, and each micro-batch normalises with the
statistics of its own smaller batch: the more micro-batches, the further a step is from
the large batch's). The learner picks the training script's flags
(``--batch-size``, ``--accumulate``, ``--grad-checkpointing``, ``--amp``), and only those:
the budget (epochs, learning rate, data, ...) is the check's. The check first refuses,
without training, what cannot pass: a global batch (batch x accumulation) other than 256,
more than two micro-batches, or then a step that saves more for backward than batch 64 in
float32 (the budget, measured on the spot for the chosen batch, checkpointing and
precision). Then it trains with the flags and judges the run's record the same way, and
that the model learns.

The notebook's own runs above the exercise (``NOTEBOOK_RUNS``) do not pass: accumulating four
micro-batches of 64 breaks the two-micro-batch limit, and at batch 256 in one step neither
checkpointing nor bf16 alone brings a step under the budget. The answer weighs them: two
micro-batches of 128 with gradient checkpointing (bf16 alone does not halve what a step
saves: some of it stays in float32).
"""
import argparse
import contextlib
import functools
import io
import shlex
import tempfile
from pathlib import Path

import torch

from workshop_lib import cli, data, memory, models, runlog
from workshop_lib.findings.worked_example import KNEE_SHARE
from workshop_lib.labs import Exercise, Verdict, register
from workshop_lib.precision import PLAIN, Precision

GLOBAL_BATCH, BUDGET_BATCH, MAX_MICRO_BATCHES, ACCURACY_BAR = 256, 64, 2, 0.95
BASE = ["--device", "cpu", "--dataset", "digits", "--epochs", "6", "--lr", "0.01",
        "--lr-ref-batch", "32", "--lr-scaling", "linear", "--warmup-epochs", "1",
        "--no-progress"]
# The flags the learner chooses (by argparse dest); every other flag is the budget's.
CHOICES = {"batch_size": "--batch-size", "accumulate": "--accumulate",
           "grad_checkpointing": "--grad-checkpointing", "amp": "--amp"}
UNSET = object()


def training_parser():
    """train.py's own flags, so that abbreviations and ``--flag=value`` read as it reads them."""
    parser = cli.ArgumentParser(prog="my_flags")
    cli.add_common_args(parser, default_out="runs/train")
    return parser


def read_flags(my_flags):
    """``(settings, refusal)``: the four choices with train.py's defaults where not given,
    or one line saying why the flags are refused (a budget flag, or a flag train.py
    rejects)."""
    parser = training_parser()
    given = argparse.Namespace(**{action.dest: UNSET for action in parser._actions})
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            parser.parse_args(shlex.split(my_flags), given)
    except SystemExit:
        return None, f"train.py refused the flags: {errors.getvalue().strip()}"
    except ValueError as error:  # shlex: an unclosed quote
        return None, f"the flags do not parse: {error}"
    budget = sorted(next(a.option_strings[0] for a in parser._actions if a.dest == dest)
                    for dest, value in vars(given).items()
                    if value is not UNSET and dest not in CHOICES and dest != "help")
    if budget:
        return None, (f"{', '.join(budget)} is the exercise's budget, not a choice: use only "
                      f"{', '.join(CHOICES.values())}")
    defaults = parser.parse_args([])
    return {dest: getattr(defaults if getattr(given, dest) is UNSET else given, dest)
            for dest in CHOICES}, None


@functools.cache
def saved_bytes(batch, grad_checkpointing=False, amp="off"):
    """What one step of the course CNN saves for backward on digits, on the CPU (a count of
    tensor sizes, the same on every machine: measured once per process)."""
    train_set, _, info = data.load("digits")
    torch.manual_seed(0)
    x, y = (t[:batch] for t in train_set.tensors)
    precision = PLAIN if amp == "off" else Precision(amp)
    return memory.saved_bytes_per_step(models.build("cnn", info, grad_checkpointing), x, y,
                                       precision)


def budget_bytes():
    """What batch 64 saves for backward in float32 with the course CNN: the budget."""
    return saved_bytes(BUDGET_BATCH)


def problems_with(global_batch, micro_batches, saved, budget):
    problems = []
    if global_batch != GLOBAL_BATCH:
        problems.append(f"the global batch is {global_batch}, not {GLOBAL_BATCH} "
                        f"(batch x accumulation)")
    if micro_batches > MAX_MICRO_BATCHES:
        problems.append(f"{micro_batches} micro-batches per step, over the limit of "
                        f"{MAX_MICRO_BATCHES} (BatchNorm normalises each micro-batch "
                        f"with its own statistics)")
    if saved > budget:
        problems.append(f"a step saves {saved / 2**20:.2f} MiB for backward, over the "
                        f"{budget / 2**20:.2f} MiB batch {BUDGET_BATCH} needs (the budget): "
                        f"it would not fit")
    return problems


def precheck(my_flags):
    """Why ``my_flags`` cannot pass, found without training; None when they may."""
    settings, refusal = read_flags(my_flags)
    if refusal:
        return refusal
    if settings["batch_size"] < 1 or settings["accumulate"] < 1:
        return "--batch-size and --accumulate take positive whole numbers"
    global_batch, micro_batches = settings["batch_size"] * settings["accumulate"], \
        settings["accumulate"]
    # The shape first: what a step saves is measured (a forward and backward) only for a
    # batch that could be the answer.
    problems = problems_with(global_batch, micro_batches, saved=0, budget=0)
    if not problems:
        problems = problems_with(global_batch, micro_batches, saved_bytes(
            settings["batch_size"], settings["grad_checkpointing"], settings["amp"]),
            budget_bytes())
    return "; ".join(problems) or None


def check(my_flags):
    from workshop_lib import train

    refused = precheck(my_flags)
    if refused:
        return Verdict(False, refused)
    out = tempfile.mkdtemp(prefix="lab-fit-")
    try:
        with contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()) as errors:
            train.main([*BASE, *shlex.split(my_flags), "--out", out])
    except SystemExit:
        return Verdict(False, f"the script refused the flags: {errors.getvalue().strip()}")
    run, budget = runlog.read(out), budget_bytes()
    saved = run.epochs[0]["saved_activation_bytes"]
    problems = problems_with(run.start["global_batch_size"], run.start["accumulate"], saved,
                             budget)
    if run.final["val_acc"] < ACCURACY_BAR:
        problems.append(f"validation accuracy {run.final['val_acc']:.3f}, under the bar "
                        f"{ACCURACY_BAR}")
    details = {"saved_bytes": saved, "budget_bytes": budget, "run": out}
    if problems:
        return Verdict(False, "; ".join(problems), details)
    return Verdict(True, f"global batch {GLOBAL_BATCH} in {run.start['accumulate']} "
                         f"micro-batch(es), {saved / 2**20:.2f} MiB of saved activations "
                         f"(budget {budget / 2**20:.2f} MiB), validation accuracy "
                         f"{run.final['val_acc']:.3f}", details)


# Notebook 05's runs before the exercise, as its %%bash sweep cells write them, each with its
# cell's common batch flag (tests/test_labs.py holds the cells to this list): the chosen
# flags a learner could copy, for every profile's $BATCH_SIZE (the remedies run at
# REMEDY_SCALE x it, $BIG_BATCH).
NOTEBOOK_RUNS = {
    "precision": {"fp32": "--batch-size $BATCH_SIZE --amp off",
                  "bf16": "--batch-size $BATCH_SIZE --amp bf16",
                  "fp16": "--batch-size $BATCH_SIZE --amp fp16"},
    "remedies": {"plain": "--batch-size $BIG_BATCH",
                 "smaller_batch_accumulate": "--batch-size $BATCH_SIZE --accumulate 4",
                 "checkpointing": "--batch-size $BIG_BATCH --grad-checkpointing",
                 "bf16": "--batch-size $BIG_BATCH --amp bf16"},
}


def as_flags(settings):
    """The four choices as flags, in one spelling."""
    return (f"--batch-size {settings['batch_size']} --accumulate {settings['accumulate']} "
            f"--amp {settings['amp']}" + " --grad-checkpointing" * settings["grad_checkpointing"])


def earlier_runs(**_):
    """Every run notebook 05 made before the exercise, at every profile's batch, as the
    flags of an answer (at batch 64 the remedies' global batch is the exercise's 256): the
    check refuses each without training."""
    import re

    from workshop_lib import plans, profile

    answers = []
    for batch in sorted({sizes.batch_size for sizes in profile.SIZES.values()}):
        values = {"BATCH_SIZE": batch, "BIG_BATCH": plans.REMEDY_SCALE * batch}
        for variants in NOTEBOOK_RUNS.values():
            for flags in variants.values():
                settings, _ = read_flags(re.sub(r"\$(\w+)", lambda m, v=values: str(v[m[1]]),
                                                flags))
                if as_flags(settings) not in answers:
                    answers.append(as_flags(settings))
    return answers


def budget_overrides(**_):
    """Flags that set the exercise's budget: refused, by the budget flag's name, before
    anything trains, abbreviated or not."""
    choice = "--batch-size 128 --accumulate 2 --grad-checkpointing"
    return [(f"{choice} --epochs 30", "--epochs is the exercise's budget"),
            ("--batch-size 128 --ep=30 --accumulate 2 --grad-checkpointing",
             "--epochs is the exercise's budget"),
            (f"--lr 0.1 {choice}", "--lr is the exercise's budget"),
            (f"{choice} --model wrn-16-4", "--model is the exercise's budget"),
            (f"{choice} --dataset fashion-mnist", "--dataset is the exercise's budget")]


register(Exercise("fit_in_memory", "05_worked_example", "train at global batch 256 where "
                  "only batch 64 fits, in at most two micro-batches per step",
                  writes="my_flags: train.py flags that fit global batch 256 in the budget",
                  check=check, stub=lambda: "--batch-size 256",
                  solution=lambda: "--batch-size 128 --accumulate 2 --grad-checkpointing",
                  stub_reason="it would not fit", earlier_runs=earlier_runs,
                  refused=budget_overrides))


# Find the knee. Curves {batch per device: samples/s}, each with the batch the rule gives
# (findings.worked_example.KNEE_SHARE: within 10% of the best).
KNEE_CURVES = (
    # One H200, wrn-16-10 on Fashion-MNIST, bf16 and channels_last (2026-12-04,
    # BENCHMARKS.md "The course on one GPU"): launch-bound at 128, filled from 256.
    ("a GPU's", {128: 17_900, 256: 25_300, 512: 27_000}, 256),
    # This repository's CI machine, the course CNN on digits, one thread: a fixed cost of
    # about 1.5 ms a step, then the arithmetic.
    ("a CPU's", {4: 1_868, 8: 2_988, 16: 3_993, 32: 4_334, 64: 4_768, 128: 5_302,
                 256: 5_080}, 128),
    ("an unordered, noisy", {512: 2_450, 32: 1_000, 128: 2_600, 64: 1_900, 256: 2_500}, 128),
    ("a still rising", {16: 1_000, 32: 2_000, 64: 3_900}, 64),
    ("an already flat", {128: 9_500, 256: 9_800, 512: 9_900}, 128),
)
FILES = Path(__file__).resolve().parent / "files"


def load_knee(name):
    """The function ``my_knee`` of ``files/<name>``, defined as a notebook cell defines it."""
    namespace = {}
    exec((FILES / name).read_text(), namespace)
    return namespace["my_knee"]


def check_knee(my_knee):
    for kind, curve, knee in KNEE_CURVES:
        try:
            answer = my_knee(dict(curve))
        except Exception as error:
            return Verdict(False, f"my_knee raised {type(error).__name__} on {kind} curve "
                                  f"{curve}: {error}")
        if answer not in curve:
            return Verdict(False, f"my_knee returned {answer!r} for {kind} curve {curve}: "
                                  f"not a batch of the curve")
        if answer != knee:
            best = max(curve.values())
            return Verdict(False, f"my_knee returned {answer} for {kind} curve {curve}; the "
                                  f"best rate is {best:,}, and the smallest batch at "
                                  f"{KNEE_SHARE:.0%} of it or more is {knee}")
    return Verdict(True, f"my_knee finds the knee of {len(KNEE_CURVES)} curves (a GPU's, a "
                         f"CPU's, unordered and noisy, still rising, already flat)")


register(Exercise("knee", "05_worked_example", "find the batch per device past which a "
                  "larger batch stops paying",
                  writes="my_knee: the smallest batch within 10% of a curve's best samples/s",
                  check=check_knee, stub=lambda: load_knee("knee_stub.py"),
                  solution=lambda: load_knee("knee_solution.py"),
                  shown=lambda: (FILES / "knee_solution.py").read_text(),
                  stub_reason="not a batch of the curve"))
