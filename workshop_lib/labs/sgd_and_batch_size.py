"""Notebook 01, "Write mini-batch SGD": the loop the whole course scales up.

The learner writes ``my_sgd(problem, batch_size, lr, epochs, seed)``: every epoch a fresh
permutation of the samples, cut into batches in order, one step against each batch's
gradient. The check runs it for the full batch, a mini-batch and a single sample, and
compares every step with the library's ``sgd_toy.sgd`` (same seed, same random draws).
"""
from pathlib import Path

import numpy as np

from workshop_lib import sgd_toy
from workshop_lib.labs import Exercise, Verdict, register

FILES = Path(__file__).resolve().parent / "files"
BATCH_SIZES = (64, 8, 1)
LR, EPOCHS, SEED = 0.05, 3, 0
TOLERANCE = 1e-9


def load(name):
    """The function ``my_sgd`` of ``files/<name>``, defined as a notebook cell defines it
    (where ``np`` and ``sgd_toy`` are imported)."""
    namespace = {"np": np, "sgd_toy": sgd_toy}
    exec((FILES / name).read_text(), namespace)
    return namespace["my_sgd"]


def check(my_sgd, problem=None):
    problem = problem or sgd_toy.make_problem()
    for batch_size in BATCH_SIZES:
        expected = sgd_toy.sgd(problem, batch_size, LR, EPOCHS, SEED).params
        try:
            path = np.asarray(my_sgd(problem, batch_size, LR, EPOCHS, SEED), dtype=float)
        except NotImplementedError as error:
            return Verdict(False, f"my_sgd raised NotImplementedError ({error}): write its "
                                  f"loop in place of the raise")
        except Exception as error:
            return Verdict(False, f"my_sgd(batch_size={batch_size}) raised "
                                  f"{type(error).__name__}: {error}")
        if path.shape != expected.shape:
            return Verdict(False, f"batch {batch_size}: {len(path) - 1} steps in {EPOCHS} "
                                  f"epochs, expected {len(expected) - 1} (ceil(64 / "
                                  f"{batch_size}) per epoch, and the start in the path)")
        departs = np.flatnonzero(np.abs(path - expected).max(axis=1) > TOLERANCE)
        if departs.size:
            step = int(departs[0])
            return Verdict(False, f"batch {batch_size}: your (w, b) departs from mini-batch "
                                  f"SGD at step {step}: {path[step].round(4)} instead of "
                                  f"{expected[step].round(4)}. One permutation per epoch "
                                  f"(rng.permutation), batches taken in order, lr times the "
                                  f"batch's gradient")
    return Verdict(True, f"my_sgd takes the same {len(expected) - 1} steps as mini-batch SGD "
                         f"for batch sizes {', '.join(map(str, BATCH_SIZES))}")


register(Exercise("sgd", "01_sgd_and_batch_size", "write mini-batch SGD",
                  writes="my_sgd: one epoch of mini-batch SGD on the toy problem",
                  check=check, stub=lambda: load("sgd_stub.py"),
                  solution=lambda: load("sgd_solution.py"),
                  shown=lambda: (FILES / "sgd_solution.py").read_text(),
                  stub_reason="raised NotImplementedError"))
