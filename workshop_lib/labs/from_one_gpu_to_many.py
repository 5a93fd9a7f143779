"""Notebook 02, From one GPU to many with DDP: its three exercises.

**sampler** (section "What does each rank see?"). The learner writes down, before running
anything, properties a person can predict from how the sampler works (shard size,
disjoint shards, together all samples, a new split with set_epoch, padding); the check
computes each from the real sampler (``data.shards_by_epoch``) and says which predictions
were off, and why.

**conversion** (section "Make it a DDP job"). The learner's ``%%writefile`` cell starts
as ``files/conversion_stub.py``: a small CNN on the course's digits, written with a
``Trainer`` class (a different script from the assessment's, so that solving one does not
solve the other). The check runs it the way the assessment grades: the assessment's own
engine (``ddp_checks`` and ``ddp_recorder``, from ``assessment/release``) launches it
under torchrun, records what each rank did, and judges each requirement from that:
disjoint shards that cover the data, reshuffled each epoch; gradients averaged (each
rank's parameters after the first steps equal one process's replay on the global batch);
only rank 0 prints and writes; the checkpoint loads into the plain model; the logged
metrics are the global ones; it learns. (The learning-rate rule is notebook 03's subject,
so it is not judged here.) The job runs on the notebook's processes and device: its
profile's ``nproc`` and ``ddp_device``, which ``notebook.setup`` exports as ``NPROC`` and
``DDP_DEVICE``.

**from_scratch** (section "DDP from two collectives"). The learner's
``NaiveDataParallel`` (a ``%%writefile`` cell) must broadcast rank 0's parameters and
buffers when it wraps a model, and replace every gradient by its mean over the ranks in
``sync_gradients``. The check launches ``workshop_lib.naive_ddp`` with the learner's file
on two gloo processes: each rank starts from a *different* random initialisation, trains
20 steps with the learner's wrapper and with PyTorch's DistributedDataParallel on the
same batches, and the two must agree within float32 rounding. The job
(``labs/_from_scratch_job.py``) also counts the ``torch.distributed`` collectives the
learner's class calls while it wraps and while it syncs, and sees whether it builds a
DistributedDataParallel: a class that hands the model to torch's DDP matches DDP exactly,
and is refused.
"""
import contextlib
import importlib.util
import io
import os
import tempfile
from pathlib import Path

from workshop_lib import data, launch, runlog
from workshop_lib.labs import Exercise, Verdict, register

FILES = Path(__file__).resolve().parent / "files"

# -- sampler -------------------------------------------------------------------------------

N, WORLD = 10, 2          # the question's dataset size and ranks
N_PADDED, WORLD_PADDED = 10, 3
N_IN_ORDER, WORLD_IN_ORDER, RANK_IN_ORDER = 11, 4, 3  # the worked-out question

QUESTIONS = {
    "shard_size": f"how many of the {N} samples rank 1 trains on per epoch, with {WORLD} ranks",
    "disjoint": "do rank 0's and rank 1's shards of one epoch share no sample? (True/False)",
    "covers_everything": f"together, do the two shards hold all {N} samples? (True/False)",
    "new_split_with_set_epoch": "with set_epoch(1), does rank 1 get other samples than in "
                                "epoch 0? (True/False)",
    "repeats_without_set_epoch": "without set_epoch, is epoch 1 exactly epoch 0 again? "
                                 "(True/False)",
    "padding_samples": f"with {N_PADDED} samples on {WORLD_PADDED} ranks, how many samples "
                       f"does the sampler hand out twice in one epoch?",
    "last_rank_in_order": f"with {N_IN_ORDER} samples on {WORLD_IN_ORDER} ranks and "
                          f"shuffle=False, the list of indices rank {RANK_IN_ORDER} gets "
                          f"(apply all three rules)",
}
WHY = {
    "shard_size": "each rank gets ceil(N / world_size) indices",
    "disjoint": "rank r takes every world_size-th index of one shared permutation, from r",
    "covers_everything": "the interleaved slices of one permutation hold every index",
    "new_split_with_set_epoch": "set_epoch(e) seeds the permutation with seed + e",
    "repeats_without_set_epoch": "without set_epoch the permutation is seeded the same way "
                                 "every epoch",
    "padding_samples": "the sampler pads to a multiple of world_size by repeating the first "
                       "indices: ceil(10 / 3) * 3 - 10 of them",
    "last_rank_in_order": f"unshuffled, the list 0..{N_IN_ORDER - 1} is padded with its first "
                          f"indices to a multiple of {WORLD_IN_ORDER}, and rank "
                          f"{RANK_IN_ORDER} takes every {WORLD_IN_ORDER}th from position "
                          f"{RANK_IN_ORDER}",
}


