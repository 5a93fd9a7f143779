"""What a finding is: a sentence computed from run records, with its verdict.

Every notebook ends with "What you should have seen": one call into the notebook's own
module of this package (``findings/<slug>.py``, named like ``notebooks/NN_<slug>.ipynb``),
which takes the run records (``runlog.Run``) and results of that execution and returns
``Findings``. A finding that judges (learned, faster, reproduced, ...) carries its verdict
in ``holds``, decided by a threshold stated in the sentence, so a test can feed synthetic
records and watch the sentence change; a part of a notebook that could not run on this
machine (one process, no GPU) is a finding too, saying what was skipped and why.
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    key: str                 # a stable name, for tests and for the notebook's own use
    text: str                # the sentence the learner reads
    holds: bool | None = None  # the verdict, where the sentence judges; None otherwise
    skipped: bool = False    # this part did not run here; ``text`` says why


class Findings(list):
    """A list of ``Finding``; ``findings["key"]`` picks one by key."""

    def __getitem__(self, key):
        if isinstance(key, str):
            for finding in self:
                if finding.key == key:
                    return finding
            raise KeyError(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        return any(f.key == key for f in self) if isinstance(key, str) else \
            super().__contains__(key)

    def __add__(self, other):
        return Findings([*self, *other])

    def show(self):
        """Print one bullet per finding (what a notebook's closing cell does)."""
        print("\n".join(f"- {finding.text}" for finding in self))
        return self


def skipped(key, why):
    return Finding(key, f"Skipped: {why}", skipped=True)


def needs_ranks(key, what):
    return skipped(key, f"{what} needs two ranks or more; this execution ran one (nproc is 1).")


def mean(values):
    return sum(values) / len(values)


def spread_pp(values):
    """Seed-to-seed spread of accuracies, in percentage points (max - min)."""
    return 100 * (max(values) - min(values))


SETTLED_SHARE = 0.1  # a run's settled accuracy: the lowest of its last 10% of epochs (>= 1)


def settled(run):
    """The lowest validation accuracy of the run's last SETTLED_SHARE of epochs: where the
    run has settled, not where its last epoch happened to land (every verdict on a run's
    accuracy reads this, never the last epoch alone)."""
    accs = run.column("val_acc")
    return min(accs[-settled_epochs(run):])


def settled_epochs(run):
    return max(1, round(SETTLED_SHARE * len(run.epochs)))
