"""Interactive controls for the notebooks. UI only: the computing lives in other modules."""
import io

import ipywidgets
import numpy as np
from matplotlib.figure import Figure

from workshop_lib import sgd_toy


class BatchSizeExplorer:
    """Batch size and learning rate sliders that redraw the SGD toy (notebook 01).

    Every change of a slider calls ``redraw``, which runs the toy for the sliders' values
    (next to full-batch gradient descent at the same learning rate, for reference) and
    renders the plot into an image widget. Nothing needs a browser: set a slider's
    ``value`` or call ``redraw()`` from Python, and read ``plot`` or ``image.value``.
    Show it by making it the last expression of a cell.
    """

    def __init__(self, problem, epochs=10, batch_size=8, lr=0.05, seed=0):
        self.problem, self.epochs, self.seed = problem, epochs, seed
        self.batch_size = ipywidgets.SelectionSlider(
            options=batch_size_choices(problem.n_samples), value=batch_size,
            description="batch size", continuous_update=False,
            style={"description_width": "initial"})
        # Up to twice the full-batch stability limit, so that divergence can be seen.
        self.lr = ipywidgets.FloatLogSlider(
            value=lr, base=10, min=-3, max=float(np.log10(2 * problem.max_stable_lr())),
            step=0.05, description="learning rate", readout_format=".3f",
            continuous_update=False, style={"description_width": "initial"})
        self.summary = ipywidgets.HTML()
        self.image = ipywidgets.Image(format="png")
        self.plot = sgd_toy.LossLandscapePlot(problem, figure=Figure(figsize=(11, 4.2),
                                                                     layout="constrained"))
        self.batch_size.observe(self._on_change, names="value")
        self.lr.observe(self._on_change, names="value")
        self.widget = ipywidgets.VBox([
            ipywidgets.HBox([self.batch_size, self.lr]), self.summary, self.image])
        self.redraw()

    def _on_change(self, change):
        self.redraw()

    def redraw(self):
        """Run the toy for the sliders' current values and show the result."""
        chosen = sgd_toy.sgd(self.problem, self.batch_size.value, self.lr.value, self.epochs,
                             self.seed)
        runs = [chosen]
        if chosen.batch_size < self.problem.n_samples:
            runs.insert(0, sgd_toy.sgd(self.problem, self.problem.n_samples, self.lr.value,
                                       self.epochs, self.seed))
        self.plot.draw(runs, title=f"{self.epochs} epochs at learning rate {self.lr.value:.3f}")
        self.summary.value = "<br>".join(sgd_toy.describe(run, self.problem) for run in runs)
        png = io.BytesIO()
        self.plot.figure.savefig(png, format="png", dpi=80)
        self.image.value = png.getvalue()

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)


def batch_size_choices(n_samples):
    """1, 2, 4, ... up to the full batch, which is always the last choice."""
    choices = [2 ** k for k in range(int(np.log2(n_samples)) + 1) if 2 ** k < n_samples]
    return [*choices, n_samples]
