"""Notebook 07's figures, from ``experiments``' results (reads them; never measures)."""
import matplotlib.pyplot as plt

from workshop_lib import allreduce_model as allreduce
from workshop_lib.inside_ddp import timing

VARIANTS = {"local": "local (no averaging)", "naive": "naive (after backward)",
            "overlap": "overlap (per gradient)", "buckets": "buckets (25 MB)",
            "ddp": "PyTorch DDP"}


def _axes(ax, figsize=(6, 4)):
    return ax if ax is not None else plt.subplots(figsize=figsize)[1]


def _median_and_range(stats, scale=1.0):
    median = stats["median"] * scale
    return median, [[median - stats["min"] * scale], [stats["max"] * scale - median]]


def plot_step_times(results, ax=None):
    """Median step time of each way of averaging gradients; the bars span min to max."""
    ax = _axes(ax)
    timing = results["timing"]
    for y, name in enumerate(VARIANTS):
        median, span = _median_and_range(timing["step_ms"][name])
        ax.barh(y, median, xerr=span, capsize=3, color="tab:red" if name == "naive" else
                "tab:blue", alpha=0.8)
        ax.text(median, y + 0.3, f" {median:.1f}", fontsize="small")
    ax.set_yticks(range(len(VARIANTS)), list(VARIANTS.values()))
    ax.invert_yaxis()
    ax.set_xlabel("ms per step (median; bars: min to max)")
    ax.set_title(f"one step of the course CNN, {timing['world_size']} ranks, batch "
                 f"{timing['batch_size']} each")
    ax.grid(alpha=0.3, axis="x")
    return ax


def plot_allreduce(results, ax=None):
    """All-reduce time against message size, measured and as the fitted latency + bandwidth,
    with the course CNN's gradient size marked."""
    ax = _axes(ax)
    rows, fit, world_size = results["allreduce"], results["allreduce_fit"], \
        results["world_size"]
    sizes = [row["bytes"] for row in rows]
    for row in rows:
        median, span = _median_and_range(row["seconds"], 1000)
        ax.errorbar(row["bytes"], median, yerr=span, fmt="o", color="tab:blue", capsize=3)
    ax.plot(sizes, [1000 * allreduce.predicted_s(fit, world_size, [n]) for n in sizes],
            color="tab:orange", label=f"{1000 * fit['latency_s']:.2f} ms + bytes / "
                                      f"{allreduce.bandwidth_text(fit)} (fit)")
    ax.axvline(results["timing"]["gradient_bytes"], color="gray", linestyle="--",
               label="the CNN's gradients")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("ms per all-reduce")
    ax.set_title(f"one all-reduce, {world_size} ranks ({results['backend']})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return ax


def plot_bucket_sweep(results, ax=None):
    """Step time against bucket size, beside what the fitted all-reduce predicts (the
    local step plus the all-reduces one after the other: nothing overlapped)."""
    ax = _axes(ax)
    rows = timing.bucket_sweep_rows(results)
    local = results["timing"]["step_ms"]["local"]["median"]
    sizes = [row["bucket_bytes"] for row in rows]
    for row in rows:
        median, span = _median_and_range(results["timing"]["step_ms"][row["name"]])
        ax.errorbar(row["bucket_bytes"], median, yerr=span, fmt="o", color="tab:blue",
                    capsize=3)
        ax.annotate(f"{row['all_reduces']}", (row["bucket_bytes"], median),
                    textcoords="offset points", xytext=(5, 5), fontsize="small")
    ax.plot(sizes, [local + row["predicted_ms"] for row in rows], color="tab:orange",
            label="local + the fit's all-reduces, none overlapped")
    ax.axhline(local, color="gray", linestyle="--", label="local (no averaging)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bucket size (bytes); beside each point: all-reduces a step")
    ax.set_ylabel("ms per step (median; bars: min to max)")
    ax.set_title("the bucket-size sweep")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return ax


def plot_state_memory(results, ax=None):
    """Optimizer-state KiB on each rank: replicated, and sharded (ZeRO-1), SGD and Adam."""
    ax = _axes(ax)
    memory = results["zero1"]
    width = 0.8 / (1 + results["world_size"])
    for i, mem in enumerate(memory.values()):
        bars = [("replicated", mem["replicated"])] + [
            (f"ZeRO-1 rank {r}", b) for r, b in enumerate(mem["sharded"])]
        for j, (label, nbytes) in enumerate(bars):
            ax.bar(i + j * width, nbytes / 2**10, width, label=label if i == 0 else None,
                   color="tab:red" if j == 0 else plt.cm.Blues(0.5 + 0.4 * j / len(bars)))
    ax.set_xticks([i + width * results["world_size"] / 2 for i in range(len(memory))],
                  [{"sgd": "SGD, momentum", "adam": "Adam"}.get(n, n) for n in memory])
    ax.set_ylabel("optimizer state per rank (KiB)")
    ax.set_title("optimizer state, the course CNN")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize="small")
    return ax
