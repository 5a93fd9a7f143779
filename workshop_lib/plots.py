"""Plots of run records. Reads run.jsonl files (via ``runlog``); never trains anything."""
import matplotlib.pyplot as plt


def _axes(ax, figsize=(6, 4)):
    return ax if ax is not None else plt.subplots(figsize=figsize)[1]


def plot_metric(runs, metric="val_acc", ax=None, title=None, ylabel=None):
    """One line per run: ``metric`` against epoch. ``runs`` maps a label to a Run."""
    ax = _axes(ax)
    for label, run in runs.items():
        ax.plot(run.column("epoch"), run.column(metric), marker="o", markersize=3, label=label)
    ax.set_xlabel("epoch")
    ax.set_ylabel(ylabel or metric)
    ax.set_title(title or f"{metric} by epoch")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return ax


def plot_final_vs(runs, x, y, ax=None, logx=False, title=None, xlabel=None, ylabel=None,
                  reduce=max):
    """One point per run: its start-record value ``x`` against ``reduce`` of epoch metric ``y``.

    ``reduce=max`` over samples/s ignores the first, warm-up epoch's lower figure.
    """
    ax = _axes(ax)
    points = sorted((run.start[x], reduce(run.column(y))) for run in runs.values())
    ax.plot([p[0] for p in points], [p[1] for p in points], marker="o")
    if logx:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel or x)
    ax.set_ylabel(ylabel or y)
    ax.set_title(title or f"{y} vs {x}")
    ax.grid(alpha=0.3)
    return ax


def plot_bars(labels, values, ax=None, title=None, ylabel=None, reference=None,
              reference_label=None):
    """A bar per label, optionally with a horizontal reference line (e.g. ideal scaling)."""
    ax = _axes(ax)
    bars = ax.bar(labels, values)
    ax.bar_label(bars, fmt="%.2f")
    if reference is not None:
        ax.axhline(reference, color="gray", linestyle="--", label=reference_label)
        ax.legend(fontsize="small")
    ax.set_title(title or "")
    ax.set_ylabel(ylabel or "")
    return ax
