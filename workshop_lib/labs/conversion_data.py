"""The data of notebook 02's conversion exercise: the course's digits, as images.

The exercise's script loads it with ``load_data()``, which the grading engine (the
assessment's ``ddp_recorder``) watches to tell the training set from the validation set.
"""
from workshop_lib import data


def load_data():
    """``(train_set, val_set)``: 1,438 and 359 digits, 1x8x8 standardised images."""
    train_set, val_set, _ = data.load("digits")
    return train_set, val_set
