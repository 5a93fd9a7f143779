"""Notebook 07, "Inside DDP": the learner writes the core of overlap, buckets and ZeRO-1.

Each exercise is a file (a ``%%writefile`` cell) defining one class, with the core left
for the learner (``files/<key>_stub.py``); the reference is the library's own module
(``workshop_lib/inside_ddp/``). The check launches ``workshop_lib.inside_ddp.verify`` with
the learner's file on two gloo processes and judges what the class did:

- every rank's parameters after ``replay.STEPS`` steps equal one process's on the global
  batch, within float32 rounding, for the plain CNN and for a network with a frozen layer,
  tied weights and a branch that some ranks skip in some steps;
- ``overlap`` and ``buckets``: the all-reduces had started when ``backward()`` returned
  (overlap), one per gradient, or one per bucket of ``verify.BUCKET_BYTES`` filled in
  reverse parameter order;
- ``zero1``: each rank holds less optimizer state than a replicated optimizer, and the
  ranks together hold exactly as much (every parameter's state on one rank).
"""
import io
import tempfile
from pathlib import Path

from workshop_lib import launch, runlog
from workshop_lib.labs import Exercise, Verdict, register

FILES = Path(__file__).resolve().parent / "files"
LIBRARY = Path(__file__).resolve().parent.parent / "inside_ddp"
TOLERANCE = 1e-5  # float32 rounding of the same sums in another order
MODELS = {"cnn": "the plain CNN",
          "edge": "the network with a frozen layer, tied weights and a branch some ranks skip"}


def run_verify(stage, path):
    """(result dict, None), or (None, a Verdict saying why there is no result)."""
    path = Path(path)
    if not path.is_file():
        return None, Verdict(False, f"{path} does not exist: run the %%writefile cell first")
    out = Path(tempfile.mkdtemp(prefix=f"lab-{stage}-")) / "result.json"
    job = launch.run(["-m", "workshop_lib.inside_ddp.verify", "--stage", stage,
                      "--file", str(path.resolve()), "--out", str(out)],
                     nproc=2, timeout=90, quiet=True, stream=io.StringIO(),
                     env={"CUDA_VISIBLE_DEVICES": ""})
    if not job.ok:
        return None, Verdict(False, f"the check's job failed: {job.error or job.summary()}"
                                    f"{collective_hint(job.log_dir)}")
    return runlog.load_json(out), None


def collective_hint(log_dir):
    """What a rank that died inside a collective means, from what gloo wrote in its log."""
    logs = " ".join(path.read_text(errors="replace")
                    for path in Path(log_dir).glob("*/attempt_*/*/stderr.log"))
    if "collective mismatch" in logs:
        return (". Gloo saw the ranks start different collectives (other sizes or another "
                "order): every rank must start its all-reduces in the same order, whatever "
                "order its hooks fire in")
    if "Timed out" in logs:
        return (". A rank waited in a collective that another rank never started (a "
                "gradient whose all-reduce was never started on one rank?)")
    return ""


def wrong_parameters(result):
    """A Verdict for the first case whose parameters differ from one process's, or None."""
    for case, difference in result["differences"].items():
        model, optimizer = case.split("/")
        if difference > TOLERANCE:
            return Verdict(False, f"with {optimizer}, on {MODELS[model]}, after "
                                  f"{result['steps']} steps a rank's parameters differ from "
                                  f"one process's on the global batch by {difference:.2e} "
                                  f"(more than float32 rounding, {TOLERANCE:.0e})",
                           result)
    return None


def largest(result):
    return max(result["differences"].values())


def check_overlap(path):
    result, failure = run_verify("overlap", path)
    failure = failure or wrong_parameters(result)
    if failure:
        return failure
    started, expected = result["started_in_backward"], result["expected_in_backward"]
    if started != expected:
        return Verdict(False, f"when backward() returned, all-reduces of {started or 'no'} "
                              f"elements had started; overlap starts every gradient's "
                              f"({expected}, in reverse parameter order) from the hook, "
                              f"during backward", result)
    return Verdict(True, f"every gradient's all-reduce starts during backward, and the ranks "
                         f"train as one process on the global batch (largest difference "
                         f"{largest(result):.1e}), frozen, tied and unused parameters too",
                   result)


def check_buckets(path):
    result, failure = run_verify("buckets", path)
    failure = failure or wrong_parameters(result)
    if failure:
        return failure
    started, expected = result["started_in_backward"], result["expected_in_backward"]
    if started != expected:
        return Verdict(False, f"your wrapper all-reduced buckets of {started} elements "
                              f"during backward; buckets of at most {result['bucket_bytes']} "
                              f"bytes, filled in reverse parameter order, hold {expected}",
                       result)
    return Verdict(True, f"{len(expected)} buckets, all-reduced during backward, and the ranks "
                         f"train as one process on the global batch (largest difference "
                         f"{largest(result):.1e}), frozen, tied and unused parameters too",
                   result)


def check_zero1(path):
    result, failure = run_verify("zero1", path)
    failure = failure or wrong_parameters(result)
    if failure:
        return failure
    memory = result["memory"]
    sharded, replicated = memory["sharded"], memory["replicated"]
    if sum(sharded) != replicated or max(sharded) >= replicated:
        return Verdict(False, f"Adam's state is {sharded} bytes on the ranks; replicated it is "
                              f"{replicated} on each: every parameter's state should live on "
                              f"exactly one rank (its owner)", result)
    return Verdict(True, f"SGD and Adam step as one process does (largest difference "
                         f"{largest(result):.1e}), with Adam's state split {sharded} bytes "
                         f"over the ranks instead of {replicated} on each", result)


def write(text, path, name):
    path = Path(path) if path else Path(tempfile.mkdtemp(prefix="lab-")) / name
    path.write_text(text)
    return path


def exercise(key, title, writes, check):
    def stub(path=None):
        return write((FILES / f"{key}_stub.py").read_text(), path, f"my_{key}.py")

    def solution(path=None):
        """The library's own module (workshop_lib/inside_ddp/) is the reference."""
        return write((LIBRARY / f"{key}.py").read_text(), path, f"my_{key}.py")

    register(Exercise(key, "07_inside_ddp", title, writes=f"my_{key}.py: {writes}",
                      check=check, stub=stub, solution=solution,
                      stub_reason="NotImplementedError"))


exercise("overlap", "start each gradient's all-reduce from a hook during backward",
         "the gradient hooks and the wait before the step", check_overlap)
exercise("buckets", "all-reduce gradients in buckets, in the order backward makes them",
         "the buckets and their all-reduces", check_buckets)
exercise("zero1", "shard the optimizer state over the ranks (ZeRO-1)",
         "each rank's share of the step, and the broadcast back", check_zero1)


def checked_cases(**verdicts):
    """What each check compared (notebook 07, section 4): one line per stage, model and
    optimizer, with the largest parameter difference from one process on the global batch.
    ``verdicts``: stage -> the Verdict its check returned."""
    lines = []
    for stage, verdict in verdicts.items():
        if "differences" not in verdict.details:
            lines.append(f"{stage:>8}: no result yet ({verdict.reason.split(':')[0]})")
            continue
        for case, difference in verdict.details["differences"].items():
            model, optimizer = case.split("/")
            within = "within" if difference <= TOLERANCE else "NOT within"
            lines.append(f"{stage:>8}: {optimizer:<4} on {MODELS[model]}: {difference:.1e}, "
                         f"{within} float32 rounding ({TOLERANCE:.0e})")
    return "\n".join(lines)
