"""Notebook 04, "Debug this job": DDP scripts that hang; the learner finds why and fixes them.

Two colleagues' jobs, each debugged the same way. First the learner says, from the stuck
job's stack dump alone (no script shown yet), which line each rank waits in, as a dict
``{rank: line}`` (its number, or its code); then fixes the script.

- ``debug_job.py`` (``files/debugging_stub.py``; exercises ``stuck_ranks``, ``debugging``)
  trains, evaluates after each epoch and saves a checkpoint from rank 0, and stops making
  progress at the end of its first epoch: rank 0 alone calls an all-reduce. After the
  answer come ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` on the job's end-of-epoch collectives
  cut down to ``files/debugging_excerpt.py``, and the fix.
- ``debug_eval_job.py`` (``files/eval_debugging_stub.py``; ``eval_stuck``,
  ``eval_debugging``, an optional section) lets rank 0 alone evaluate, and hangs with no
  ``dist.`` call inside its ``if rank == 0:``: the evaluation's forward goes through the
  DDP wrapper, which after a training step broadcasts the module's buffers from rank 0.

Each fix is checked by running the learner's script on two processes: it must finish,
still train with DDP, and report the accuracy of the whole validation set (a "fix" that
drops the all-reduce finishes too, but reports one rank's share), the accuracy that the
model it saved has (a skipped or made-up evaluation does not pass), and that model must
have learned. The scripts the notebook
already ran are no answer: they are refused before anything launches.
"""
import io
import tempfile
from pathlib import Path

from workshop_lib import data, launch, runlog
from workshop_lib.labs import Exercise, Verdict, register
from workshop_lib.labs._script_copies import same_code, with_words_changed, wraps_in_ddp

FILES = Path(__file__).resolve().parent / "files"
DIST_TIMEOUT_S, LIMIT_S = 20, 120
LEARNED = 0.9  # the least validation accuracy of a job that still trains (reference: 0.97)


def run_job(path, out, env=None):
    """Launch the job ``path`` on two CPU processes; its LaunchResult."""
    return launch.run([str(Path(path).resolve()), "--out", str(out), "--dist-timeout",
                       str(DIST_TIMEOUT_S)], nproc=2, timeout=LIMIT_S, quiet=True,
                      stream=io.StringIO(), env={"CUDA_VISIBLE_DEVICES": "", **(env or {})})


