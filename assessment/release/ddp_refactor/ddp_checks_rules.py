"""The rules of the assessment: the requirements and their points, the pass mark, the
speed-up bar (reported, never required), what one graded run is (``Config``) and how a
requirement that is not met is reported (``RequirementNotMet``).

Every other room of the checks (``ddp_checks_*.py``) applies these; ``ddp_checks`` is
the one the notebook imports, and it re-exports them. The notebook, the feedback and the
instructor's grades.csv all take the pass mark from ``passes``: it is defined once, here.

Your copy of this file is replaced by the instructor's when your work is graded.

Standard library only: the notebook's kernel imports this file.
"""
from dataclasses import dataclass

# The speed-up over one process is reported, never required: no point and no pass depends
# on it. On GPUs it is measured (a second, single-process launch) and set against this
# bar, SPEEDUP_PER_GPU x N, which stays advisory until it is calibrated on the grading
# machine (SPEEDUP_UNCALIBRATED says why). On the CPU it is not measured by default
# (SPEEDUP_NOT_REQUIRED_ON_CPU says why; Config.measure_speedup=True measures it anyway).
SPEEDUP_PER_GPU = 0.6
SPEEDUP_UNCALIBRATED = (
    "reported, not required: this bar is not yet calibrated on the grading machine, and "
    "a timing over this small a model moves by a third with one stall or a busy core")
SPEEDUP_NOT_REQUIRED_ON_CPU = (
    "on the CPU the speed-up is not required: the processes share the machine's cores and "
    "memory, and for a model this small an all-reduce over gloo costs about as much as a "
    "training step, so a correct job can be slower than one process")
BASELINE_EPOCHS = 3  # the single-process run: the first epoch warms up, the others count

# The requirements, in the notebook's order: grade id -> points.
REQUIREMENTS = {
    "runs_and_reaches_target_accuracy": 1,
    "shards_disjoint_and_cover": 2,
    "shards_reshuffled_each_epoch": 1,
    "gradients_averaged_over_ranks": 3,
    "rank0_only_logs_and_writes": 1,
    "checkpoint_loads_into_plain_model": 1,
    "validation_metrics_are_global": 2,
    "learning_rate_follows_global_batch": 1,
}
# The pass mark: a data-parallel job that trains (requirement 1: the target, in time, and
# on GPUs faster than one GPU), each rank on its own shard (2), with every step equal to
# one process's step on the union of the ranks' batches (4); and this many points in all.
PASS_REQUIRES = ("runs_and_reaches_target_accuracy", "shards_disjoint_and_cover",
                 "gradients_averaged_over_ranks")
PASS_POINTS = 9


def passes(met):
    """Whether a learner who met the requirements ``met`` (grade ids) passes: the one
    definition of the pass mark."""
    points = sum(REQUIREMENTS[grade_id] for grade_id in met)
    return points >= PASS_POINTS and all(grade_id in met for grade_id in PASS_REQUIRES)


def pass_rule():
    """The pass mark, in words."""
    return (f"requirements {', '.join(PASS_REQUIRES[:-1])} and {PASS_REQUIRES[-1]}, "
            f"and at least {PASS_POINTS} of the {sum(REQUIREMENTS.values())} points")


@dataclass(frozen=True)
class Config:
    """One graded run: the script's flags, the accuracy to reach, the time allowed, and
    whether to measure the speed-up (a second, single-process run of the script): None
    measures it where it is required (two or more GPUs), True on the CPU too, False
    nowhere."""

    epochs: int = 4
    batch_size: int = 8
    # --accumulate: the batches per rank whose gradients each optimizer step accumulates
    # (None: the flag is not passed, as for notebook 02's script, and not checked)
    accumulate: int | None = None
    lr: float = 0.03
    seed: int = 0
    target_accuracy: float = 0.85
    time_limit_s: float = 300
    measure_speedup: bool | None = None


class RequirementNotMet(AssertionError):
    """A requirement the run does not meet; shown as its message alone, no traceback."""

    def _render_traceback_(self):
        return [f"\x1b[0;31mRequirement not met\x1b[0m: {self}"]
