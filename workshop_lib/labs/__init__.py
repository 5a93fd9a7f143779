"""The workshop's exercises: what the learner writes, and the check that judges what it did.

Each notebook's exercise cells hold a stub the learner replaces; the cell after it calls
``labs.check(key, answer)``, which runs or inspects the learner's work and prints PASS or
NOT YET with the reason. A check judges behaviour (what the code did, what a launched job
did), never the text of the answer. Every check fails on its stub with a stated reason and
passes on the reference solution, fails every answer equivalent to a run the notebook
made before the exercise (``earlier_runs``: copying a cell above is no answer), and
refuses answers that break the exercise's rules (``refused``, e.g. flags that override a
budget):

    python -m workshop_lib.labs check     # proves it for every exercise (CI runs it)
    python -m workshop_lib.labs list
    python -m workshop_lib.labs progress  # the learner's own verdicts so far

Every verdict ``labs.check`` gives is recorded for the learner (``workshop_lib.progress``:
where they work, and on the class server for the instructor's board too); the proofs of
``python -m workshop_lib.labs check`` call the exercises' checks directly and record nothing.

Reference solutions are the learner's to use when stuck: ``labs.show_solution(key)``
prints one; with ``solutions = True`` in a notebook's parameters cell (papermill in CI
sets it) the exercise cells use them. (The assessment's solution is not here: it stays
with the instructor.)

One rule places everything: notebook ``notebooks/NN_<slug>.ipynb`` has its exercises in
``labs/<slug>.py`` (each ends in ``register(Exercise(...))``), their files in
``labs/files/<key>_stub.py`` and ``<key>_solution.py``, its closing sentences in
``findings/<slug>.py`` and its test in ``tests/test_notebook_NN.py``. The exercises are
found by importing this package's modules, never listed: ``python -m workshop_lib.labs
list`` prints the learner's whole to-do list.
"""
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from workshop_lib import progress


@dataclass(frozen=True)
class Verdict:
    """What a check found: ``ok``, and the reason (what to do next when not ok)."""

    ok: bool
    reason: str
    details: dict = field(default_factory=dict)

    def show(self):
        print(("PASS: " if self.ok else "NOT YET: ") + self.reason)
        return self

    def _repr_pretty_(self, printer, cycle):
        printer.text(("PASS: " if self.ok else "NOT YET: ") + self.reason)


def _no_answers(**_):
    return []


@dataclass(frozen=True)
class Exercise:
    key: str
    notebook: str        # the notebook whose cells hold it
    title: str
    writes: str          # what the learner writes, and where: one line of the to-do list
    check: Callable      # check(answer, **context) -> Verdict
    stub: Callable       # stub(**context) -> the answer the committed notebook holds
    solution: Callable   # solution(**context) -> the reference answer
    stub_reason: str     # words the check's reason must contain for the stub
    context: Callable = dict  # context() -> what the three need, for `labs check`
    shown: Callable | None = None  # shown() -> the answer as show_solution prints it
    # earlier_runs(**context) -> answers equivalent to what the notebook ran before the
    # exercise: copying a cell above must not pass, so the check must fail each of them.
    earlier_runs: Callable = _no_answers
    # refused(**context) -> [(answer, words)]: answers the check must refuse outright (e.g.
    # flags that override the budget), with the words its one-line reason must contain.
    refused: Callable = _no_answers


EXERCISES = {}


def register(exercise):
    EXERCISES[exercise.key] = exercise
    return exercise


def _load():
    """Import every module of this package: each notebook's module registers its exercises,
    in the notebooks' order."""
    import importlib
    import pkgutil

    for module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}")
    return dict(sorted(EXERCISES.items(), key=lambda item: item[1].notebook))


def get(key):
    exercises = _load()
    if key not in exercises:
        raise KeyError(f"no exercise {key!r}; there are: {', '.join(exercises)}")
    return exercises[key]


def catalogue():
    """``{key: notebook stem}`` of every exercise, in the notebooks' order."""
    return {key: exercise.notebook for key, exercise in _load().items()}


def check(key, answer, **context):
    """Judge ``answer`` for exercise ``key``, print the verdict, record it in the learner's
    progress, return it."""
    exercise = get(key)
    verdict = exercise.check(answer, **context).show()
    progress.record_verdict(exercise, verdict)
    return verdict


def solution(key, **context):
    """The reference answer for exercise ``key``."""
    return get(key).solution(**context)


def show_solution(key):
    """Print the reference answer of exercise ``key`` as the learner would write it (the
    script, the function, the values to fill in), for a learner who is stuck."""
    print(solution_text(key))


def solution_text(key):
    """The reference answer of exercise ``key``, as text."""
    exercise = get(key)
    if exercise.shown is not None:
        return exercise.shown()
    answer = exercise.solution()
    if isinstance(answer, Path):  # a script the exercise's cell writes
        return answer.read_text()
    if isinstance(answer, dict):  # the values of the answer cell's dict
        return "\n".join(f"{name!r}: {value!r}," for name, value in answer.items())
    if callable(answer):
        return inspect.getsource(answer)
    return str(answer)
