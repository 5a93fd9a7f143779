"""The data for the assessment: scikit-learn's 1,797 handwritten digits, as 64 pixels each.

Provided, not part of the exercise: the grader uses this same file (your copy is replaced
by the original when your work is graded), so keep your script calling ``load_data()``.
"""
import gzip
import importlib.util
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

VAL_SIZE = 360  # divides evenly over 1, 2, 3, 4, 5, 6 or 8 processes
SPLIT_SEED = 0  # the same split on every rank, in every run


def load_data():
    """Return ``(train_set, val_set)``: 1,437 and 360 samples of (64 floats in [0, 1], label)."""
    pixels, labels = digits()
    x = pixels / 16  # pixel values are 0..16
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(SPLIT_SEED))
    val, train = order[:VAL_SIZE], order[VAL_SIZE:]
    return TensorDataset(x[train], labels[train]), TensorDataset(x[val], labels[val])


def digits():
    """``sklearn.datasets.load_digits()``'s ``data`` (float32) and ``target`` (int64), read
    from the file scikit-learn ships as ``load_digits`` reads it, without importing
    scikit-learn: that import costs every process of the job about a second."""
    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
    csv = Path(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz") \
        if spec and spec.submodule_search_locations else None
    if csv is None or not csv.is_file():
        from sklearn.datasets import load_digits

        found = load_digits()
        return (torch.tensor(found.data, dtype=torch.float32),
                torch.tensor(found.target, dtype=torch.int64))
    with gzip.open(csv, "rt") as lines:
        table = torch.tensor([[float(v) for v in line.split(",")] for line in lines
                              if line.strip()])
    return table[:, :-1], table[:, -1].long()