def check_fixed_job(path, stub, job, hint, ran_before):
    """The learner's fix of the hanging job ``job`` (the notebook wrote ``stub`` under that
    name): it finishes on two processes, still wraps the model in DDP, and reports the
    accuracy of the whole validation set, which is the saved model's, at least ``LEARNED``.
    ``ran_before``: (file, words) of the scripts the
    notebook ran before this exercise, refused without a launch."""
    path = Path(path)
    if not path.is_file():
        return Verdict(False, f"{path} does not exist: run the %%writefile cell first")
    text = path.read_text()
    # The scripts the notebook already ran, refused before a launch: the unchanged job
    # (it hangs until the collective timeout, as the learner saw), and the others.
    if same_code(text, (FILES / stub).read_text()):
        return Verdict(False, f"{path.name} is still the job the notebook ran above ({job}), "
                              f"unchanged in its code, and that job hangs until its "
                              f"{DIST_TIMEOUT_S} s collective timeout: the job still fails. "
                              f"{hint}")
    for earlier, words in ran_before:
        if earlier.is_file() and earlier.resolve() != path.resolve() \
                and same_code(text, earlier.read_text()):
            return Verdict(False, f"{path.name} is {words}: fix the job itself, {job}, in "
                                  f"the %%writefile cell")
    if not wraps_in_ddp(text):
        return Verdict(False, f"{path.name} no longer wraps the model in "
                              f"DistributedDataParallel: without it each rank trains its own "
                              f"copy on half the data. Keep DDP and fix what hangs")
    out = Path(tempfile.mkdtemp(prefix="lab-debugging-"))
    result = run_job(path, out)
    if not result.ok:
        return Verdict(False, f"the job still fails after {result.seconds:.0f} s: "
                              f"{result.summary().strip()} A rank that waits in a collective "
                              f"until the timeout is waiting for a rank that never calls it")
    _, val_set, info = data.load("digits")
    reported, saved = out / "result.json", out / "checkpoint.pt"
    if not reported.is_file() or not saved.is_file():
        return Verdict(False, f"the job finished but rank 0 wrote no "
                              f"{'result.json' if not reported.is_file() else 'checkpoint.pt'}"
                              f": keep the saving and the end of the script as they were")
    said = runlog.load_json(reported)
    if said["val_samples"] != len(val_set):
        return Verdict(False, f"the job finishes, but its accuracy covers "
                              f"{said['val_samples']} of the {len(val_set)} validation "
                              f"samples: the accuracy reported must be the whole validation "
                              f"set's")
    # The accuracy reported is the saved model's, and that model learned: a job that
    # skips or fakes its evaluation, or stops training, does not pass.
    scored = saved_model_accuracy(saved, val_set, info)
    if abs(scored - said["val_acc"]) > 1.5 / len(val_set):
        return Verdict(False, f"the job reports val_acc {said['val_acc']:.4f}, but the model "
                              f"it saved scores {scored:.4f} on the validation set: report the "
                              f"accuracy of the model the job trained")
    if scored < LEARNED:
        return Verdict(False, f"the model the job saved scores {scored:.4f} on the validation "
                              f"set, under {LEARNED} (the reference reaches about 0.97 in the "
                              f"same two epochs): the job must still train as it did")
    return Verdict(True, f"the job finishes in {result.seconds:.0f} s and reports the global "
                         f"accuracy over all {len(val_set)} validation samples, "
                         f"{said['val_acc']:.4f}, the saved model's",
                   {"seconds": result.seconds, "val_acc": said["val_acc"],
                    "val_samples": len(val_set)})


def saved_model_accuracy(path, val_set, info):
    """The accuracy on ``val_set`` of the course CNN whose state the job saved at ``path``
    (saved from the module or from the DDP wrapper: a ``module.`` prefix is dropped)."""
    import torch

    from workshop_lib import models

    state = torch.load(path, map_location="cpu", weights_only=True)
    model = models.build("cnn", info)
    model.load_state_dict({k.removeprefix("module."): v for k, v in state.items()})
    model.eval()
    x, y = val_set.tensors
    with torch.no_grad():
        return (model(x).argmax(dim=1) == y).float().mean().item()


def check(path):
    """The fix of debug_job.py (exercise ``debugging``)."""
    return check_fixed_job(
        path, "debugging_stub.py", "debug_job.py",
        "Find the collective only one rank calls, and fix it",
        [(FILES / "debugging_excerpt.py", "the cut-down script the notebook ran under DETAIL "
                                          "(debug_mismatch.py), only the end of an epoch")])


def check_eval(path):
    """The fix of debug_eval_job.py (exercise ``eval_debugging``). The first job's scripts,
    the reference and the learner's own fix beside this one, are refused too: they finish,
    but they are another job."""
    path = Path(path)
    first = "the first job's fix (debug_job.py's), not this job's"
    return check_fixed_job(
        path, "eval_debugging_stub.py", "debug_eval_job.py",
        "Find what rank 0 calls that the other ranks do not, and fix it",
        [(FILES / "debugging_solution.py", first), (path.parent / "my_debug_job.py", first),
         (FILES / "debugging_stub.py", "the first job, debug_job.py")])


def copy(name, path=None, default="my_debug_job.py"):
    path = Path(path) if path else Path(tempfile.mkdtemp(prefix="lab-")) / default
    path.write_text((FILES / name).read_text())
    return path


def mismatch_script(path=None):
    """A copy of ``files/debugging_excerpt.py``: the end of debug_job.py's epoch after the
    evaluation (its collectives in the same order on each rank) without the model, small
    enough to run with ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` on gloo, where PyTorch 2.14's
    ``DDP(...)`` crashes under ``DETAIL`` (tests/test_labs.py pins both)."""
    return copy("debugging_excerpt.py", path, default="debug_mismatch.py")


