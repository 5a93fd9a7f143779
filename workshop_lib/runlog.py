"""The run record: one JSON object per line in ``<out>/run.jsonl``, and the console table.

Line 1 (``"event": "start"``): the arguments, derived quantities (world size, per-device
and global batch, steps per epoch, learning rate) and the software and hardware.
Then one ``"event": "epoch"`` line per epoch, and a final ``"event": "end"`` line.
Notebooks, plots and tests read this file (``read``), never the console output.

An epoch record holds the losses, the validation accuracy, the learning rate, the global
batch, samples/s, the epoch's time (training only), the bytes a step saved for backward
and, on GPUs, the peak memory. Beside it, ``<out>/checkpoint.pt`` (``checkpoint.py``):
written atomically by rank 0 only, it loads into the plain model and names the torchrun
job that wrote it; ``--resume`` continues a run from it, and the DDP script does so by
itself after an elastic restart, from its own job's checkpoint only.
"""
import json
from dataclasses import dataclass, field
from pathlib import Path

from workshop_lib import files, hardware

RUN_LOG_NAME = "run.jsonl"
TABLE_COLUMNS = (  # (record key, heading, number format); each column as wide as its heading
    ("epoch", "epoch", "d"),
    ("train_loss", "train_loss", ".4f"),
    ("val_loss", "val_loss", ".4f"),
    ("val_acc", "val_acc", ".4f"),
    ("lr", "lr      ", ".4g"),
    ("samples_per_s", "samples/s", ".0f"),
    ("epoch_s", "epoch_s", ".2f"),
)


class RunLog:
    """Writes ``run.jsonl`` and the console table; ``enabled=False`` (ranks > 0) does neither."""

    def __init__(self, out_dir, enabled=True, append=False):
        self.path = Path(out_dir) / RUN_LOG_NAME
        self.enabled = enabled
        if enabled and not append:
            self.path.write_text("")

    def write(self, event, **record):
        if self.enabled:
            with self.path.open("a") as f:
                f.write(json.dumps({"event": event, **record}) + "\n")

    def start(self, script, args, **derived):
        """Record and print the run's set-up: the quantities a reader needs to interpret it."""
        if not self.enabled:  # rank 0 describes the hardware, once per job: nvidia-smi twice
            return
        self.write("start", script=script, args={k: str(v) for k, v in vars(args).items()},
                   **derived, hardware=hardware.describe())
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in derived.items()))
        print(" ".join(f"{heading.strip():>{len(heading)}}" for _, heading, _ in TABLE_COLUMNS),
              flush=True)

    def epoch(self, record):
        self.write("epoch", **record)
        if self.enabled:
            print(" ".join(f"{record[key]:>{len(heading)}{fmt}}"
                           for key, heading, fmt in TABLE_COLUMNS), flush=True)

    def end(self, reason, record, elapsed_s):
        """``record``: the last epoch's, or None if a resumed run had nothing left to do."""
        if record is None:
            reason = "nothing left to train: the checkpoint is from the last epoch"
            logged = read(self.path).epochs if self.path.exists() else []
            record = logged[-1] if logged else {"epoch": 0, "val_acc": 0.0}
        self.write("end", reason=reason, epochs=record["epoch"], val_acc=record["val_acc"],
                   elapsed_s=elapsed_s)
        if self.enabled:
            print(f"done: {reason}; val_acc={record['val_acc']:.4f}; run log {self.path}",
                  flush=True)


@dataclass
class Run:
    start: dict
    epochs: list = field(default_factory=list)
    end: dict | None = None
    resumes: list = field(default_factory=list)  # start records of resumed attempts

    @property
    def final(self):
        """The last epoch's record."""
        return self.epochs[-1]

    @property
    def best_val_acc(self):
        return max(e["val_acc"] for e in self.epochs)

    def column(self, name):
        return [e[name] for e in self.epochs]

    @property
    def samples_per_s(self):
        """Median training throughput, leaving out epoch 1 (start-up, allocation) if it can."""
        values = sorted(self.column("samples_per_s")[1:] or self.column("samples_per_s"))
        middle = len(values) // 2
        return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def read(path, missing_ok=False):
    """Read a run record (a ``run.jsonl`` file or the folder holding one); None for a
    missing one if ``missing_ok`` (a job that failed before it wrote anything)."""
    path = Path(path)
    if path.is_dir() or not path.suffix:
        path = path / RUN_LOG_NAME
    if missing_ok and not path.is_file():
        return None
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    run = Run(start=records[0])
    by_epoch = {}
    for record in records[1:]:
        if record["event"] == "epoch":
            # A resumed run may repeat epochs trained after its checkpoint: the last counts.
            by_epoch[record["epoch"]] = record
        elif record["event"] == "end":
            run.end = record
        elif record["event"] == "start":
            run.resumes.append(record)
            run.end = None
    run.epochs = [by_epoch[e] for e in sorted(by_epoch)]
    return run


def read_all(folder):
    """Every run under ``folder`` (each subfolder holding a run.jsonl), by subfolder name."""
    return {p.parent.name: read(p) for p in sorted(Path(folder).glob(f"*/{RUN_LOG_NAME}"))}


def time_to_accuracy(run, target):
    """Seconds of training until validation accuracy first reached ``target`` (None: never).

    Counts training time only (``epoch_s``), the quantity that scales with the hardware.
    """
    seconds = 0.0
    for epoch in run.epochs:
        seconds += epoch["epoch_s"]
        if epoch["val_acc"] >= target:
            return seconds
    return None


def format_table(rows, columns):
    """A fixed-width text table of dicts; ``columns`` maps key -> (heading, format spec)."""
    widths = {k: max(len(h), *(len(format(r[k], f)) for r in rows)) for k, (h, f) in
              columns.items()}
    lines = [" ".join(f"{h:>{widths[k]}}" for k, (h, _) in columns.items())]
    lines += [" ".join(f"{format(r[k], f):>{widths[k]}}" for k, (_, f) in columns.items())
              for r in rows]
    return "\n".join(lines)


def save_json(path, value):
    """Write ``value`` (plain data: a notebook's results) as JSON, whole or not at all."""
    with files.atomic(path, "w") as f:
        json.dump(value, f, indent=1)


def load_json(path):
    return json.loads(Path(path).read_text())
