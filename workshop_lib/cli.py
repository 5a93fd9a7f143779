"""The flags both training scripts share, with their checks.

``--batch-size`` is per process. The global batch, which sets the dynamics of SGD, is
``batch_size x accumulate x world_size``; the scripts print and log it. ``--lr-scaling
none|linear|sqrt`` with ``--lr-ref-batch``, ``--warmup-epochs`` (from the unscaled rate,
``--warmup-from base``, as Goyal et al.) and ``--schedule cosine|constant`` adapt the
learning rate to it; ``--optimizer lars`` adds layer-wise trust ratios. The worked
example's tools: ``--amp bf16|fp16`` (fp16 with a gradient scaler), ``--accumulate N``
(the DDP script skips the all-reduce with ``no_sync()`` for all but the last of N
batches), ``--grad-checkpointing``, ``--channels-last``. Each flag's ``--help`` says its
part.
"""
import argparse
import os
from pathlib import Path

from workshop_lib import data, faults, hardware, optim, precision, scaling
from workshop_lib.errors import ArgumentParser, CourseError  # noqa: F401 (cli.ArgumentParser)


def folder(text):
    """An --out value: a non-empty folder path."""
    if not text.strip():
        raise argparse.ArgumentTypeError("--out needs a folder name, got an empty string")
    return Path(text)


def add_common_args(parser, default_out):
    add = parser.add_argument
    add("--dataset", default="auto", choices=data.DATASET_CHOICES,
        help="auto: fashion-mnist if downloaded, else digits (default: %(default)s)")
    add("--data-dir", type=Path, default=data.DEFAULT_DATA_DIR,
        help="folder holding downloaded datasets, or the shards with --data-format shards "
             "(default: %(default)s)")
    add("--data-format", default="memory", choices=("memory", "shards"),
        help="memory: the dataset as tensors on the device; shards: WebDataset record shards "
             "in --data-dir, read rank by rank (default: %(default)s)")
    add("--model", default="cnn", help="cnn, wrn-16-4 or wrn-16-10 (default: %(default)s)")
    add("--epochs", type=int, default=10, help="default: %(default)s")
    add("--batch-size", type=int, default=64,
        help="samples per step per process (default: %(default)s)")
    add("--lr", type=float, default=optim.LR,
        help="learning rate at the reference batch --lr-ref-batch (default: %(default)s)")
    add("--lr-scaling", default="none", choices=scaling.SCALING_RULES,
        help="how the learning rate follows the global batch (default: %(default)s)")
    add("--lr-ref-batch", type=int, default=64,
        help="global batch size at which --lr was tuned (default: %(default)s)")
    add("--warmup-epochs", type=float, default=0.0,
        help="epochs of linear learning-rate warmup (default: %(default)s)")
    add("--warmup-from", default="base", choices=scaling.WARMUP_FROM,
        help="warmup starts at the unscaled --lr (base, Goyal et al.) or at ~0 "
             "(default: %(default)s)")
    add("--schedule", default="cosine", choices=scaling.SCHEDULES,
        help="learning rate after warmup: cosine decay to 0, or constant (default: %(default)s)")
    add("--optimizer", default="sgd", choices=optim.OPTIMIZERS,
        help="sgd, or for very large batches lars or lamb (per-tensor trust ratios) or "
             "novograd (per-tensor gradient norms) (default: %(default)s)")
    add("--momentum", type=float, default=optim.MOMENTUM,
        help="SGD momentum (default: %(default)s)")
    add("--weight-decay", type=float, default=optim.WEIGHT_DECAY, help="default: %(default)s")
    add("--seed", type=int, default=0, help="default: %(default)s")
    add("--target-accuracy", type=float, default=None,
        help="stop once validation accuracy reaches this for --patience epochs in a row")
    add("--patience", type=int, default=1, help="default: %(default)s")
    add("--amp", default="off", choices=precision.AMP_CHOICES,
        help="mixed precision: bf16 autocast, or fp16 autocast with a gradient scaler "
             "(default: %(default)s)")
    add("--accumulate", type=int, default=1, metavar="N",
        help="batches per optimizer step (gradient accumulation); the global batch, and the "
             "learning-rate rules, count all N (default: %(default)s)")
    add("--grad-checkpointing", action="store_true",
        help="recompute the model's blocks' activations in backward: less memory, more time")
    add("--channels-last", action="store_true",
        help="channels_last memory format for the model and the images (faster convolutions "
             "on GPUs with Tensor Cores; on an x86-64 CPU, whose convolutions oneDNN runs, "
             "the scripts use it anyway)")
    add("--device", default="auto", type=hardware.device_flag,
        help="auto, cpu, cuda or cuda:N; auto: a GPU if there is one, else the CPU "
             "(default: %(default)s)")
    add("--out", type=folder, default=Path(default_out),
        help="folder for run.jsonl and checkpoint.pt (default: %(default)s)")
    add("--progress", action=argparse.BooleanOptionalAction, default=True,
        help="show a progress bar per epoch (default: on)")
    add("--resume", action="store_true",
        help="continue from <out>/checkpoint.pt (model, optimizer, schedule, epoch, RNG)")
    add("--inject-fault", default=None, metavar="KIND@RANK:STEP",
        help="make a rank fail on purpose: raise, kill or hang at a training step, e.g. "
             "kill@1:30 (first attempt only; see workshop_lib/faults.py)")
    return parser


def check_args(args):
    """Reject values that would crash later or train nonsense, with the fix in the message."""
    from workshop_lib import models

    positive = {"--epochs": args.epochs, "--batch-size": args.batch_size,
                "--accumulate": args.accumulate,
                "--lr-ref-batch": args.lr_ref_batch, "--patience": args.patience}
    for flag, value in positive.items():
        if value < 1:
            raise CourseError(f"{flag} must be a positive integer, got {value}")
    if not args.lr > 0:
        raise CourseError(f"--lr must be positive, got {args.lr}")
    if not 0 <= args.momentum < 1:
        raise CourseError(f"--momentum must be in [0, 1), got {args.momentum}")
    if args.weight_decay < 0:
        raise CourseError(f"--weight-decay must be >= 0, got {args.weight_decay}")
    if not 0 <= args.warmup_epochs < args.epochs:
        raise CourseError(
            f"--warmup-epochs must be >= 0 and shorter than training (--epochs {args.epochs}), "
            f"got {args.warmup_epochs}"
        )
    if args.target_accuracy is not None and not 0 < args.target_accuracy <= 1:
        raise CourseError(
            f"--target-accuracy is a fraction in (0, 1], got {args.target_accuracy}")
    faults.parse(args.inject_fault)
    if args.model not in models.MODELS:
        raise CourseError(
            f"unknown model {args.model!r}; choose one of: {', '.join(models.MODELS)}")


def prepare_out_dir(out):
    """Create the output folder and prove it is writable, before any training time is spent."""
    probe = Path(out) / f".write-test-{os.getpid()}"
    try:
        Path(out).mkdir(parents=True, exist_ok=True)
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise CourseError(
            f"cannot write to output folder {out} ({error.strerror or error}); "
            f"pass --out with a folder you can write to"
        ) from None
    return Path(out)
