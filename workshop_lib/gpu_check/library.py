"""Every entry point of the course the GPU check calls, one small function each.

The check is written against today's commands and functions; when one changes its flags,
signature or return value, the fix is here, in a line, and the steps stay as they are.
Nothing here imports a training module at module level: the check's own process holds
only the standard library and torch.
"""
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONVERSION_SOLUTION = REPO / "workshop_lib" / "labs" / "files" / "conversion_solution.py"
CONVERSION_TARGET = 0.85  # the conversion lab's target_accuracy (labs/from_one_gpu_to_many.py)
LR_SCHEDULER_WARNING = "lr_scheduler.step()"  # PyTorch's "called before optimizer.step()"
GRAD_SCALER_INIT_SCALE = 2.0 ** 16  # torch.amp.GradScaler's default init_scale
DEVICE = "cuda"  # the device the steps' commands ask for (a CPU rehearsal asks for "cpu")
# notebook 07's "the same" bar, findings.inside_ddp.SAME_PARAMETERS (a test holds them equal):
# the check's process does not import the findings, which need more than torch
SAME_PARAMETERS = 1e-5
# the GPU profile's model and batch per device, profile.SIZES[("cuda", "fashion-mnist")] (a
# test holds them equal): notebook 07 times overlap, buckets and compile on them on GPUs
GPU_MODEL, GPU_BATCH = "wrn-16-4", 128


def torchrun(nproc, *target):
    """``torchrun --standalone --nproc-per-node=N TARGET...`` as ``python -m`` arguments
    (the torchrun of this Python, whatever PATH holds)."""
    return ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            *map(str, target)]


def inside_ddp(out_json, device=None):
    """Notebook 07's parts on one rank; torch.compile on a GPU only (minutes on a CPU). The
    step times on the GPU profile's model and batch, as 07 takes them on GPUs, on digits (no
    download needed); on the CPU, the CPU profile's CNN at batch 32."""
    device = device or DEVICE
    timed = ["--model", GPU_MODEL, "--batch-size", str(GPU_BATCH)] if device == "cuda" else []
    return torchrun(1, "-m", "workshop_lib.inside_ddp.experiments", "--one-rank", "--device",
                    device, "--compile", "1" if device == "cuda" else "0", "--rounds", "3",
                    "--dataset", "digits", *timed, "--out", str(out_json))


def doctor():
    return ["-m", "workshop_lib", "doctor"]


def equivalence(out_json, device=None):
    """Ranks against one process, with SyncBatchNorm on CUDA (issue 20, item 1)."""
    return ["-m", "workshop_lib.equivalence", "--device", device or DEVICE, "--out",
            str(out_json)]


def conversion(out_dir, epochs=3):
    """Notebook 02's reference conversion script (it picks CUDA where there is one)."""
    return [str(CONVERSION_SOLUTION), "--epochs", str(epochs), "--out", str(out_dir)]


def trace(out_dir, steps=3, warmup=2, device=None):
    return ["-m", "workshop_lib.trace", "--device", device or DEVICE, "--out", str(out_dir),
            "--steps", str(steps), "--warmup", str(warmup)]


def train(out_dir, *flags, epochs=4, batch_size=64, device=None):
    """A one-GPU run of the training script on digits."""
    return ["-m", "workshop_lib.train", "--device", device or DEVICE, "--dataset", "digits",
            "--model", "cnn", "--epochs", str(epochs), "--batch-size", str(batch_size),
            "--no-progress", "--out", str(out_dir), *flags]


def gpu_tests(*extra):
    return ["-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
            str(REPO / "tests" / "test_gpu.py"), *extra]


def bench_quick(out_json, one_gpu, device=None):
    shape = ["--device", device or DEVICE, "--nproc", "1"] if one_gpu else []
    return ["-m", "workshop_lib.bench", "--quick", *shape, "--out", str(out_json)]


def read_json(path):
    return json.loads(Path(path).read_text())


def final_record(out_dir):
    """The last epoch's record of a training run (val_acc, peak_memory_mib, ...)."""
    from workshop_lib import runlog

    return runlog.read(out_dir).final


def last_conversion_record(out_dir):
    """The conversion script's last line of log.jsonl (epoch, val_loss, val_acc)."""
    lines = (Path(out_dir) / "log.jsonl").read_text().splitlines()
    return json.loads(lines[-1]) if lines else None


def grad_scaler_scale(out_dir):
    """The fp16 GradScaler's scale in a run's checkpoint, or None."""
    from workshop_lib import checkpoint

    state = checkpoint.load(Path(out_dir) / "checkpoint.pt")
    scaler = state.get("scaler") or {}
    return scaler.get("scale")


def trace_step_prefix():
    from workshop_lib.trace.timeline import STEP_PREFIX

    return STEP_PREFIX


def largest_batch(model_name, dataset, grad_checkpointing, device=DEVICE):
    """``memory.largest_batch`` for a model on a dataset's image shape (no data loaded):
    ``(largest batch that fits, whether the search's cap stopped it, the cap)``."""
    from workshop_lib import data, memory, models, precision

    info = data.DATASETS[dataset]
    result = memory.largest_batch(lambda: models.build(model_name, info, grad_checkpointing),
                                  info, device, precision.PLAIN)
    if result is None:  # no GPU allocator to run out of
        return None, False, memory.SEARCH_CAP
    return result.batch, result.capped, result.cap
