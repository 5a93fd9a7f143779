"""Notebook 00, Welcome: its closing findings, computed from its runs."""
from workshop_lib.findings.base import Finding, Findings

LEARNED_FACTOR = 2  # a run "learned" when its accuracy is this many times chance or more


def welcome(first_run, profile, num_classes):
    """The machine, the profile and the first DDP run of notebook 00."""
    hardware = first_run.start["hardware"]
    names = sorted({gpu["name"] for gpu in hardware["gpus"]})
    found = Findings([
        Finding("machine", f"This machine: {len(hardware['gpus'])} GPU(s), {', '.join(names)}, "
                           f"{hardware['cpu_cores']} CPU cores." if names else
                f"This machine: no GPU that PyTorch can use, {hardware['cpu_cores']} CPU "
                f"cores."),
        Finding("profile", f"Profile {profile.name}: DDP launches run {profile.nproc} "
                           f"process(es) with the {profile.backend} backend; dataset "
                           f"{profile.dataset}, model {profile.model}, batch "
                           f"{profile.batch_size} per process."),
        Finding("first_run", f"Your first run: {first_run.start['world_size']} process(es) "
                             f"trained one model on a global batch of "
                             f"{first_run.start['global_batch_size']} for "
                             f"{len(first_run.epochs)} epochs at up to "
                             f"{max(first_run.column('samples_per_s')):,.0f} samples/s, in "
                             f"{first_run.end['elapsed_s']:.1f} s from the first step to the "
                             f"end (the cell took longer: every process first starts Python, "
                             f"imports PyTorch and joins the group)."),
    ])
    chance = 1 / num_classes
    final = first_run.final["val_acc"]
    learned = final >= LEARNED_FACTOR * chance
    found.append(Finding(
        "learned",
        f"Validation accuracy: {first_run.epochs[0]['val_acc']:.1%} after epoch 1, "
        f"{final:.1%} after epoch {first_run.final['epoch']}; guessing scores {chance:.0%}, "
        + (f"and {final:.1%} is at least {LEARNED_FACTOR}x that: the environment works."
           if learned else f"and {final:.1%} is below {LEARNED_FACTOR}x that: the model "
                           f"did not learn; look at the run's output above."),
        holds=learned))
    return found