def truth():
    """Every answer, computed from the real DistributedSampler."""
    with_epoch = data.shards_by_epoch(N, WORLD, epochs=2, set_epoch=True)
    without = data.shards_by_epoch(N, WORLD, epochs=2, set_epoch=False)
    padded = data.shards_by_epoch(N_PADDED, WORLD_PADDED, epochs=1)[0]
    rank0, rank1 = with_epoch[0]
    handed_out = [i for shard in padded for i in shard]
    return {
        "shard_size": len(rank1),
        "disjoint": not set(rank0) & set(rank1),
        "covers_everything": set(rank0) | set(rank1) == set(range(N)),
        "new_split_with_set_epoch": set(with_epoch[1][1]) != set(rank1),
        "repeats_without_set_epoch": without[1] == without[0],
        "padding_samples": len(handed_out) - len(set(handed_out)),
        "last_rank_in_order": data.shards_by_epoch(N_IN_ORDER, WORLD_IN_ORDER, epochs=1,
                                                   shuffle=False)[0][RANK_IN_ORDER],
    }


def sampler_stub():
    return dict.fromkeys(QUESTIONS)


def sampler_solution():
    return truth()


def _as_compared(answer):
    """A list of indices may be written as a tuple too."""
    return list(answer) if isinstance(answer, tuple) else answer


def check_sampler(answers):
    if not isinstance(answers, dict):
        return Verdict(False, "my_answers should be the dict of the cell above, with your "
                              "answers in place of None")
    expected = truth()
    missing = [key for key in QUESTIONS if answers.get(key) is None]
    if missing:
        return Verdict(False, f"answer every question first: {', '.join(missing)} still None "
                              f"({QUESTIONS[missing[0]]})")
    wrong = [key for key in QUESTIONS if _as_compared(answers[key]) != expected[key]]
    if wrong:
        reasons = "; ".join(f"{key}: you said {answers[key]!r}, the sampler gives "
                            f"{expected[key]!r} ({WHY[key]})" for key in wrong)
        return Verdict(False, f"{len(wrong)} of {len(QUESTIONS)} predictions were off: "
                              f"{reasons}", {"wrong": wrong})
    return Verdict(True, f"all {len(QUESTIONS)} predictions match what the sampler did")


register(Exercise("sampler", "02_from_one_gpu_to_many", "predict DistributedSampler's shards",
                  writes="my_answers: seven predictions of what each rank's sampler hands out",
                  check=check_sampler, stub=sampler_stub, solution=sampler_solution,
                  stub_reason="answer every question"))


# -- conversion ----------------------------------------------------------------------------

ENGINE = Path(__file__).resolve().parents[2] / "assessment" / "release" / "ddp_refactor"
DATA_MODULE_ENV = "DDP_RECORDER_DATA_MODULE"  # which module's load_data() the recorder watches
JUDGED = ("runs_and_reaches_target_accuracy", "shards_disjoint_and_cover",
          "shards_reshuffled_each_epoch", "gradients_averaged_over_ranks",
          "rank0_only_logs_and_writes", "checkpoint_loads_into_plain_model",
          "validation_metrics_are_global")
