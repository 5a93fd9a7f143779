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


def plot_scaling_vs_prediction(bench, ax=None):
    """Weak-scaling efficiency measured by ``python -m workshop_lib.bench`` beside the
    prediction from one process's step plus the all-reduce floor (``bench`` is its JSON)."""
    ax = _axes(ax)
    rows = [r for r in bench["scaling"] if r["mode"] == "weak" and r["world_size"] > 1]
    labels = [f"{r['config']}\nbatch {r['batch_size']}/proc, N={r['world_size']}" for r in rows]
    x = range(len(rows))
    measured = [r["efficiency"]["median"] for r in rows]
    errors = [[m - r["efficiency"]["min"] for m, r in zip(measured, rows, strict=True)],
              [r["efficiency"]["max"] - m for m, r in zip(measured, rows, strict=True)]]
    ax.bar([i - 0.2 for i in x], measured, width=0.4, yerr=errors, capsize=3,
           label="measured (median, min..max)")
    ax.bar([i + 0.2 for i in x], [r["predicted_efficiency"] for r in rows], width=0.4,
           label="predicted from the all-reduce floor")
    ax.axhline(1.0, color="gray", linestyle="--")
    ax.set_xticks(list(x), labels, fontsize="small")
    ax.set_ylabel("scaling efficiency (speed-up / N)")
    ax.set_title("weak scaling: measured vs the bandwidth floor")
    ax.legend(fontsize="small")
    return ax


