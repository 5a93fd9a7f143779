"""Atomic checkpoints, learning-rate scaling rules and warmup."""
import math

import pytest
import torch

from workshop_lib import checkpoint, scaling


def test_a_crash_while_writing_leaves_the_previous_checkpoint_intact(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    checkpoint.save_atomic({"epoch": 1, "w": torch.ones(3)}, path)

    def torch_save_that_dies_halfway(obj, f):
        f.write(b"half a checkpoint")
        raise KeyboardInterrupt("machine went down")

    monkeypatch.setattr(torch, "save", torch_save_that_dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save_atomic({"epoch": 2, "w": torch.zeros(3)}, path)
    monkeypatch.undo()

    assert checkpoint.load(path)["epoch"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"], "no temp files left"


@pytest.mark.parametrize("rule,expected", [("none", 0.1), ("linear", 0.8),
                                           ("sqrt", 0.1 * math.sqrt(8))])
def test_scaling_rules(rule, expected):
    assert scaling.scaled_lr(0.1, rule, 512, 64) == pytest.approx(expected)


def test_warmup_rises_linearly_then_holds_or_decays():
    constant = [scaling.lr_factor(step, 4, 10, "constant") for step in range(10)]
    assert constant == [0.25, 0.5, 0.75] + [1.0] * 7
    cosine = [scaling.lr_factor(step, 4, 10, "cosine") for step in range(11)]
    assert cosine[:5] == [0.25, 0.5, 0.75, 1.0, 1.0]
    assert cosine[5:] == sorted(cosine[5:], reverse=True) and cosine[-1] == 0.0
    assert cosine[7] == pytest.approx(0.5)  # half-way through the decay
    assert scaling.lr_factor(0, 0, 10, "cosine") == 1.0
