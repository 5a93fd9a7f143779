"""Notebook 04, "Debug this job": a DDP script that hangs; the learner finds why and fixes it.

First, ``stuck_ranks``: from the stuck job's stack dump alone (no script shown yet), the
learner says which line of ``debug_job.py`` each rank waits in, as a dict ``{rank: line}``
(its number, or its text). Only then come ``DETAIL``, the cut-down script and the fix.

``files/debugging_stub.py`` trains, evaluates after each epoch and saves a checkpoint from rank
0, and stops making progress at the end of its first epoch. The learner reads the
launcher's summary, dumps the stuck ranks' stacks (``Job.dump_stacks()``, py-spy), runs
the job's end-of-epoch collectives cut down to ``files/debugging_excerpt.py`` with
``TORCH_DISTRIBUTED_DEBUG=DETAIL``, and writes the fixed script. The check runs
the learner's script on two processes: it must finish, and the accuracy it reports must
cover the whole validation set (a "fix" that drops the all-reduce finishes too, but
reports one rank's share). The cut-down script the notebook ran is no answer: it is
refused before anything launches (the unchanged job is the exercise's stub, which the check
launches and fails).
"""
import ast
import io
import tempfile
from pathlib import Path

from workshop_lib import data, launch, runlog
from workshop_lib.labs import Exercise, Verdict, register

FILES = Path(__file__).resolve().parent / "files"
DIST_TIMEOUT_S, LIMIT_S = 20, 120


def run_job(path, out, env=None):
    """Launch the job ``path`` on two CPU processes; its LaunchResult."""
    return launch.run([str(Path(path).resolve()), "--out", str(out), "--dist-timeout",
                       str(DIST_TIMEOUT_S)], nproc=2, timeout=LIMIT_S, quiet=True,
                      stream=io.StringIO(), env={"CUDA_VISIBLE_DEVICES": "", **(env or {})})


def check(path):
    path = Path(path)
    if not path.is_file():
        return Verdict(False, f"{path} does not exist: run the %%writefile cell first")
    # The scripts the notebook already ran, refused before a launch: the unchanged job
    # (it hangs until the collective timeout, as the learner saw) and the cut-down one.
    if same_code(path.read_text(), (FILES / "debugging_stub.py").read_text()):
        return Verdict(False, f"{path.name} is still the job the notebook ran above "
                              f"(debug_job.py), unchanged in its code, and that job hangs "
                              f"until its {DIST_TIMEOUT_S} s collective timeout: the job still "
                              f"fails. Find the collective only one rank calls, and fix it")
    if same_code(path.read_text(), (FILES / "debugging_excerpt.py").read_text()):
        return Verdict(False, f"{path.name} is the cut-down script the notebook ran under "
                              f"DETAIL (debug_mismatch.py), only the end of an epoch: fix the "
                              f"job itself, debug_job.py, in the %%writefile cell")
    out = Path(tempfile.mkdtemp(prefix="lab-debugging-"))
    result = run_job(path, out)
    if not result.ok:
        return Verdict(False, f"the job still fails after {result.seconds:.0f} s: "
                              f"{result.summary().strip()} A rank that waits in a collective "
                              f"until the timeout is waiting for a rank that never calls it")
    _, val_set, _ = data.load("digits")
    reported = out / "result.json"
    if not reported.is_file():
        return Verdict(False, "the job finished but rank 0 wrote no result.json: keep the end "
                              "of the script as it was")
    samples = runlog.load_json(reported)["val_samples"]
    if samples != len(val_set):
        return Verdict(False, f"the job finishes, but its accuracy covers {samples} of the "
                              f"{len(val_set)} validation samples: every rank must add its "
                              f"sums in (the all-reduce), only the printing is rank 0's")
    return Verdict(True, f"the job finishes in {result.seconds:.0f} s and reports the global "
                         f"accuracy over all {samples} validation samples")


def same_code(text, other):
    """Whether two scripts are the same code, whatever their comments and layout."""
    try:
        return ast.dump(ast.parse(text)) == ast.dump(ast.parse(other))
    except SyntaxError:
        return False


def copy(name, path=None, default="my_debug_job.py"):
    path = Path(path) if path else Path(tempfile.mkdtemp(prefix="lab-")) / default
    path.write_text((FILES / name).read_text())
    return path


def mismatch_script(path=None):
    """A copy of ``files/debugging_excerpt.py``: the end of debug_job.py's epoch (the same
    collectives in the same order on each rank) without the model, small enough to run with
    ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` on gloo, where PyTorch 2.14's ``DDP(...)`` crashes
    under ``DETAIL`` (tests/test_labs.py pins both)."""
    return copy("debugging_excerpt.py", path, default="debug_mismatch.py")