def plot_allreduce_bandwidth(bench, ax=None):
    """All-reduce bus bandwidth against message size, one line per world size."""
    ax = _axes(ax)
    for world_size, points in bench["communication"]["allreduce"].items():
        ax.plot([p["bytes"] for p in points],
                [p["bus_bandwidth_gb_s"]["median"] for p in points], marker="o",
                label=f"{world_size} ranks ({bench['setup']['backend']})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title("all-reduce bandwidth")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return ax


def plot_accuracy_vs_time(groups, ax=None, title="validation accuracy against training time"):
    """One colour per group of runs (``{label: [Run, ...]}``, e.g. the seeds of one set-up):
    validation accuracy after each epoch against the training time so far (``epoch_s``
    summed: evaluation and start-up left out, as time to accuracy counts them)."""
    ax = _axes(ax)
    for colour, (label, runs) in zip(plt.rcParams["axes.prop_cycle"].by_key()["color"],
                                     groups.items(), strict=False):
        for i, run in enumerate(runs):
            seconds, total = [], 0.0
            for epoch_s in run.column("epoch_s"):
                total += epoch_s
                seconds.append(total)
            ax.plot(seconds, run.column("val_acc"), marker="o", markersize=3, color=colour,
                    alpha=0.8, label=label if i == 0 else None)
    ax.set_xlabel("training time (s)")
    ax.set_ylabel("validation accuracy")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return ax


def plot_step_timeline(summary, steps=3, ax=None):
    """Per rank, its first ``steps`` profiled steps as a timeline: the training's compute
    on one row, its all-reduces below it, the exposed part of each all-reduce (no compute
    beside it: the step waited) highlighted. ``summary``: ``workshop_lib.trace``'s
    summary.json, as a dict."""
    from matplotlib.patches import Patch

    ranks = summary["ranks"]
    ax = _axes(ax, figsize=(10, 1.2 + 0.9 * len(ranks)))
    colours = {"compute": "tab:blue", "communication": "tab:orange", "exposed": "tab:red"}
    for row, rank in enumerate(ranks):
        y = len(ranks) - 1 - row  # rank 0 on top
        for step in rank["steps"][:steps]:
            for kind, (offset, height) in (("compute", (0.05, 0.4)),
                                           ("communication", (-0.4, 0.35)),
                                           ("exposed", (-0.4, 0.35))):
                bars = [(step["start_ms"] + s, e - s) for s, e in step["intervals"][kind]]
                ax.broken_barh(bars, (y + offset, height), color=colours[kind],
                               linewidth=0)
            ax.axvline(step["start_ms"], color="gray", linewidth=0.5, linestyle=":")
    ax.set_yticks(range(len(ranks)), [f"rank {r['rank']}" for r in reversed(ranks)])
    ax.set_ylim(-0.6, len(ranks) + 0.1)  # room above the top rank for the legend
    ax.set_xlabel("ms since the first profiled step (dotted: each step's start)")
    setup = summary["setup"]
    ax.set_title(f"where a step's time goes: {setup['model']}, batch {setup['batch_size']} "
                 f"per rank, {setup['world_size']} ranks ({setup['backend']})")
    ax.legend(handles=[Patch(color=colours["compute"], label="compute"),
                       Patch(color=colours["communication"], label="all-reduce, hidden"),
                       Patch(color=colours["exposed"], label="all-reduce, exposed")],
              fontsize="small", loc="upper right", ncols=3)
    return ax


def draw_ddp_step(buckets, world_size, model_name, ax=None):
    """What DDP does in one step, per rank (``ddp_step.buckets`` gives ``buckets``): the
    broadcast at the wrap (once), forward, backward in the order of its buckets, one
    all-reduce per bucket started when that bucket's gradients are ready, then the same
    optimizer step on every rank. Lengths are schematic (backward drawn twice forward,
    each bucket's share by its gradients' size); notebook 05's trace measures real ones."""
    rows = min(world_size, 4)  # more ranks look the same: draw four
    ax = _axes(ax, figsize=(11, 1.0 + 0.9 * rows))
    total = sum(b.numel for b in buckets)
    forward, backward, step, comm_per_unit = 1.0, 2.0, 0.35, 1.2
    t0 = 0.9  # after the broadcast
    ready = []  # when each bucket's last gradient is ready
    t = t0 + forward
    for b in buckets:
        t += backward * b.numel / total
        ready.append(t)
    comm = []
    free = 0.0  # all-reduces run one after another, in bucket order
    for b, r in zip(buckets, ready, strict=True):
        start = max(r, free)
        comm.append((start, comm_per_unit * b.numel / total))
        free = start + comm[-1][1]
    step_start = max(ready[-1], free)
    for row in range(rows):
        y = rows - 1 - row
        rank = row if row < rows - 1 or world_size <= rows else world_size - 1
        ax.broken_barh([(0, 0.8)], (y + 0.1, 0.35), color="tab:purple")
        ax.broken_barh([(t0, forward)], (y + 0.1, 0.35), color="tab:green")
        edges = [t0 + forward, *ready]
        ax.broken_barh([(s, e - s) for s, e in zip(edges, edges[1:], strict=False)],
                       (y + 0.1, 0.35), color="tab:blue", edgecolor="white", linewidth=1)
        ax.broken_barh(comm, (y - 0.35, 0.35), color="tab:orange", edgecolor="white",
                       linewidth=1)
        ax.broken_barh([(step_start, step)], (y + 0.1, 0.35), color="tab:gray")
        ax.text(-0.1, y + 0.05, f"rank {rank}", ha="right", va="center")
    top = rows - 0.45
    ax.text(0.4, top, "broadcast\nat the wrap", ha="center", va="bottom", fontsize="small")
    ax.text(t0 + forward / 2, top, "forward", ha="center", va="bottom", fontsize="small")
    ax.text(t0 + forward + backward / 2, top, "backward", ha="center", va="bottom",
            fontsize="small")
    for i, (start, width) in enumerate(comm):
        ax.text(start + width / 2, -0.55, f"all-reduce\nbucket {i + 1}", ha="center",
                va="top", fontsize="x-small")
    ax.text(step_start + step / 2, top, "same\nstep", ha="center", va="bottom",
            fontsize="small")
    ax.set_xlim(-1.0, step_start + step + 0.3)
    ax.set_ylim(-1.2, rows + 0.3)
    ax.set_yticks([])
    ax.set_xticks([])
    overlap = "overlap the rest of backward" if len(buckets) > 1 else \
        "can start only when backward ends (one bucket: nothing to overlap)"
    ax.set_title(f"one DDP step of {model_name} on {world_size} ranks: {len(buckets)} "
                 f"gradient bucket{'s' if len(buckets) > 1 else ''}; the all-reduces "
                 f"{overlap}", fontsize="medium")
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    return ax


def draw_hung_job(waiting, script, ax=None):
    """Who waits where in a hung job: one row per rank, the line of ``script`` it waits in
    (``waiting``: ``{rank: stacks.where_waiting(...)}``, from the job's own dump) and the
    call it made there. Ranks in different calls wait for each other for ever: every
    collective needs every rank, in the same order."""
    ranks = sorted(waiting)
    ax = _axes(ax, figsize=(10, 0.9 + 0.8 * len(ranks)))
    calls = {w["calls"] for w in waiting.values() if w}
    for row, rank in enumerate(ranks):
        y = len(ranks) - 1 - row
        where = waiting[rank]
        ax.broken_barh([(0, 1)], (y - 0.3, 0.6), color="tab:blue")
        ax.text(0.5, y, f"rank {rank}", ha="center", va="center", color="white")
        label = (f"waits in {where['calls']}()  ({script}:{where['line']}: {where['code']})"
                 if where else f"not in {script}")
        ax.broken_barh([(1.1, 5.9)], (y - 0.3, 0.6), color="tab:red" if len(calls) > 1
                       else "tab:orange", alpha=0.25)
        ax.text(1.2, y, label, ha="left", va="center", family="monospace", fontsize="small")
    ax.set_xlim(0, 7.2)
    ax.set_ylim(-0.6, len(ranks) - 0.4)
    ax.set_xticks([])
    ax.set_yticks([])
    verdict = (f"{len(calls)} different calls: each rank waits for the others in a "
               f"collective they never enter, until the timeout" if len(calls) > 1 else
               "every rank in the same call" if ranks else
               "no rank's stack was read (the job ended first): start it again")
    ax.set_title(f"where each rank of the hung job waits (its own stack dump): {verdict}",
                 fontsize="medium")
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    return ax


def plot_step_noise(rules, lr, ref_batch, batches, ax=None):
    """Notebook 03's picture of the rules: for each learning-rate rule (``scaling``'s
    names), how noisy one step is and how much noise an epoch adds up, relative to the
    reference batch, as the batch grows. A step's noise is the rate times the per-sample
    spread over sqrt(batch), its variance rate^2 / batch; an epoch takes N / batch steps, so
    the variance it adds up goes as rate^2 / batch^2. ``rules``: ``{rule: scaled_lr(batch)}``."""
    ax = _axes(ax, figsize=(6, 4))
    for rule, rate in rules.items():
        step = [rate(b) / lr * (ref_batch / b) ** 0.5 for b in batches]
        epoch = [(rate(b) / lr) ** 2 * (ref_batch / b) ** 2 for b in batches]
        line, = ax.plot(batches, step, marker="o", markersize=3, label=f"{rule}: one step")
        ax.plot(batches, epoch, linestyle="--", color=line.get_color(),
                label=f"{rule}: one epoch (variance)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("global batch")
    ax.set_ylabel(f"noise relative to batch {ref_batch}")
    ax.set_title("how noisy a step, and an epoch, is under each rule")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small")
    return ax


PROGRESS_COLOURS = {"PASS": "tab:green", "NOT YET": "tab:orange", "none": "lightgray"}


def plot_progress(rows, ax=None):
    """Notebook 08's picture of the learner's day: one bar per exercise (``rows``: dicts with
    "key", "notebook" (its number), "checks" and "state": "PASS", "NOT YET" or "none"), as
    long as the checks it took, coloured by where it stands; an exercise never checked
    shows as a short grey stub."""
    ax = _axes(ax, figsize=(7, 0.35 * len(rows) + 1.2))
    labels = [f"{row['notebook']} {row['key']}" for row in rows][::-1]
    lengths = [max(row["checks"], 0.15) for row in rows][::-1]
    colours = [PROGRESS_COLOURS[row["state"]] for row in rows][::-1]
    ax.barh(labels, lengths, color=colours)
    for state, colour in PROGRESS_COLOURS.items():
        ax.barh([labels[0]] if labels else [""], [0], color=colour,
                label="never checked" if state == "none" else state)
    ax.set_xlabel("checks you ran")
    ax.set_title("your exercises today: how often you checked each, and where it stands")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3, axis="x")
    ax.legend(fontsize="small", loc="lower right")
    return ax
