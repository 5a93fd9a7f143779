"""The SGD toy of notebook 01 behaves as the notebook says, and its widget redraws."""
import matplotlib
import numpy as np
import pytest

from workshop_lib import sgd_toy, widgets

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def problem():
    return sgd_toy.make_problem()


def test_gradient_is_the_derivative_of_the_loss(problem):
    params = np.array([0.3, 0.7])
    step = 1e-6
    numeric = [(problem.loss(*(params + step * e)) - problem.loss(*(params - step * e)))
               / (2 * step) for e in np.eye(2)]
    exact = problem.gradient(params, np.arange(problem.n_samples))
    np.testing.assert_allclose(exact, numeric, rtol=1e-6)


def test_full_batch_gd_descends_every_step_and_reaches_the_minimum(problem):
    for lr in (0.01, 0.9 * problem.max_stable_lr()):
        run = sgd_toy.sgd(problem, problem.n_samples, lr, epochs=200)
        assert not run.diverged
        # At the minimum the loss only jitters by floating-point rounding.
        assert np.all(np.diff(run.losses) <= 1e-12), f"loss went up at lr {lr}"
        assert run.noisiness() == 0
    best = problem.loss(*problem.best_params())
    assert run.final_loss == pytest.approx(best, rel=1e-3)
    np.testing.assert_allclose(run.params[-1], problem.best_params(), rtol=1e-2)


def test_max_stable_lr_is_where_full_batch_gd_starts_to_diverge(problem):
    limit = problem.max_stable_lr()
    below = sgd_toy.sgd(problem, problem.n_samples, 0.95 * limit, epochs=300)
    above = sgd_toy.sgd(problem, problem.n_samples, 1.05 * limit, epochs=300)
    assert not below.diverged and below.final_loss < below.losses[0]
    assert above.diverged


def test_one_step_per_batch_and_every_sample_once_per_epoch(problem):
    rng = np.random.default_rng(0)
    batches = list(sgd_toy.shuffled_batches(problem.n_samples, 24, epochs=2, rng=rng))
    assert [len(b) for b in batches] == [24, 24, 16] * 2
    for epoch in (batches[:3], batches[3:]):
        assert sorted(np.concatenate(epoch)) == list(range(problem.n_samples))
    assert not np.array_equal(np.concatenate(batches[:3]), np.concatenate(batches[3:]))
    for batch_size, steps in ((problem.n_samples, 5), (8, 40), (1, 320)):
        run = sgd_toy.sgd(problem, batch_size, 0.05, epochs=5)
        assert run.steps == steps and run.epochs[-1] == 5


def test_smaller_batches_get_further_per_epoch_but_noisier(problem):
    full, batch8, single = sgd_toy.compare_batch_sizes(problem, (problem.n_samples, 8, 1),
                                                       lr=0.05, epochs=10)
    assert single.final_loss < full.final_loss and batch8.final_loss < full.final_loss
    assert full.noisiness() == 0
    assert single.noisiness() > batch8.noisiness() > 0.05
    # The single-sample run ends wherever its last sample pushed it: the final loss
    # depends on the seed. Full-batch gradient descent has nothing random in it (the
    # shuffle only reorders a sum: rounding).
    single_finals = [sgd_toy.sgd(problem, 1, 0.1, 10, seed=s).final_loss for s in range(5)]
    full_finals = [sgd_toy.sgd(problem, problem.n_samples, 0.1, 10, seed=s).final_loss
                   for s in range(5)]
    assert np.std(single_finals) > 0.01 and np.std(full_finals) < 1e-12


def test_single_samples_diverge_at_a_rate_the_full_batch_survives(problem):
    lr = 0.98 * problem.max_stable_lr()
    assert not sgd_toy.sgd(problem, problem.n_samples, lr, epochs=10).diverged
    assert sgd_toy.sgd(problem, 1, lr, epochs=10).diverged


def test_plot_draw_replaces_the_runs_shown(problem):
    plot = sgd_toy.LossLandscapePlot(problem, figure=matplotlib.figure.Figure())
    fixed_lines = len(plot.landscape.lines)
    plot.draw(sgd_toy.compare_batch_sizes(problem, (64, 8, 1), lr=0.05, epochs=3))
    assert len(plot.landscape.lines) == fixed_lines + 3
    plot.draw([sgd_toy.sgd(problem, 4, 0.05, epochs=3)])
    assert len(plot.landscape.lines) == fixed_lines + 1
    assert [t.get_text() for t in plot.curves.get_legend().get_texts()] == [
        "best possible", "batch 4"]


def test_widget_redraws_when_batch_size_or_lr_changes(problem):
    explorer = widgets.BatchSizeExplorer(problem, epochs=5, batch_size=8, lr=0.05)
    assert explorer.batch_size.options[-1] == problem.n_samples

    def chosen_path():
        return explorer.plot.landscape.lines[-1].get_xydata().copy()

    path, image, summary = chosen_path(), explorer.image.value, explorer.summary.value
    assert len(path) == 5 * 8 + 1 and "batch 8" in summary and image

    explorer.batch_size.value = 1  # what dragging the slider in a browser does
    assert len(chosen_path()) == 5 * 64 + 1
    assert explorer.image.value != image and "single sample" in explorer.summary.value

    path = chosen_path()
    explorer.lr.value = 0.01
    assert chosen_path().shape == path.shape and not np.allclose(chosen_path(), path)
    assert "lr 0.01" in explorer.summary.value

    explorer.batch_size.value = problem.n_samples  # full batch: no second run to compare
    explorer.redraw()
    assert explorer.summary.value.count("<br>") == 0
    assert len(chosen_path()) == 5 + 1