# Where each rank of files/debugging_stub.py waits once rank 1 has finished its first epoch:
# rank 0 in the all-reduce only it calls, rank 1 in the barrier after it.
WAITS = {0: "dist.all_reduce(sums)", 1: "dist.barrier()"}
COLLECTIVES = ("all_reduce", "barrier", "init_process_group", "destroy_process_group")


def stub_lines(name="debugging_stub.py"):
    return (FILES / name).read_text().splitlines()


def line_of(text, name="debugging_stub.py"):
    """The 1-based number of the stub's line that starts with ``text``."""
    return next(n for n, line in enumerate(stub_lines(name), 1)
                if line.strip().startswith(text))


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


def wait_line(function, code):
    """The line number, in the installed torch, of ``code`` in ``function``'s source."""
    import inspect

    lines, start = inspect.getsourcelines(inspect.unwrap(function))
    return next(start + i for i, line in enumerate(lines) if line.strip().startswith(code))


def top_frames():
    """Where the stack dump's top frames are, in torch (not in debug_job.py): rank 0's in
    all_reduce, rank 1's in barrier, both at ``work.wait()`` of the installed torch's
    distributed_c10d.py, under c10d_logger's wrapper. Answering them is reading the first
    line of each dump, not finding the line of the script: the check must fail each."""
    import torch.distributed as dist

    return [{0: wait_line(dist.all_reduce, "work.wait()"),
             1: wait_line(dist.barrier, "work.wait()")},
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
                         f"debug_job.py (give the line number the stack dump shows for the "
                         f"frame in debug_job.py, or that line's code)")
        elif named not in expected:
            wrong.append(f"rank {rank} is not waiting in {named}: read its frame in "
                         f"debug_job.py again (the innermost one in the script)")
    if wrong:
        return Verdict(False, "; ".join(wrong))
    # The lines by number only: their code is the fix's first clue, for the learner to read.
    return Verdict(True, f"rank 0 waits in line {line_of(WAITS[0])}, rank 1 in line "
                         f"{line_of(WAITS[1])}: two different collectives, so neither ever "
                         f"completes; next, find why",
                   {"lines": {rank: line_of(code) for rank, code in WAITS.items()},
                    "timeout_s": DIST_TIMEOUT_S})


# Where each rank of files/eval_debugging_stub.py waits at the end of its first epoch: rank
# 0 in the evaluation's forward (DDP's buffer broadcast), rank 1 in the barrier.
EVAL_STUB, EVAL_JOB = "eval_debugging_stub.py", "debug_eval_job.py"
EVAL_WAITS = {0: "logits = model(x)", 1: "dist.barrier()"}


def code_of(line):
    """A line's code without its comment or any whitespace, to compare answers with."""
    return "".join(line.split("#", 1)[0].split())


def lines_named(said, name=EVAL_STUB):
    """The numbers of the script's lines an answer names: its line number (an int, or
    digits), or code found on the line (whitespace and comments aside)."""
    lines = stub_lines(name)
    if isinstance(said, str) and said.strip().isdigit():
        said = int(said)
    if isinstance(said, bool) or not isinstance(said, int | str):
        return []
    if isinstance(said, int):
        return [said] if 1 <= said <= len(lines) and code_of(lines[said - 1]) else []
    code = code_of(said)
    return [n for n, line in enumerate(lines, 1) if code and code in code_of(line)]


