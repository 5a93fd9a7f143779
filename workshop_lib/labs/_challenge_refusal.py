"""What notebook 03's large-batch challenge refuses before anything trains.

The budget is the check's: a run whose flags set one of the options the check sets for
every run (epochs, batch size, base rate, seed, dataset, ...) is refused, since the
training script takes the last of a repeated flag. So is a run that trains what a run the
notebook made before the challenge trained (``NOTEBOOK_SWEEPS``, its sweep cells'
variants, at the check's batch and rate). Runs are compared by what they train, computed
as the training script computes it (``what_it_trains``): the learning rate of every
optimizer step, the global batch, the optimizer and every other option that changes the
arithmetic. So order, abbreviations, ``--flag=value``, a restated default, a warmup start
without warmup epochs, or an option that changes only how a step is computed
(``--grad-checkpointing``, ``--channels-last``) make no new run.
"""
import argparse
import math
import re
import shlex

from workshop_lib import cli, data, plans, scaling


def _training_parser(defaults=True):
    """The training script's parser: abbreviations (--epoch) and --flag=value read as it
    reads them; without ``defaults`` its namespace holds only what was given."""
    parser = cli.ArgumentParser(prog="python -m workshop_lib.train", add_help=False)
    cli.add_common_args(parser, default_out="runs/challenge")
    if not defaults:
        for action in parser._actions:
            action.default = argparse.SUPPRESS
    return parser


def _options_set_by(flags):
    """The options (the training script's names, e.g. "epochs") that ``flags`` set."""
    return set(vars(_training_parser(defaults=False).parse_args(flags)))


# Notebook 03's sweeps before the challenge, variant by variant, as its %%bash cells write
# them (tests/test_labs.py holds the cells to this list). Each cell's common flags are the
# budget the check sets itself: what is left of a variant is the run the learner could copy.
NOTEBOOK_SWEEPS = {
    "base_lr": {
        "small": "--batch-size $SMALL",
        "large_same_lr": "--batch-size $LARGE",
        "large_linear": "--batch-size $LARGE --lr-scaling linear",
        "large_sqrt": "--batch-size $LARGE --lr-scaling sqrt",
    },
    "hot_lr": {
        "small": "--batch-size $SMALL",
        "large_linear": "--batch-size $LARGE --lr-scaling linear",
        "large_linear_warmup": ("--batch-size $LARGE --lr-scaling linear "
                                "--warmup-epochs $WARMUP_EPOCHS"),
        "large_sqrt": "--batch-size $LARGE --lr-scaling sqrt",
        "large_sqrt_seed2": "--batch-size $LARGE --lr-scaling sqrt --seed $SEED2",
        "large_sqrt_seed3": "--batch-size $LARGE --lr-scaling sqrt --seed $SEED3",
        "large_lars": "--batch-size $LARGE --lr-scaling linear --optimizer lars",
        "large_lamb": "--batch-size $LARGE --lr-scaling linear --optimizer lamb",
        "large_novograd": "--batch-size $LARGE --lr-scaling linear --optimizer novograd",
        "large_sqrt_stop": "--batch-size $LARGE --lr-scaling sqrt --target-accuracy $STOP_AT",
    },
}
SECTIONS = {"base_lr": "section 1", "hot_lr": "section 2"}
# Options that change how a run is shown or where it stops, not what it trains: early
# stopping cuts the same run short (its epochs up to the stop are the full run's).
NOT_THE_RUN = {"progress", "target_accuracy", "patience"}


def effective_options(flags, budget):
    """What a run trains with: the training script's namespace for ``flags`` (a list),
    defaults filled in, without the ``budget`` options (the check's) and NOT_THE_RUN."""
    chosen = vars(_training_parser().parse_args(flags))
    return {name: value for name, value in chosen.items()
            if name not in budget and name not in NOT_THE_RUN}


def _cell_flags(flags, epochs):
    """A sweep cell's variant with its shell variables given a value: the warmup the
    notebook gives a run of ``epochs``; the others stand only for budget options or options
    that are not the run."""
    warmup = str(plans.warmup_epochs(epochs))
    return shlex.split(re.sub(r"\$\w+", lambda m: warmup if m[0] == "$WARMUP_EPOCHS" else "1",
                              flags))


def notebook_runs(budget, epochs):
    """[(options, ["section 2's large_sqrt", ...])]: each distinct run the notebook made
    before the challenge, as the check would train it, with the variants that made it."""
    runs = []
    for folder, variants in NOTEBOOK_SWEEPS.items():
        for variant, flags in variants.items():
            options = effective_options(_cell_flags(flags, epochs), budget)
            named = f"{SECTIONS[folder]}'s {variant}"
            match = next((names for seen, names in runs if seen == options), None)
            if match is None:
                runs.append((options, [named]))
            else:
                match.append(named)
    return runs


