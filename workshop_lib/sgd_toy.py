"""Gradient descent from first principles on a problem small enough to see (notebook 01).

The problem: fit a line ``y = w * x + b`` to 64 noisy points by minimising the mean
squared error. With two parameters the loss is a surface over the (w, b) plane, drawn
as contour lines, and every optimizer step is a point on it.

- full batch (``batch_size == n_samples``): the exact gradient, one step per epoch.
- mini-batch: the gradient of a random batch, a noisy but unbiased estimate of the full
  gradient; ``n_samples / batch_size`` steps per epoch.
- single sample (``batch_size == 1``): the noisiest estimate, the most steps per epoch.

Everything here is plain NumPy: the gradient is written out, not left to autograd, so
that the update ``params - lr * gradient`` is all there is to read.
"""
from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np

START = (-1.0, 3.0)  # (w, b) where every run starts, far along the loss valley's long axis
DIVERGED_LOSS = 1e6  # a run whose loss passes this has diverged; stopping avoids overflow
ROUNDING = 1e-12  # relative change of the loss too small to be more than rounding


@dataclass(frozen=True)
class Problem:
    """Samples ``(x, y)`` of a noisy line; the model is ``w * x + b``."""

    x: np.ndarray
    y: np.ndarray

    @property
    def n_samples(self):
        return len(self.x)

    def loss(self, w, b):
        """Mean squared error over all samples. ``w`` and ``b`` may be arrays (a grid)."""
        w, b = np.asarray(w)[..., None], np.asarray(b)[..., None]
        return ((w * self.x + b - self.y) ** 2).mean(axis=-1)

    def gradient(self, params, batch):
        """Gradient of the mean squared error over the samples ``batch``, at ``params``."""
        w, b = params
        error = w * self.x[batch] + b - self.y[batch]
        return np.array([2 * (error * self.x[batch]).mean(), 2 * error.mean()])

    def best_params(self):
        """The exact minimum (least squares), the point every run is heading for."""
        w, b = np.polyfit(self.x, self.y, deg=1)
        return np.array([w, b])

    def max_stable_lr(self):
        """Full-batch gradient descent diverges above ``2 / (largest curvature)``.

        The loss is quadratic; its curvature (Hessian) is ``2 * mean([x, 1]^T [x, 1])``.
        Steps along the steepest direction overshoot, and grow, once ``lr`` passes 2 over
        its eigenvalue. Single samples have their own, larger curvatures: SGD with
        ``batch_size=1`` becomes unstable at a smaller rate.
        """
        features = np.stack([self.x, np.ones_like(self.x)], axis=1)
        hessian = 2 * features.T @ features / self.n_samples
        return 2 / np.linalg.eigvalsh(hessian).max()


def make_problem(n_samples=64, noise=0.5, seed=0):
    """A noisy line ``y = 1.5 x - 1`` sampled at ``x`` in [0, 3].

    ``x`` is not centred, so ``w`` and ``b`` are correlated: the loss valley is long and
    narrow, as loss surfaces of real networks are in many directions.
    """
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 3, n_samples)
    return Problem(x=x, y=1.5 * x - 1 + rng.normal(0, noise, n_samples))