def check_eval_stuck(answer):
    name = "where_eval_ranks_wait"
    if not isinstance(answer, dict) or set(answer) != set(EVAL_WAITS):
        return Verdict(False, f"fill in {name} as {{0: ..., 1: ...}}: for each rank, the line "
                              f"of {EVAL_JOB} its stack shows it waiting in (its line number, "
                              f"or the code on it)")
    wrong = []
    for rank, expected in sorted(EVAL_WAITS.items()):
        said, where = answer[rank], line_of(expected, EVAL_STUB)
        named = lines_named(said)
        if said is None:
            wrong.append(f"fill in {name}[{rank}]: the line of {EVAL_JOB} rank {rank}'s stack "
                         f"shows it waiting in")
        elif not named:
            wrong.append(f"rank {rank}: {said!r} names no line of code in {EVAL_JOB} (give the "
                         f"line number the stack dump shows for the frame in {EVAL_JOB}, or "
                         f"its code)")
        elif len(named) > 1:
            wrong.append(f"rank {rank}: {said!r} is on lines {', '.join(map(str, named))} of "
                         f"{EVAL_JOB}: give the line number, or the whole line")
        elif named != [where]:
            wrong.append(f"rank {rank} is not waiting in line {named[0]}: take the frame of "
                         f"{EVAL_JOB} nearest the top of its stack")
    if wrong:
        return Verdict(False, "; ".join(wrong))
    return Verdict(True, f"rank 0 waits in line {line_of(EVAL_WAITS[0], EVAL_STUB)} "
                         f"({EVAL_WAITS[0]}), a forward through the DDP wrapper, and rank 1 at "
                         f"the barrier in line {line_of(EVAL_WAITS[1], EVAL_STUB)}: above rank "
                         f"0's line are the module's call and DDP's frames, and the top one "
                         f"is a broadcast, a collective rank 1 never joins; next, find why a "
                         f"forward broadcasts")


def eval_top_frames():
    """The eval job's dump read from its first lines, which are torch's: rank 0's in DDP's
    buffer broadcast, rank 1's in barrier. The check must fail each."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    broadcast = wait_line(DistributedDataParallel._distributed_broadcast_coalesced,
                          "dist._broadcast_coalesced(")
    return [{0: broadcast, 1: wait_line(dist.barrier, "work.wait()")},
            {0: "dist._broadcast_coalesced(", 1: "work.wait()"},
            {0: "_distributed_broadcast_coalesced", 1: "barrier"}]


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
                                                  mismatch_script(path)],
                  refused=lambda path=None: [
                      (with_words_changed(copy("debugging_stub.py", path)),
                       "still the job the notebook ran above")]))


register(Exercise("eval_stuck", "04_when_things_go_wrong", "say where each rank of a second "
                  "hung job waits, from its stacks (optional)",
                  writes=f"where_eval_ranks_wait: {{rank: the line of {EVAL_JOB} it waits in}}",
                  check=check_eval_stuck, stub=lambda: {0: None, 1: None},
                  solution=lambda: {r: line_of(w, EVAL_STUB) for r, w in EVAL_WAITS.items()},
                  shown=lambda: "\n".join(f"{rank}: {line_of(line, EVAL_STUB)},  # {line}"
                                          for rank, line in EVAL_WAITS.items()),
                  stub_reason="fill in where_eval_ranks_wait",
                  # the first job's answer, as numbers and as code, and the dump's top lines
                  earlier_runs=lambda **_: [{0: line_of(WAITS[0]), 1: line_of(WAITS[1])},
                                            dict(WAITS), *eval_top_frames()]))


register(Exercise("eval_debugging", "04_when_things_go_wrong", "find and fix a job that hangs "
                  "with no collective in sight (optional)",
                  writes="my_debug_eval_job.py: the second hanging job, fixed",
                  check=check_eval,
                  stub=lambda path=None: copy(EVAL_STUB, path, "my_debug_eval_job.py"),
                  solution=lambda path=None: copy("eval_debugging_solution.py", path,
                                                  "my_debug_eval_job.py"),
                  stub_reason=f"still the job the notebook ran above ({EVAL_JOB})",
                  earlier_runs=lambda path=None: [
                      copy(EVAL_STUB, path, "my_debug_eval_job.py"),
                      copy("debugging_solution.py", path, "my_debug_eval_job.py"),
                      copy("debugging_stub.py", path, "my_debug_eval_job.py")],
                  # the first job's fix with only its words changed is still that fix
                  refused=lambda path=None: [
                      (with_words_changed(copy("debugging_solution.py", path,
                                               "my_debug_eval_job.py")),
                       "the first job's fix"),
                      (with_words_changed(copy(EVAL_STUB, path, "my_debug_eval_job.py")),
                       f"still the job the notebook ran above ({EVAL_JOB})")]))
