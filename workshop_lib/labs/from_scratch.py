"""Notebook 02, "DDP from two collectives": the learner writes the wrapper's communication.

The learner's ``NaiveDataParallel`` (a ``%%writefile`` cell) must broadcast rank 0's
parameters and buffers when it wraps a model, and replace every gradient by its mean over
the ranks in ``sync_gradients``. The check launches ``workshop_lib.naive_ddp`` with the
learner's file on two gloo processes: each rank starts from a *different* random
initialisation, trains 20 steps with the learner's wrapper and with PyTorch's
DistributedDataParallel on the same batches, and the two must agree within float32
rounding.
"""
import io
import tempfile
from pathlib import Path

from workshop_lib import launch, runlog
from workshop_lib.labs import Exercise, Verdict, register

FILES = Path(__file__).resolve().parent / "files"
STEPS, TOLERANCE = 20, 1e-5


def check(path):
    path = Path(path)
    if not path.is_file():
        return Verdict(False, f"{path} does not exist: run the %%writefile cell first")
    out = Path(tempfile.mkdtemp(prefix="lab-from-scratch-")) / "result.json"
    result = launch.run(["-m", "workshop_lib.naive_ddp", "--wrapper", str(path.resolve()),
                         "--steps", str(STEPS), "--out", str(out)],
                        nproc=2, timeout=120, quiet=True, stream=io.StringIO(),
                        env={"CUDA_VISIBLE_DEVICES": ""})
    if not result.ok:
        return Verdict(False, f"the check's job failed: {result.error or result.summary()}")
    difference = runlog.load_json(out)["max_abs_difference"]
    if difference > TOLERANCE:
        return Verdict(False, f"after {STEPS} steps your wrapper's model differs from DDP's by "
                              f"{difference:.2e} (more than float32 rounding, "
                              f"{TOLERANCE:.0e}): every rank must start from rank 0's "
                              f"parameters (dist.broadcast) and step with the mean gradient "
                              f"(dist.all_reduce, then divide by the world size)",
                       {"difference": difference})
    return Verdict(True, f"your wrapper trains exactly as DDP does: largest difference after "
                         f"{STEPS} steps {difference:.1e}, from different starting weights "
                         f"on each rank", {"difference": difference})


def write(text, path=None):
    path = Path(path) if path else Path(tempfile.mkdtemp(prefix="lab-")) / "my_naive_ddp.py"
    path.write_text(text)
    return path


def stub(path=None):
    return write((FILES / "from_scratch_stub.py").read_text(), path)


def solution(path=None):
    """The library's own wrapper (workshop_lib/naive_ddp.py) is the reference."""
    from workshop_lib import naive_ddp

    return write(Path(naive_ddp.__file__).read_text(), path)


register(Exercise("from_scratch", "02_from_one_gpu_to_many",
                  "write DDP's communication from two collectives",
                  check=check, stub=stub, solution=solution,
                  stub_reason="NotImplementedError"))