# Where each rank of files/debugging_stub.py waits once rank 1 has finished its first epoch:
# rank 0 in the all-reduce only it calls, rank 1 in the barrier after it.
WAITS = {0: "dist.all_reduce(sums)", 1: "dist.barrier()"}
COLLECTIVES = ("all_reduce", "barrier", "init_process_group", "destroy_process_group")


def stub_lines():
    return (FILES / "debugging_stub.py").read_text().splitlines()


def line_of(text):
    """The 1-based number of the stub's line that starts with ``text``."""
    return next(n for n, line in enumerate(stub_lines(), 1) if line.strip().startswith(text))


def collective_named(said):
    """The collective a rank's answer names: by line number of debug_job.py, or in words."""
    if isinstance(said, bool) or not isinstance(said, int | str):
        return None
    if isinstance(said, int):
        lines = stub_lines()
        said = lines[said - 1] if 1 <= said <= len(lines) else ""
    named = [c for c in COLLECTIVES if c in said.replace(" ", "").replace(".", "_").lower()
             or c.replace("_", "") in said.replace(" ", "").lower()]
    return named[0] if len(named) == 1 else None


def top_frames():
    """Where the stack dump's top frames are, in torch (not in debug_job.py): rank 0's in
    all_reduce, rank 1's in barrier, both at ``work.wait()`` of the installed torch's
    distributed_c10d.py, under c10d_logger's wrapper. Answering them is reading the first
    line of each dump, not finding the line of the script: the check must fail each."""
    import inspect

    import torch.distributed as dist

    def wait_line(collective):
        lines, start = inspect.getsourcelines(inspect.unwrap(collective))
        return next(start + i for i, line in enumerate(lines) if line.strip() == "work.wait()")

    return [{0: wait_line(dist.all_reduce), 1: wait_line(dist.barrier)},
            {0: "work.wait()", 1: "work.wait()"},
            {0: "return func(*args, **kwargs)", 1: "return func(*args, **kwargs)"}]


def check_stuck_ranks(answer):
    if not isinstance(answer, dict) or set(answer) != set(WAITS):
        return Verdict(False, "fill in where_ranks_wait as {0: ..., 1: ...}: for each rank, "
                              "the line of debug_job.py its stack shows it waiting in (its "
                              "line number, or the code on it)")
    wrong = []
    for rank, expected in sorted(WAITS.items()):
        named = collective_named(answer[rank])
        if answer[rank] is None:
            wrong.append(f"fill in where_ranks_wait[{rank}]: the line of debug_job.py rank "
                         f"{rank}'s stack shows it waiting in")
        elif named is None:
            wrong.append(f"rank {rank}: {answer[rank]!r} names no single collective of "
                         f"debug_job.py (give the line number py-spy shows for the frame in "
                         f"debug_job.py, or that line's code)")
        elif named not in expected:
            wrong.append(f"rank {rank} is not waiting in {named}: read its frame in "
                         f"debug_job.py again (the innermost one in the script)")
    if wrong:
        return Verdict(False, "; ".join(wrong))
    return Verdict(True, f"rank 0 waits in line {line_of(WAITS[0])} ({WAITS[0]}), rank 1 in "
                         f"line {line_of(WAITS[1])} ({WAITS[1]}): two different collectives, so "
                         f"neither ever completes; next, find why")


register(Exercise("stuck_ranks", "04_when_things_go_wrong", "say where each rank of the hung "
                  "job waits, from its stacks",
                  writes="where_ranks_wait: {rank: the line of debug_job.py it waits in}",
                  check=check_stuck_ranks, stub=lambda: {0: None, 1: None},
                  solution=lambda: {0: line_of(WAITS[0]), 1: line_of(WAITS[1])},
                  shown=lambda: "\n".join(f"{rank}: {line_of(line)},  # {line}"
                                          for rank, line in WAITS.items()),
                  stub_reason="fill in where_ranks_wait",
                  earlier_runs=lambda **_: top_frames()))


register(Exercise("debugging", "04_when_things_go_wrong", "find and fix a hanging DDP job",
                  writes="my_debug_job.py: the hanging job, fixed",
                  check=check, stub=lambda path=None: copy("debugging_stub.py", path),
                  solution=lambda path=None: copy("debugging_solution.py", path),
                  stub_reason="still fails",
                  earlier_runs=lambda path=None: [copy("debugging_stub.py", path),
                                                  mismatch_script(path)]))
