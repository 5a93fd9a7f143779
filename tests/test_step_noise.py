"""Notebook 03's picture of the rules draws the arithmetic its text states: the square-root
rule keeps a step's noise, the linear rule keeps an epoch's summed variance (its steps sqrt(k)
times noisier), keeping the rate lowers both."""
import matplotlib
import pytest

from workshop_lib import plots, scaling

matplotlib.use("Agg")


def test_each_rule_keeps_what_the_notebook_says():
    lr, small, batches = 0.01, 32, [32, 128, 512]
    ax = plots.plot_step_noise({rule: lambda b, rule=rule: scaling.scaled_lr(lr, rule, b, small)
                                for rule in scaling.SCALING_RULES}, lr, small, batches)
    lines = {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()}
    assert lines["sqrt: one step"] == pytest.approx([1, 1, 1])
    assert lines["linear: one epoch (variance)"] == pytest.approx([1, 1, 1])
    assert lines["linear: one step"] == pytest.approx([1, 2, 4])  # sqrt(k), k = 4 and 16
    assert lines["none: one step"] == pytest.approx([1, 1 / 2, 1 / 4])
    assert lines["none: one epoch (variance)"] == pytest.approx([1, 1 / 16, 1 / 256])
