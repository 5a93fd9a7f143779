"""Notebook 00, "Watch your first job": record what each process of the first run did.

While the first DDP run trains, the learner watches it (the GPU dashboard or
``nvidia-smi -l 1`` on GPUs, ``top`` on a CPU machine, and the run's own start-up lines)
and fills in what they saw, then works out one quantity the run did not print: how many
optimizer steps an epoch would take on twice as many processes at the same batch per process
(each rank's share of the samples halves, padded as ``DistributedSampler`` pads, and a last
short batch still counts as a step). The check compares each entry with the run's record.
"""
import math

from workshop_lib import data, runlog
from workshop_lib.labs import Exercise, Verdict, register

FIELDS = {
    "processes": "how many processes trained (one '[rank r/N]' line each; one python "
                 "process each in top or nvidia-smi)",
    "device_type": "what each process trained on: 'cpu' or 'cuda'",
    "samples_per_rank": "training samples each rank drew per epoch ('samples=' in its line)",
    "global_batch": "samples per optimizer step over all ranks ('global_batch_size=')",
    "steps_on_twice_the_processes": "optimizer steps per epoch on twice as many processes, "
                                    "the same batch per process (work it out: the run "
                                    "printed its own steps, not these)",
}


def observed_in(run):
    """What the run's record says for each field."""
    train_set, _, _ = data.load(run.start["dataset"])
    world = run.start["world_size"]
    return {"processes": world,
            "device_type": run.start["device"].split(":")[0],
            "samples_per_rank": math.ceil(len(train_set) / world),
            "global_batch": run.start["global_batch_size"],
            "steps_on_twice_the_processes": data.steps_per_epoch(
                len(train_set), 2 * world, run.start["batch_size"])}


def stub(run=None):
    return dict.fromkeys(FIELDS)


def solution(run):
    return observed_in(run)


def shown():
    """The answer depends on the learner's own run: where each field shows in it."""
    return "\n".join(f"{name!r}: {where}" for name, where in FIELDS.items())


def check(observed, run):
    if not isinstance(observed, dict):
        return Verdict(False, "observed should be the dict of the cell above")
    missing = [key for key in FIELDS if observed.get(key) is None]
    if missing:
        return Verdict(False, f"fill in what you saw: {', '.join(missing)} is still None "
                              f"({FIELDS[missing[0]]})")
    expected = observed_in(run)
    wrong = [key for key in FIELDS if str(observed[key]).lower() != str(expected[key])]
    if wrong:
        return Verdict(False, "; ".join(f"{key}: you wrote {observed[key]!r}, the run's record "
                                        f"says {expected[key]!r}" for key in wrong)
                       + ". Read the start-up lines the run printed (the steps on twice the "
                         "processes: ceil(samples / (2 x processes)) per rank, then batches of "
                         "the batch per process)")
    return Verdict(True, f"{expected['processes']} process(es) on {expected['device_type']}, "
                         f"{expected['samples_per_rank']} samples each per epoch, a global "
                         f"batch of {expected['global_batch']}: that is what the job did; on "
                         f"{2 * expected['processes']} processes an epoch would take "
                         f"{expected['steps_on_twice_the_processes']} steps")


def earlier_runs(run):
    """The run's own printed steps copied as the answer for twice the processes."""
    return [{**observed_in(run), "steps_on_twice_the_processes": run.start["steps_per_epoch"]}]


def context():
    """A short real run to judge against, for `python -m workshop_lib.labs check`."""
    import contextlib
    import io
    import tempfile

    from workshop_lib import train

    out = tempfile.mkdtemp(prefix="lab-welcome-")
    with contextlib.redirect_stdout(io.StringIO()):
        train.main(["--device", "cpu", "--dataset", "digits", "--epochs", "1", "--no-progress",
                    "--out", out])
    return {"run": runlog.read(out)}


register(Exercise("welcome", "00_welcome", "record what each process of the first run did",
                  writes="observed: what each process of the first DDP job reported",
                  check=check, stub=stub, solution=solution, stub_reason="fill in what you saw",
                  context=context, shown=shown, earlier_runs=earlier_runs))