# The check's run (the engine's Config). A small batch per process keeps enough optimizer
# steps at 8 ranks (4 epochs: 92 steps) for the reference, which keeps --lr unscaled, and
# for the linear and square-root rules alike: tests/test_assessment_sizing.py simulates
# them on 1, 2, 4 and 8 ranks over seeds and prints the margins. No speed-up run: the
# exercise is the conversion, the speed-up the assessment's.
RUN = {"epochs": 4, "batch_size": 8, "lr": 0.02, "seed": 0, "target_accuracy": 0.85,
       "time_limit_s": 180, "measure_speedup": False}


def engine():
    """The assessment's kernel-side checks (ddp_checks.py of the release)."""
    spec = importlib.util.spec_from_file_location("lab_ddp_checks", ENGINE / "ddp_checks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def layout(nproc=None, device=None):
    """``(processes, on_gpu)`` of the conversion check's job: ``nproc`` and ``device``
    ("cuda" or "cpu") where given, else the notebook's profile (``NPROC`` and
    ``DDP_DEVICE``, exported by ``notebook.setup``), else the course's choice for this
    machine."""
    nproc = nproc or os.environ.get("NPROC")
    device = device or os.environ.get("DDP_DEVICE")
    if not nproc or not device:
        from workshop_lib import profile

        chosen = profile.get_profile("auto", launches=profile.PROCESSES)
        nproc, device = nproc or chosen.nproc, device or chosen.ddp_device
    if int(nproc) < 2:  # one process proves nothing of sharding or averaging: two CPU ranks
        return 2, False
    return int(nproc), device == "cuda"


def check_conversion(path, nproc=None, device=None):
    path = Path(path).resolve()
    if not path.is_file():
        return Verdict(False, f"{path.name} does not exist: run the %%writefile cell first")
    checks = engine()
    checks.RUN_DIR = Path(tempfile.mkdtemp(prefix="lab-conversion-"))
    os.environ[DATA_MODULE_ENV] = "workshop_lib.labs.conversion_data"  # the recorder's
    processes, on_gpu = layout(nproc, device)
    with contextlib.redirect_stdout(io.StringIO()):
        run = checks.launch(str(path), checks.Config(**RUN), processes, on_gpu)
    results = {}
    for grade_id in JUDGED:
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                getattr(checks, f"check_{grade_id}")(run)
            results[grade_id] = None
        except checks.RequirementNotMet as reason:
            results[grade_id] = str(reason)
    for grade_id, reason in results.items():
        print(f"  {'PASS' if reason is None else 'NOT YET'}  {grade_id}"
              + ("" if reason is None else f": {reason}"))
    missed = [grade_id for grade_id, reason in results.items() if reason is not None]
    if missed:
        return Verdict(False, f"{len(missed)} of {len(JUDGED)} requirements not met yet, "
                              f"first {missed[0]}: {results[missed[0]]}", {"results": results})
    return Verdict(True, f"all {len(JUDGED)} requirements met: your script is a correct DDP "
                         f"job ({checks.where(run.nproc, run.on_gpu)}, {run.elapsed_s:.0f} s)",
                   {"results": results})


def copy_conversion(name, path=None):
    path = Path(path) if path else Path(tempfile.mkdtemp(prefix="lab-")) / "my_train_ddp.py"
    path.write_text((FILES / name).read_text())
    return path


register(Exercise("conversion", "02_from_one_gpu_to_many", "make a single-device script DDP",
                  writes="my_train_ddp.py: the single-device script, made a DDP job",
                  check=check_conversion,
                  stub=lambda path=None: copy_conversion("conversion_stub.py", path),
                  solution=lambda path=None: copy_conversion("conversion_solution.py", path),
                  stub_reason="requirements not met yet"))


# -- from_scratch --------------------------------------------------------------------------

FROM_SCRATCH_STEPS, FROM_SCRATCH_TOLERANCE = 20, 1e-5


def check_from_scratch(path):
    path = Path(path)
    if not path.is_file():
        return Verdict(False, f"{path} does not exist: run the %%writefile cell first")
    out = Path(tempfile.mkdtemp(prefix="lab-from-scratch-")) / "result.json"
    result = launch.run(["-m", "workshop_lib.labs._from_scratch_job", "--wrapper",
                         str(path.resolve()), "--steps", str(FROM_SCRATCH_STEPS),
                         "--out", str(out)],
                        nproc=2, timeout=120, quiet=True, stream=io.StringIO(),
                        env={"CUDA_VISIBLE_DEVICES": ""})
    if not result.ok:
        return Verdict(False, f"the check's job failed: {result.error or result.summary()}")
    said = runlog.load_json(out)
    # The wrapper's own code must do the communication: one that hands the model to
    # torch's DDP trains exactly as DDP does, and has written nothing.
    if any(said["ddp_built"].values()):
        return Verdict(False, "your NaiveDataParallel builds a DistributedDataParallel: the "
                              "exercise is to write its communication yourself, with "
                              "dist.broadcast when wrapping and dist.all_reduce in "
                              "sync_gradients", said)
    for phase, where, what in (("wrap", "when it wraps the model (__init__)",
                                "rank 0's parameters and buffers (dist.broadcast)"),
                               ("sync", "in sync_gradients",
                                "every gradient's sum over the ranks (dist.all_reduce)")):
        if not said["collectives"][phase]:
            return Verdict(False, f"your NaiveDataParallel calls no torch.distributed "
                                  f"collective {where}: it must send {what} itself", said)
    difference = said["max_abs_difference"]
    if difference > FROM_SCRATCH_TOLERANCE:
        return Verdict(False, f"after {FROM_SCRATCH_STEPS} steps your wrapper's model differs "
                              f"from DDP's by {difference:.2e} (more than float32 rounding, "
                              f"{FROM_SCRATCH_TOLERANCE:.0e}): every rank must start from rank "
                              f"0's "
                              f"parameters (dist.broadcast) and step with the mean gradient "
                              f"(dist.all_reduce, then divide by the world size)",
                       {"difference": difference})
    return Verdict(True, f"your wrapper trains exactly as DDP does: largest difference after "
                         f"{FROM_SCRATCH_STEPS} steps {difference:.1e}, from different starting "
                         f"weights on each rank", {"difference": difference})


def write(text, path=None):
    path = Path(path) if path else Path(tempfile.mkdtemp(prefix="lab-")) / "my_naive_ddp.py"
    path.write_text(text)
    return path


def from_scratch_stub(path=None):
    return write((FILES / "from_scratch_stub.py").read_text(), path)


def from_scratch_solution(path=None):
    """The library's own wrapper (workshop_lib/naive_ddp.py) is the reference."""
    from workshop_lib import naive_ddp

    return write(Path(naive_ddp.__file__).read_text(), path)


# A class that hands the model to torch's own DDP: it trains exactly as DDP does (a
# difference of 0.0) and writes none of the communication. The check must refuse it.
WRAPS_DDP = '''"""Data parallelism from two collectives (notebook 02): your version."""
from torch import nn
from torch.nn.parallel import DistributedDataParallel


class NaiveDataParallel(nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module
        self.ddp = DistributedDataParallel(module)

    def forward(self, *args, **kwargs):
        return self.ddp(*args, **kwargs)

    def sync_gradients(self):
        pass
'''


register(Exercise("from_scratch", "02_from_one_gpu_to_many",
                  "write DDP's communication from two collectives",
                  writes="my_naive_ddp.py: NaiveDataParallel's broadcast and gradient mean",
                  check=check_from_scratch, stub=from_scratch_stub,
                  solution=from_scratch_solution,
                  stub_reason="NotImplementedError",
                  refused=lambda path=None: [(write(WRAPS_DDP, path),
                                              "builds a DistributedDataParallel")]))