def as_flags(options, budget):
    """``options`` (effective_options) as the shortest flags: the ones that differ from the
    training script's defaults, "" for none."""
    defaults = effective_options([], budget)
    flags = []
    for name, value in options.items():
        if value != defaults[name]:
            flag = "--" + name.replace("_", "-")
            flags += [flag] if value is True else [flag, f"{value:g}" if isinstance(
                value, float) else str(value)]
    return shlex.join(flags)


# What sets a run's learning rate at each step: compared as the rates themselves.
SCHEDULE = {"lr", "lr_scaling", "lr_ref_batch", "warmup_epochs", "warmup_from", "schedule"}
# Options that change how a step is computed, not what it computes: activations recomputed
# in backward, another memory layout, the data read another way, a fault injected.
HOW_NOT_WHAT = {"grad_checkpointing", "channels_last", "data_format", "data_dir",
                "inject_fault"}
DEFAULT_BATCH_SCALE = 16


def what_it_trains(flags, common, large):
    """What a run of ``flags`` (a list) trains at the global batch ``large`` with the
    check's ``common`` flags, computed as the training script computes it: the learning
    rate of every optimizer step, the global batch, and every option that changes the
    arithmetic (optimizer, momentum, weight decay, precision, ...)."""
    args = _training_parser().parse_args([*common, *flags, "--batch-size", str(large)])
    train_size = data.DATASETS[args.dataset].train_size
    global_batch = args.batch_size * args.accumulate
    steps_per_epoch = math.ceil(math.ceil(train_size / args.batch_size) / args.accumulate)
    lr = scaling.scaled_lr(args.lr, args.lr_scaling, global_batch, args.lr_ref_batch)
    warmup_steps = round(args.warmup_epochs * steps_per_epoch)
    start = scaling.warmup_start(args.warmup_from, args.lr, lr)
    total = args.epochs * steps_per_epoch
    rates = tuple(round(lr * scaling.lr_factor(step, warmup_steps, total, args.schedule,
                                               start), 12) for step in range(total))
    rest = {name: value for name, value in vars(args).items()
            if name not in SCHEDULE | HOW_NOT_WHAT | NOT_THE_RUN | {"out", "resume"}}
    return {**rest, "global_batch": global_batch, "lr_per_step": rates}


def _epochs(common):
    return _training_parser().parse_args(common).epochs


def challenge_batch(common):
    """The challenge's large global batch for ``common`` (its reference batch x 16)."""
    return _training_parser().parse_args(common).lr_ref_batch * DEFAULT_BATCH_SCALE


def copied_run(flags, common, large=None):
    """The names of the notebook's earlier runs that train what ``flags`` (a list) trains,
    at the check's batch ``large`` and rate, or None."""
    large = large or challenge_batch(common)
    trains = what_it_trains(flags, common, large)
    copied = [f"{SECTIONS[folder]}'s {variant}"
              for folder, variants in NOTEBOOK_SWEEPS.items()
              for variant, cell in variants.items()
              if what_it_trains(_cell_flags(cell, _epochs(common)), common, large) == trains]
    return copied or None


def budget_options(common):
    """What the check sets for every run, so no run may: its common flags, the batch size,
    and where the run is written."""
    return _options_set_by(common) | {"batch_size", "out", "resume"}


def refusal(my_runs, common, large=None):
    """The one-line reason to refuse ``my_runs`` before training (at the global batch
    ``large``, the challenge's by default), or None."""
    budget = budget_options(common)
    for name, flags in my_runs.items():
        if not isinstance(flags, str):
            return f"run {name!r}: give its flags as one string, e.g. '--lr-scaling sqrt'"
        try:
            overrides = _options_set_by(shlex.split(flags)) & budget
        except SystemExit:  # the parser printed its one line: the flag it does not know
            return (f"run {name!r}: {flags!r} are not flags of the training script (the "
                    f"error above says which); see python -m workshop_lib.train --help")
        except ValueError as bad:  # shlex: an unclosed quote
            return f"run {name!r}: cannot split {flags!r} into flags ({bad})"
        if overrides:
            given = ", ".join(f"--{option.replace('_', '-')}" for option in sorted(overrides))
            return (f"run {name!r} sets {given}: the budget is the challenge's, the same for "
                    f"every run ({', '.join(sorted(budget))}); choose the rule, warmup, "
                    f"optimizer, schedule or momentum instead")
        copied = copied_run(shlex.split(flags), common, large)
        if copied:
            options = as_flags(effective_options(shlex.split(flags), budget), budget)
            return (f"run {name!r} repeats a run the notebook made before the challenge "
                    f"({', '.join(copied)}: {options or 'the defaults'} trains with the "
                    f"same learning rate at every step, batch, optimizer and momentum, at "
                    f"this batch and rate): copying a cell above is no answer; change its "
                    f"rule, warmup, optimizer, schedule or momentum")
    return None