@dataclass(frozen=True)
class Trajectory:
    """One optimisation run: the parameters and the full-dataset loss after every step."""

    batch_size: int
    lr: float
    n_samples: int
    params: np.ndarray  # (steps + 1, 2): (w, b) at the start and after each step
    losses: np.ndarray  # (steps + 1,): loss over ALL samples, whatever the batch
    diverged: bool

    @property
    def steps_per_epoch(self):
        return -(-self.n_samples // self.batch_size)

    @property
    def steps(self):
        return len(self.losses) - 1

    @property
    def epochs(self):
        """Epochs (passes over the data) completed after each step: the x-axis of a loss curve."""
        return np.arange(len(self.losses)) / self.steps_per_epoch

    @property
    def final_loss(self):
        return float(self.losses[-1])

    @property
    def label(self):
        if self.batch_size >= self.n_samples:
            return f"full batch ({self.n_samples})"
        return "single sample" if self.batch_size == 1 else f"batch {self.batch_size}"

    def noisiness(self):
        """Fraction of steps after which the full-dataset loss went UP.

        Full-batch gradient descent with a small enough learning rate never goes up; a
        noisy gradient estimate often points partly the wrong way. Rises smaller than
        floating-point rounding (at the minimum) do not count.
        """
        if not self.steps:
            return 0.0
        return float(np.mean(np.diff(self.losses) > ROUNDING * self.losses[:-1]))


def shuffled_batches(n_samples, batch_size, epochs, rng):
    """Sample indices, batch by batch: every epoch a fresh permutation, split in order."""
    for _ in range(epochs):
        order = rng.permutation(n_samples)
        for first in range(0, n_samples, batch_size):
            yield order[first:first + batch_size]


def sgd(problem, batch_size, lr, epochs, seed=0, start=START):
    """Mini-batch stochastic gradient descent; ``batch_size = problem.n_samples`` is plain GD."""
    rng = np.random.default_rng(seed)
    params = np.array(start, dtype=float)
    path, losses = [params], [problem.loss(*params)]
    for batch in shuffled_batches(problem.n_samples, batch_size, epochs, rng):
        params = params - lr * problem.gradient(params, batch)
        path.append(params)
        losses.append(problem.loss(*params))
        if not losses[-1] < DIVERGED_LOSS:
            break
    return Trajectory(batch_size=batch_size, lr=lr, n_samples=problem.n_samples,
                      params=np.array(path), losses=np.array(losses),
                      diverged=not losses[-1] < DIVERGED_LOSS)


def compare_batch_sizes(problem, batch_sizes, lr, epochs, seed=0):
    """One run per batch size, same learning rate, same number of epochs."""
    return [sgd(problem, batch_size, lr, epochs, seed) for batch_size in batch_sizes]


def describe(trajectory, problem):
    """One sentence: what a run did in its epochs, against the best possible loss."""
    if trajectory.diverged:
        return (f"{trajectory.label}, lr {trajectory.lr:.3g}: diverged after "
                f"{trajectory.steps} steps (the loss passed {DIVERGED_LOSS:.0e})")
    best = problem.loss(*problem.best_params())
    return (f"{trajectory.label}, lr {trajectory.lr:.3g}: {trajectory.steps} steps, final loss "
            f"{trajectory.final_loss:.3f} (best possible {best:.3f}), loss went up after "
            f"{trajectory.noisiness():.0%} of steps")


class LossLandscapePlot:
    """Left: trajectories over the loss contours. Right: full-dataset loss by epoch.

    The contours are drawn once; ``draw`` replaces only the runs, so a widget can redraw
    quickly. Pass a ``matplotlib.figure.Figure`` to draw off-screen (widgets do), or
    nothing to draw with pyplot (shown inline in a notebook). Use constrained layout,
    so that the title set by ``draw`` does not overlap the panels.
    """

    COLORS = plt.rcParams["axes.prop_cycle"].by_key()["color"]

    def __init__(self, problem, figure=None, start=START):
        self.problem = problem
        if figure is None:
            figure = plt.figure(figsize=(11, 4.2), layout="constrained")
        self.figure = figure
        self.landscape, self.curves = self.figure.subplots(1, 2)
        self.run_artists = []
        best = problem.best_params()
        start_loss = float(problem.loss(*start))
        self.best_loss = float(problem.loss(*best))

        # A window around the start and the minimum; runs that leave it are diverging.
        low, high = np.minimum(start, best), np.maximum(start, best)
        margin = 0.35 * (high - low)
        w, b = np.meshgrid(np.linspace(low[0] - margin[0], high[0] + margin[0], 160),
                           np.linspace(low[1] - margin[1], high[1] + margin[1], 160))
        levels = self.best_loss + np.geomspace(0.01, 2 * start_loss, 14)
        self.landscape.contour(w, b, problem.loss(w, b), levels=levels, colors="0.75",
                               linewidths=0.8)
        self.landscape.plot(*start, "ko", markersize=5)
        self.landscape.plot(*best, "k*", markersize=12)
        self.landscape.set(xlim=(w.min(), w.max()), ylim=(b.min(), b.max()), xlabel="w",
                           ylabel="b", title="parameters, step by step (o start, * minimum)")

        self.curves.axhline(self.best_loss, color="k", linestyle="--", linewidth=0.8,
                            label="best possible")
        self.curves.set(yscale="log", ylim=(0.8 * self.best_loss, 3 * start_loss),
                        xlabel="epoch (passes over the 64 samples)",
                        ylabel="loss over all samples", title="loss by epoch")
        self.curves.grid(alpha=0.3)

    def draw(self, trajectories, title=None):
        """Replace the runs shown by ``trajectories``; returns the figure."""
        for artist in self.run_artists:
            artist.remove()
        self.run_artists = []
        for i, run in enumerate(trajectories):
            color = self.COLORS[i % len(self.COLORS)]
            # Thousands of single-sample steps would hide the others at full opacity.
            alpha = 0.9 if run.steps < 200 else 0.5
            self.run_artists += self.landscape.plot(
                run.params[:, 0], run.params[:, 1], ".-", color=color, alpha=alpha,
                linewidth=1, markersize=3 if run.steps < 200 else 1, label=run.label)
            self.run_artists += self.curves.plot(run.epochs, run.losses, color=color,
                                                 alpha=alpha, linewidth=1.2, label=run.label)
        self.run_artists.append(self.curves.legend(fontsize="small", loc="upper right"))
        max_epochs = max(run.epochs[-1] for run in trajectories)
        self.curves.set_xlim(0, max(max_epochs, 1))
        self.figure.suptitle(title or "", fontsize="medium")
        return self.figure
