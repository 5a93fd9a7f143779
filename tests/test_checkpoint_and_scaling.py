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


def test_warmup_rises_linearly_then_holds():
    factors = [scaling.warmup_factor(step, 4) for step in range(6)]
    assert factors == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert scaling.warmup_factor(0, 0) == 1.0
