"""The exercises: each notebook holds its exercise's stub as the library has it, and every
check fails its stub with the stated reason and passes its reference solution."""
import ast
import re
import shlex

import nbformat
import pytest

from conftest import REPO
from workshop_lib import labs, plans, profile, runlog
from workshop_lib.labs import beyond_one_machine as beyond
from workshop_lib.labs import from_one_gpu_to_many, welcome
from workshop_lib.labs import keeping_accuracy_at_scale as challenge

EXERCISES = labs._load()
FILES = REPO / "workshop_lib" / "labs" / "files"


def cells(notebook):
    path = next((REPO / "notebooks").glob(f"{notebook}.ipynb"))
    return [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


def test_at_least_six_exercises_across_the_first_five_notebooks():
    assert len(EXERCISES) >= 6
    assert {e.notebook[:2] for e in EXERCISES.values()} >= {"00", "01", "02", "03", "04"}


def test_every_notebook_has_its_labs_module_and_every_exercise_lives_in_its_notebooks():
    """notebooks/NN_<slug>.ipynb <-> labs/<slug>.py: an exercise is found by its module's
    name, and a module holds only its notebook's exercises."""
    slugs = {p.stem[3:]: p.stem for p in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    for slug in slugs:
        assert (REPO / "workshop_lib" / "labs" / f"{slug}.py").is_file(), slug
    for key, exercise in EXERCISES.items():
        module = exercise.check.__module__.rpartition(".")[2]
        assert slugs.get(module) == exercise.notebook, (key, module, exercise.notebook)
        assert exercise.writes.strip(), f"{key} does not say what the learner writes"


def test_the_exercises_files_are_named_by_their_exercise():
    keys = set(EXERCISES)
    for path in FILES.glob("*.py"):
        key, _, role = path.stem.rpartition("_")
        assert key in keys and role in ("stub", "solution", "excerpt"), (
            f"{path.name}: name it <key>_stub.py, <key>_solution.py or <key>_excerpt.py")


def test_the_learners_to_do_list_fits_one_screen():
    from workshop_lib.labs.__main__ import todo

    lines = todo(list(EXERCISES.values())).splitlines()
    assert len(lines) <= 48, lines
    for key, exercise in EXERCISES.items():
        assert any(key in line for line in lines) and any(exercise.writes in line
                                                         for line in lines)


@pytest.mark.parametrize("key", sorted(EXERCISES))
def test_each_notebook_checks_its_exercise_and_offers_the_solution(key):
    sources = "\n".join(cells(EXERCISES[key].notebook))
    assert re.search(rf'labs\.check\("{key}"', sources), f"no check cell for {key}"
    assert re.search(rf'labs\.solution\("{key}"', sources), f"no solutions switch for {key}"


@pytest.mark.parametrize("stub", sorted(p.name for p in FILES.glob("*_stub.py")))
def test_the_exercise_cell_holds_the_librarys_stub(stub):
    """Every labs/files/<key>_stub.py is, as it is, an exercise cell of its notebook (a
    %%writefile line may head it)."""
    key = stub.removesuffix("_stub.py")
    text = (FILES / stub).read_text().strip("\n")
    bodies = [re.sub(r"\A%%writefile \S+\n", "", source)
              for source in cells(EXERCISES[key].notebook)]
    assert text in bodies, f"the notebook's {key} cell differs from workshop_lib/labs/files/{stub}"


def literal_assigned(sources, name):
    for source in sources:
        for node in ast.parse(source).body if not source.startswith("%%") else []:
            target = node.targets[0] if isinstance(node, ast.Assign) else None
            if isinstance(target, ast.Name) and target.id == name:
                return ast.literal_eval(node.value)
    raise AssertionError(f"no cell assigns {name}")


def test_the_answer_cells_ask_what_the_checks_judge():
    assert literal_assigned(cells("02_from_one_gpu_to_many"), "my_answers") == \
        from_one_gpu_to_many.sampler_stub()
    assert literal_assigned(cells("00_welcome"), "observed") == welcome.stub()
    assert literal_assigned(cells("03_keeping_accuracy_at_scale"), "my_runs") == \
        challenge.STUB
    assert literal_assigned(cells("04_when_things_go_wrong"), "where_ranks_wait") == \
        EXERCISES["stuck_ranks"].stub()
    assert literal_assigned(cells("04_when_things_go_wrong"), "where_eval_ranks_wait") == \
        EXERCISES["eval_stuck"].stub()


def test_notebook_04_asks_where_the_ranks_wait_before_it_shows_any_script():
    """The stack dump is the only evidence when the answer is asked: the stuck job's script,
    the cut-down script and DETAIL all come after the answer's check."""
    sources = cells("04_when_things_go_wrong")
    answered = next(i for i, s in enumerate(sources) if 'labs.check("stuck_ranks"' in s)
    dumped = next(i for i, s in enumerate(sources) if "dump_stacks()" in s)
    shown = [i for i, s in enumerate(sources)
             if "read_text()" in s or "DETAIL" in s or s.startswith("%%writefile")]
    assert dumped < answered and shown and min(shown) > answered, (dumped, answered, shown)


def test_notebook_04_asks_where_the_second_jobs_ranks_wait_before_it_shows_its_script():
    """The second job, the same way: its stacks dumped, the answer checked, and only then
    its code (the %%writefile cell) or an explanation of what DDP's forward does."""
    sources = cells("04_when_things_go_wrong")
    started = next(i for i, s in enumerate(sources) if 'get("eval_debugging").stub(' in s)
    dumped = next(i for i, s in enumerate(sources) if i >= started and "dump_stacks()" in s)
    answered = next(i for i, s in enumerate(sources) if 'labs.check("eval_stuck"' in s)
    shown = [i for i, s in enumerate(sources) if i > started and (
        "read_text()" in s or "will_sync_module_buffers" in s or "_sync_buffers" in s
        or s.startswith("%%writefile"))]
    assert started <= dumped < answered and shown and min(shown) > answered, (
        started, dumped, answered, shown)
    earlier = "\n".join(sources[:started])
    assert "evaluate(model.module" not in earlier and "forward_sync_buffers" not in earlier, (
        "the fix is not on screen above the second job")


@pytest.mark.parametrize("answer,reason", [
    ({0: None, 1: None}, "fill in where_ranks_wait[0]"),
    ("rank 0 in all_reduce", "fill in where_ranks_wait as {0: ..., 1: ...}"),
    ({0: "dist.barrier()", 1: "dist.barrier()"}, "rank 0 is not waiting in barrier"),
    ({0: "dist.all_reduce(sums)", 1: "dist.all_reduce(sums)"},
     "rank 1 is not waiting in all_reduce"),
    ({0: 1, 1: "the loss"}, "names no single collective"),
])
def test_the_stuck_ranks_check_says_which_rank_is_wrong(answer, reason):
    verdict = labs.get("stuck_ranks").check(answer)
    assert not verdict.ok and reason in verdict.reason, verdict.reason


@pytest.mark.parametrize("answer,reason", [
    ({0: None, 1: None}, "fill in where_eval_ranks_wait[0]"),
    ([28, 67], "fill in where_eval_ranks_wait as {0: ..., 1: ...}"),
    ({0: "model(x)", 1: "dist.barrier()"}, "is on lines"),  # the training forward too
    ({0: "evaluate(model, val_loader)", 1: "dist.barrier()"}, "rank 0 is not waiting in line"),
    ({0: "dist.all_reduce(sums)", 1: "dist.barrier()"}, "names no line of code"),
    ({0: "logits = model(x)", 1: 9999}, "rank 1: 9999 names no line"),
])
def test_the_eval_stuck_check_says_which_rank_is_wrong(answer, reason):
    verdict = labs.get("eval_stuck").check(answer)
    assert not verdict.ok and reason in verdict.reason, verdict.reason


def test_the_eval_stuck_check_passes_the_reference_and_fails_the_first_jobs_answer():
    """By number, by code (spaced or commented otherwise, or as digits); the first job's
    answer and the dump's top lines, which are torch's, fail (labs check's earlier runs)."""
    from workshop_lib.labs import when_things_go_wrong as debugging
    from workshop_lib.labs.__main__ import prove_rules

    reference = labs.solution("eval_stuck")
    stub = (FILES / "eval_debugging_stub.py").read_text().splitlines()
    assert [stub[line - 1].strip() for line in reference.values()] == [
        "logits = model(x)", "dist.barrier()  # every rank waits for rank 0's checkpoint "
                             "before going on"]
    for answer in (reference, dict(debugging.EVAL_WAITS),
                   {0: "logits=model( x )  # here", 1: str(reference[1])}):
        assert labs.get("eval_stuck").check(answer).ok, answer
    assert labs.get("stuck_ranks").solution() in EXERCISES["eval_stuck"].earlier_runs()
    assert prove_rules(EXERCISES["eval_stuck"]) == []


def test_eval_debugging_refuses_the_scripts_the_notebook_ran_and_a_job_without_ddp(
        monkeypatch, tmp_path):
    """The unchanged second job, the first job's fix (the reference, or the learner's own
    my_debug_job.py beside it) and a "fix" that drops DDP are refused without a launch; the
    first job's check refuses a job without DDP too."""
    from workshop_lib.labs import when_things_go_wrong as debugging
    from workshop_lib.labs.__main__ import prove_rules

    def no_launch(*_, **__):
        raise AssertionError("launched a script the check must refuse")

    monkeypatch.setattr(debugging, "run_job", no_launch)
    exercise = EXERCISES["eval_debugging"]
    unchanged = exercise.stub(path=tmp_path / "my_debug_eval_job.py")
    unchanged.write_text("# read it\n" + unchanged.read_text())
    verdict = exercise.check(unchanged)
    assert not verdict.ok and exercise.stub_reason in verdict.reason, verdict.reason
    own_first_fix = (FILES / "debugging_solution.py").read_text().replace(
        "        dist.all_reduce(sums)  # every rank takes part in every collective\n",
        "        dist.all_reduce(sums)\n")
    (tmp_path / "my_debug_job.py").write_text(own_first_fix + "\n# mine\n")
    unchanged.write_text(own_first_fix)
    verdict = exercise.check(unchanged)
    assert not verdict.ok and "the first job's fix" in verdict.reason, verdict.reason
    for key, stub in (("eval_debugging", "eval_debugging_solution.py"),
                      ("debugging", "debugging_solution.py")):
        no_ddp = tmp_path / f"{key}_no_ddp.py"
        no_ddp.write_text((FILES / stub).read_text()
                          .replace('DDP(models.build("cnn", info))', 'models.build("cnn", info)')
                          .replace("model.module", "model"))
        verdict = EXERCISES[key].check(no_ddp)
        assert not verdict.ok and "no longer wraps the model in" in verdict.reason, key
    assert prove_rules(exercise) == []


def test_the_stuck_ranks_check_passes_the_reference_by_line_or_by_code():
    from workshop_lib.labs import when_things_go_wrong as debugging

    assert labs.get("stuck_ranks").check(labs.solution("stuck_ranks")).ok
    assert labs.get("stuck_ranks").check(dict(debugging.WAITS)).ok
    stub = (FILES / "debugging_stub.py").read_text().splitlines()
    for rank, line in labs.solution("stuck_ranks").items():
        assert stub[line - 1].strip().startswith(debugging.WAITS[rank]), (rank, line)
    assert not labs.get("stuck_ranks").check(labs.get("stuck_ranks").stub()).ok


# `make check-labs` proves every exercise both ways; in the suite, the notebooks do it where
# the learner meets them: tests/test_notebook_NN.py sees each check PASS on the reference
# solution, tests/test_notebooks_one_process.py sees each say NOT YET with its stated
# reason on the stub. What only `labs check` proves is run here:
RULED = sorted(key for key, e in EXERCISES.items()
               if e.earlier_runs is not labs._no_answers or e.refused is not labs._no_answers)


@pytest.mark.slow
@pytest.mark.parametrize("key", RULED)
def test_no_check_passes_a_run_the_notebook_made_before_it_or_an_answer_it_must_refuse(key):
    from workshop_lib.labs.__main__ import prove_rules

    assert prove_rules(EXERCISES[key]) == []


def test_the_notebooks_prove_every_exercise_both_ways():
    """The solutions run asserts PASS for the notebook's exercises; the one-process run
    asserts every stub's stated reason."""
    one_process = (REPO / "tests" / "test_notebooks_one_process.py").read_text()
    assert "exercise.stub_reason in line" in one_process
    for exercise in EXERCISES.values():
        test = REPO / "tests" / f"test_notebook_{exercise.notebook[:2]}.py"
        assert "PASS: " in test.read_text(), f"{test.name} asserts no exercise's PASS"


SBATCH_ACCEPTED = [
    beyond.REFERENCE,
    "#SBATCH -N 3\n#SBATCH --gres=gpu:8\n#SBATCH -t 30 -c 32\n",
    "#SBATCH -N3 --ntasks=3 --gres=gpu:a100:8,nvme:1 --time=1:00:00 --mem=0 --exclusive -c48\n",
    "#SBATCH --nodes 3 --ntasks-per-node 1 --gpus-per-task=h100:8 --time=30 "
    "--cpus-per-task 32  # a comment\n",
    "#SBATCH --nodes=1 -c 2\n#SBATCH --nodes=3-3 --gpus-per-node=8 --time=5 -A proj -p gpu "
    "--cpus-per-task=32\n",
]
SBATCH_REFUSED = [
    (beyond.STUB, "1 node(s)"),
    ("#SBATCH --nodes=3 --gpus=24 --time=30 -c 32\n", "may split unevenly"),
    ("#SBATCH --nodes=3-4 --gpus-per-node=8 --time=30 -c 32\n", "3 to 4 nodes"),
    ("#SBATCH --nodes=3 --ntasks-per-node=8 --gpus-per-node=8 --time=30 -c 32\n", "8 task(s)"),
    ("#SBATCH --nodes=3 --gpus-per-node=8 -c 32\n", "no --time"),
    ("#SBATCH --nodes=3 --gpu-per-node=8 --time=30 -c 32\n", "did you mean --gpus-per-node"),
    ("#SBATCH --nodes=three --gpus-per-node=8 --time=30\n", "write a number"),
    ("#SBATCH --nodes\n", "needs a value"),
    ("#SBATCH --nodes=3 --time=30 -c 32\nsrun hostname\n#SBATCH --gpus-per-node=8\n",
     "0 GPU(s)"),
    ("#SBATCH --nodes=3 --gpus-per-node='8 --time=30\n", "cannot read"),
    ("#SBATCH --nodes=3 --gpus-per-node=8 --time=30\n", "no --cpus-per-task"),
    ("#SBATCH --nodes=3 --gpus-per-node=8 --time=30 --cpus-per-task=4\n",
     "--cpus-per-task=4 gives each node's 8 rank(s) 0.5 core(s) each"),
    ("#SBATCH --nodes=3 --gpus-per-node=8 --time=30 --cpus-per-gpu=4\n",
     "--cpus-per-gpu sets no SLURM_CPUS_PER_TASK"),
]


@pytest.mark.parametrize("header", SBATCH_ACCEPTED)
def test_the_sbatch_header_check_accepts_every_way_sbatch_reads_the_same_allocation(header):
    verdict = beyond.check(header)
    assert verdict.ok, verdict.reason
    assert verdict.details["nodes"] == 3 and verdict.details["gpus_per_node"] == 8
    assert verdict.details["cpus_per_task"] >= 32


@pytest.mark.parametrize("header,reason", SBATCH_REFUSED)
def test_the_sbatch_header_check_says_what_the_allocation_lacks(header, reason):
    verdict = beyond.check(header)
    assert not verdict.ok and reason in verdict.reason, verdict.reason


def test_the_sbatch_header_check_refuses_the_usage_lines_printed_above_it():
    """Notebook 06 prints deploy/train_ddp.sbatch just above the exercise: each of its usage
    lines' options, moved into the header, asks for another job shape."""
    from workshop_lib.labs.__main__ import prove_rules

    examples = beyond.printed_examples()
    course = (REPO / "deploy" / "train_ddp.sbatch").read_text()
    usage_lines = re.findall(r"^#[^.]*\bsbatch -", course, re.M)
    assert usage_lines and len(examples) == len(usage_lines), (usage_lines, examples)
    assert any("--gpus-per-node=" in example for example in examples), examples
    for example in examples:
        assert not beyond.check(example).ok, example
    assert prove_rules(EXERCISES["sbatch_header"]) == []


def test_the_sbatch_header_check_reads_a_batch_script_file(tmp_path):
    path = tmp_path / "job.sbatch"
    beyond.solution(path=path)
    assert beyond.check(str(path)).ok and beyond.check(path).ok


def test_the_learners_header_goes_on_the_course_scripts_commands():
    course = (REPO / "deploy" / "train_ddp.sbatch").read_text()
    script = beyond.batch_script(beyond.REFERENCE, course)
    assert beyond.check(script).ok, "sbatch reads the learner's header, not the course's"
    assert script.count("#SBATCH --nodes") == 1 and script.startswith("#!/bin/bash\n")
    assert script.endswith(course[course.index("set -euo pipefail"):])


DDP_UNDER_DETAIL = """
import workshop_lib  # the exit guard (gloo_exit), as the course's scripts have it
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
DDP(torch.nn.Linear(4, 2))
print("constructed")
dist.destroy_process_group()
"""


def runs_before(notebook, exercise_cell):
    """The training runs notebook ``notebook``'s sweep cells launch before the code cell that
    holds ``exercise_cell``: ``{name: argv}`` with the cell's shell variables left in."""
    runs = {}
    for source in cells(notebook):
        if exercise_cell in source:
            return runs
        if "workshop_lib.sweep" in source:
            common = source.split(" -- ", 1)[1].replace("\\\n", " ")
            for name, flags in re.findall(r'--variant\s+"?(\w+)="?([^"]*)"', source):
                runs[name] = f"{common} {flags}"
    raise AssertionError(f"no cell of {notebook} holds {exercise_cell!r}")


def test_fit_in_memorys_earlier_runs_are_notebook_05s_sweep_cells():
    """prove_rules fails fit_in_memory on worked_example.NOTEBOOK_RUNS: it must hold every
    run the notebook's sweep cells launch above the exercise, read as train.py reads the
    flags (a cell's common flags included), at any profile's batch."""
    from workshop_lib import plans, profile
    from workshop_lib.labs import worked_example as fit

    runs = runs_before("05_worked_example", 'labs.check("fit_in_memory"')
    listed = {name: flags for variants in fit.NOTEBOOK_RUNS.values()
              for name, flags in variants.items()}
    assert set(runs) == set(listed)
    parser = fit.training_parser()
    for batch in sorted({sizes.batch_size for sizes in profile.SIZES.values()}):
        values = {"DEVICE": "cpu", "DATASET": "digits", "MODEL": "cnn", "BATCH_SIZE": batch,
                  "BIG_BATCH": plans.REMEDY_SCALE * batch}

        def chosen(argv, values=values):
            args = parser.parse_args(re.sub(r"\$(\w+)", lambda m: str(values.get(m[1], 1)),
                                            argv).split())
            return {dest: getattr(args, dest) for dest in fit.CHOICES}

        for name, argv in runs.items():
            assert fit.as_flags(chosen(argv)) in fit.earlier_runs(), (name, batch)
            assert chosen(argv) == chosen(listed[name]), name
    assert "--batch-size 64 --accumulate 4 --amp off" in fit.earlier_runs()  # the closest


def test_fit_in_memory_refuses_every_earlier_run_and_budget_override_before_training():
    """What `labs check` proves for fit_in_memory, without its trainings: each is refused by
    the precheck (no run trains), on one line."""
    from workshop_lib.labs import worked_example as fit
    from workshop_lib.labs.__main__ import prove_rules

    for flags in fit.earlier_runs():
        assert fit.precheck(flags), flags
    for flags, words in fit.budget_overrides():
        refused = fit.precheck(flags)
        assert refused.startswith(words) and "\n" not in refused, refused
    assert prove_rules(EXERCISES["fit_in_memory"]) == []


def test_fit_in_memory_refuses_more_than_two_micro_batches_and_bf16_alone():
    """The second constraint makes the learner weigh the remedies: accumulation alone needs
    four micro-batches; bf16 alone, at two, still saves more than the budget."""
    from workshop_lib.labs import worked_example as fit

    assert "over the limit of 2" in fit.precheck("--batch-size 64 --accumulate 4")
    assert "it would not fit" in fit.precheck("--batch-size 128 --accumulate 2 --amp bf16")
    assert fit.precheck(fit_solution := labs.solution("fit_in_memory")) is None, fit_solution


@pytest.mark.slow
def test_notebook_04_cuts_the_job_down_because_ddp_crashes_under_detail_on_gloo():
    """Notebook 04 says PyTorch 2.14's ``DDP(...)`` crashes on gloo with
    TORCH_DISTRIBUTED_DEBUG=DETAIL, and runs the cut-down script instead. When a PyTorch
    upgrade fixes it, this fails: run debug_job.py itself under DETAIL there again."""
    import os
    import signal
    import subprocess
    import sys

    from workshop_lib.distributed import free_port

    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "RANK": "0", "WORLD_SIZE": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    plain = subprocess.run([sys.executable, "-c", DDP_UNDER_DETAIL], env=env,
                           capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0 and "constructed" in plain.stdout, plain.stderr[-2000:]
    env["MASTER_PORT"] = str(free_port())
    detail = subprocess.run([sys.executable, "-c", DDP_UNDER_DETAIL],
                            env={**env, "TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
                            capture_output=True, text=True, timeout=120)
    assert detail.returncode == -signal.SIGSEGV, (detail.returncode, detail.stderr[-2000:])
    script = (FILES / "debugging_excerpt.py").read_text()
    job = (FILES / "debugging_stub.py").read_text()
    for line in ("dist.all_reduce(sums)", "dist.barrier()"):
        assert line in script and line in job, f"the cut-down script keeps {line!r}"


def as_text(answer):
    """An answer as the learner sees it: a script's text, a dict's values, a function's
    source, or the value itself."""
    import inspect
    from pathlib import Path

    if isinstance(answer, Path):
        return answer.read_text()
    if isinstance(answer, dict):
        return repr(sorted(answer.items(), key=str))
    try:
        return inspect.getsource(answer) if callable(answer) else str(answer)
    except OSError:  # a function a cell defined with exec (sgd): its name stands for it
        return repr(answer)


@pytest.mark.parametrize("key", sorted(EXERCISES))
def test_show_solution_prints_the_answer_not_the_code_that_loads_it(key, capsys):
    labs.show_solution(key)
    shown = capsys.readouterr().out
    assert shown.strip(), f"{key}: show_solution printed nothing"
    assert "lambda" not in shown.splitlines()[0] and 'copy("' not in shown, shown[:500]
    exercise = EXERCISES[key]
    stub = as_text(exercise.stub(**exercise.context()))
    assert shown.strip() != stub.strip(), f"{key}: the solution shown is the stub"


def test_every_notebook_has_its_own_test_and_findings_module():
    """notebooks/NN_<slug>.ipynb <-> findings/<slug>.py <-> tests/test_notebook_NN.py."""
    for path in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"):
        number, slug = path.stem[:2], path.stem[3:]
        assert (REPO / "tests" / f"test_notebook_{number}.py").is_file(), path.name
        assert (REPO / "workshop_lib" / "findings" / f"{slug}.py").is_file(), path.name


@pytest.mark.parametrize("flags,option", [
    ("--lr-scaling linear --epochs 200", "--epochs"), ("--epoch=200", "--epochs"),
    ("--lr 0.4", "--lr"), ("--batch 1024", "--batch-size"), ("--seed 3", "--seed"),
    ("--dataset fashion-mnist", "--dataset"), ("--lr-ref-batch 512", "--lr-ref-batch")])
def test_the_challenge_refuses_flags_that_set_its_budget_before_training(flags, option):
    """sweep.run_sweep puts the learner's flags after the budget's and the script takes
    the last: an override would win, so it is refused, abbreviated or not."""
    verdict = challenge.check({"mine": flags})  # refused before any run trains
    assert not verdict.ok and f"sets {option}" in verdict.reason
    assert "\n" not in verdict.reason


def test_the_challenges_own_answers_set_no_budget_flag():
    _, _, common = challenge.settings(profile.get_profile("cpu", "digits"), 16)
    budget = challenge.budget_options(common)
    for answer in [challenge.STUB, challenge.REFERENCE, *challenge.earlier_runs()]:
        for flags in answer.values():
            assert not challenge._options_set_by(flags.split()) & budget, answer
    assert challenge.refusal(challenge.REFERENCE, common) is None
    assert "--lr 0.2" in " ".join(common), "the challenge sits at section 2's hot rate"
    for answer, words in challenge.budget_overrides():
        assert words in challenge.refusal(answer, common)


def sweep_cells_before(notebook, exercise_cell):
    """{sweep folder: {variant: flags}} of the %%bash sweep cells before the exercise's, and
    each cell's common flags (after ``--``), as the cells write them."""
    sweeps, commons = {}, []
    for source in cells(notebook):
        if exercise_cell in source:
            return sweeps, commons
        if source.startswith("%%bash") and "workshop_lib.sweep" in source:
            argv = shlex.split(source.removeprefix("%%bash").replace("\\\n", " "))
            own, common = argv[:argv.index("--")], argv[argv.index("--") + 1:]
            folder = own[own.index("--out") + 1].rpartition("/")[2]
            sweeps[folder] = dict(own[i + 1].split("=", 1) for i, word in enumerate(own)
                                  if word == "--variant")
            commons.append(common)
    raise AssertionError(f"no cell of {notebook} holds {exercise_cell!r}")


def test_the_challenges_earlier_runs_are_notebook_03s_sweep_cells():
    """The refusal reads challenge.NOTEBOOK_SWEEPS: it must be every variant of every sweep
    cell above the challenge, as written, and each cell's common flags only budget (the
    check sets those itself, so the variant is what a learner could copy)."""
    sweeps, commons = sweep_cells_before("03_keeping_accuracy_at_scale",
                                         'labs.check("challenge"')
    assert sweeps == challenge.NOTEBOOK_SWEEPS
    assert set(sweeps) == set(challenge.SECTIONS)
    _, _, common = challenge.settings(profile.get_profile("cpu", "digits"), 16)
    budget = challenge.budget_options(common)
    values = {"DEVICE": "cpu", "DATASET": "digits", "MODEL": "cnn"}
    for flags in commons:
        given = [re.sub(r"\$(\w+)", lambda m: values.get(m[1], "1"), word) for word in flags]
        assert challenge._options_set_by(given) <= budget, flags


CHALLENGE_COMMON = challenge.settings(profile.get_profile("cpu", "digits"), 16)[2]
EARLIER = [(sweep, variant) for sweep, variants in challenge.NOTEBOOK_SWEEPS.items()
           for variant in variants]


@pytest.mark.parametrize("sweep,variant", EARLIER)
def test_the_challenge_refuses_each_run_the_notebook_made_before_it_naming_it(sweep, variant):
    """Refused before anything trains (no baselines passed: a check that trained would take
    minutes here), with the run it copies and what to change."""
    flags = challenge.NOTEBOOK_SWEEPS[sweep][variant].replace(
        "$WARMUP_EPOCHS", str(plans.warmup_epochs(challenge._epochs(CHALLENGE_COMMON))))
    flags = re.sub(r"\$SEED\d", "1", flags)  # the other seeds of the square-root run
    answer = {"mine": re.sub(r"\$\w+", "0.97", re.sub(r"--batch-size \$\w+ ?", "", flags))}
    verdict = challenge.check(answer)
    assert not verdict.ok and "\n" not in verdict.reason
    if "--seed" in flags:  # the square-root run's other seeds: copied, they set the budget
        assert "sets --seed: the budget is the challenge's" in verdict.reason, verdict.reason
        return
    assert f"{challenge.SECTIONS[sweep]}'s {variant}" in verdict.reason, verdict.reason
    assert "change its rule, warmup, optimizer, schedule or momentum" in verdict.reason


@pytest.mark.parametrize("flags,copied", [
    ("--optimizer lars --lr-scaling linear", "large_lars"),             # another order
    ("--lr-scal sqrt", "large_sqrt"),                                  # abbreviated
    ("--lr-scaling=linear --warmup-epochs=3.40", "large_linear_warmup"),  # =value, 3.40
    ("--lr-scaling sqrt --momentum 0.9 --schedule cosine", "large_sqrt"),  # defaults restated
    ("--lr-scaling sqrt --target-accuracy 0.9 --patience 2", "large_sqrt"),  # cut short
    ("--momentum=0.9", "large_same_lr"),                               # the defaults
    ("", "large_same_lr"),
    ("--lr-scaling sqrt --warmup-from zero", "large_sqrt"),       # no warmup to start from
    ("--lr-scaling sqrt --grad-checkpointing", "large_sqrt"),     # recomputes, same steps
    ("--lr-scaling sqrt --channels-last", "large_sqrt"),          # another memory layout
    ("--lr-scaling sqrt --warmup-epochs 0.1", "large_sqrt"),      # rounds to 0 warmup steps
])
def test_the_challenge_refuses_an_earlier_run_however_it_is_spelled(flags, copied):
    verdict = challenge.check({"fine": "--lr-scaling sqrt --warmup-epochs 2", "copy": flags})
    assert not verdict.ok and "run 'copy' repeats" in verdict.reason, verdict.reason
    assert f"'s {copied}" in verdict.reason


@pytest.mark.parametrize("flags", [
    challenge.REFERENCE["sqrt_shorter_step"], "--lr-scaling linear --warmup-epochs 5",
    "--lr-scaling linear --momentum 0.8", "--lr-scaling sqrt --schedule constant",
    "--lr-scaling linear --optimizer lars --warmup-epochs 3", "--lr-scaling none --weight-decay 0",
    "--lr-scaling linear --warmup-epochs 3 --warmup-from zero"])
def test_the_challenge_lets_a_genuinely_different_run_through(flags):
    assert challenge.refusal({"mine": flags}, CHALLENGE_COMMON) is None


def test_labs_check_fails_an_exercise_that_passes_an_earlier_run_or_takes_an_override():
    from workshop_lib.labs.__main__ import prove

    def check(answer):  # passes the solution, and (wrongly) the copied cell and the override
        return labs.Verdict(answer != "stub", "stub is not it")

    lenient = labs.Exercise("k", "nb", "t", "w", check, stub=lambda: "stub",
                            solution=lambda: "solution", stub_reason="not it",
                            earlier_runs=lambda: ["copied cell"],
                            refused=lambda: [("override", "sets --epochs")])
    problems = prove(lenient)[3]
    assert any("'copied cell', a run the notebook made" in p for p in problems)
    assert any("does not refuse 'override'" in p for p in problems)
    plain = labs.Exercise("k", "nb", "t", "w", check, stub=lambda: "stub",
                          solution=lambda: "solution", stub_reason="not it")
    assert prove(plain)[3] == []  # the defaults: no earlier runs, nothing to refuse


def test_stuck_ranks_fails_the_stack_dumps_top_frames_which_are_torchs_not_the_scripts():
    """Copying each dump's first line (torch's work.wait(), its line number in
    distributed_c10d.py, or the logger's wrapper) is not finding the script's line."""
    from workshop_lib.labs import when_things_go_wrong as debugging
    from workshop_lib.labs.__main__ import prove_rules

    answers = debugging.top_frames()
    assert all(line > len(debugging.stub_lines()) for line in answers[0].values())
    for answer in answers:
        verdict = labs.get("stuck_ranks").check(answer)
        assert not verdict.ok and "names no single collective" in verdict.reason, answer
    assert prove_rules(EXERCISES["stuck_ranks"]) == []


def test_debugging_refuses_the_scripts_the_notebook_ran_before_launching_them(monkeypatch,
                                                                             tmp_path):
    """The excerpt the notebook ran under DETAIL and the unchanged hanging job, as they are
    or re-commented, are refused without a torchrun launch (run_job would fail the test)."""
    from workshop_lib.labs import when_things_go_wrong as debugging
    from workshop_lib.labs.__main__ import prove_rules

    def no_launch(*_, **__):
        raise AssertionError("launched the cut-down script")

    monkeypatch.setattr(debugging, "run_job", no_launch)
    excerpt = debugging.mismatch_script(tmp_path / "a.py")
    recommented = tmp_path / "b.py"
    recommented.write_text("# my fix\n" + excerpt.read_text()
                           .replace("import torch\n", "\nimport torch  # ?\n")
                           .replace("dist.barrier()", "dist.barrier( )  # ?"))
    for path in (excerpt, recommented):
        verdict = debugging.check(path)
        assert not verdict.ok and "cut-down script" in verdict.reason, verdict.reason
    unchanged = labs.get("debugging").stub(path=tmp_path / "c.py")
    unchanged.write_text("# looked at it\n" + unchanged.read_text())
    verdict = debugging.check(unchanged)
    assert not verdict.ok and labs.get("debugging").stub_reason in verdict.reason
    assert "unchanged in its code" in verdict.reason
    assert prove_rules(EXERCISES["debugging"]) == []
    assert not debugging.same_code(excerpt.read_text(), (FILES / "debugging_stub.py").read_text())


@pytest.mark.parametrize("job", ["eval_debugging", "debugging"])
def test_a_fixed_job_must_report_its_saved_models_accuracy_and_have_learned(job, monkeypatch,
                                                                             tmp_path):
    """After the launch (stood in for here: it writes what a job would), the fix check
    reads the saved model back: a made-up val_acc, a model that did not learn and a missing
    checkpoint fail; a state saved from the DDP wrapper ("module." keys) is read too."""
    import json
    import types

    import torch

    from workshop_lib import data, models
    from workshop_lib.labs import when_things_go_wrong as debugging

    _, val_set, info = data.load("digits")
    torch.manual_seed(0)
    untrained = models.build("cnn", info)
    scored = debugging.saved_model_accuracy
    writes = {}

    def launched(path, out):
        out.mkdir(parents=True, exist_ok=True)
        state = untrained.state_dict()
        if writes.get("checkpoint") == "wrapper":
            state = {f"module.{k}": v for k, v in state.items()}
        if writes.get("checkpoint"):
            torch.save(state, out / "checkpoint.pt")
            writes["val_acc"] = writes["val_acc"] or scored(out / "checkpoint.pt", val_set,
                                                              info)
        (out / "result.json").write_text(json.dumps({"val_acc": writes["val_acc"],
                                                     "val_samples": len(val_set)}))
        return types.SimpleNamespace(ok=True, seconds=1.0)

    monkeypatch.setattr(debugging, "run_job", launched)
    fix = EXERCISES[job].solution(path=tmp_path / "fix.py")
    for checkpoint, val_acc, reason in [
            ("module", 0.99, "but the model it saved scores"),
            ("module", None, f"under {debugging.LEARNED}"),
            ("wrapper", None, f"under {debugging.LEARNED}"),
            (None, 0.99, "wrote no checkpoint.pt")]:
        writes.update(checkpoint=checkpoint, val_acc=val_acc)
        verdict = EXERCISES[job].check(fix)
        assert not verdict.ok and reason in verdict.reason, (checkpoint, verdict.reason)


def test_the_debugging_copy_guard_ignores_docstrings_and_comments(monkeypatch, tmp_path):
    """The first job's fix with only its docstrings reworded and a comment added is still
    the first job's fix: refused without a launch; a change to the code is not a copy."""
    from workshop_lib.labs import when_things_go_wrong as debugging

    def no_launch(*_, **__):
        raise AssertionError("launched a copy the check must refuse")

    monkeypatch.setattr(debugging, "run_job", no_launch)
    reworded = debugging.with_words_changed(
        debugging.copy("debugging_solution.py", tmp_path / "my_debug_eval_job.py"))
    original = (FILES / "debugging_solution.py").read_text()
    assert reworded.read_text() != original and "Reworded" in reworded.read_text()
    assert debugging.same_code(reworded.read_text(), original)
    verdict = EXERCISES["eval_debugging"].check(reworded)
    assert not verdict.ok and "the first job's fix" in verdict.reason, verdict.reason
    assert not debugging.same_code(original.replace("lr=0.05", "lr=0.04"), original)


@pytest.mark.slow
def test_from_scratch_refuses_a_class_that_hands_the_model_to_torchs_ddp(tmp_path):
    """It trains exactly as DDP does (the old check passed it at 0.0): the job sees the
    learner's class build a DistributedDataParallel and call no collective itself."""
    from workshop_lib.labs import from_one_gpu_to_many as nb02

    verdict = labs.get("from_scratch").check(nb02.write(nb02.WRAPS_DDP,
                                                        tmp_path / "my_naive_ddp.py"))
    assert not verdict.ok and "builds a DistributedDataParallel" in verdict.reason, verdict
    assert verdict.details["collectives"]["sync"] == {}, "DDP's reducer is not the class's"


def challenge_run(reached_at, seed=0, batch=512, collapse=False, epochs=12):
    """A recorded run (runlog.Run) that reaches 0.98 at epoch ``reached_at`` (None: never)
    and stays there, or falls 10 pp two epochs later (``collapse``)."""
    accs = [0.5 if reached_at is None or e < reached_at else 0.98 for e in range(1, epochs + 1)]
    if collapse:
        accs[reached_at + 1] = 0.88
    return runlog.Run(start={"global_batch_size": batch, "lr": 0.8, "device": "cpu",
                             "steps_per_epoch": 3, "warmup_steps": 0,
                             "args": {"seed": str(seed)}},
                      epochs=[{"epoch": e, "val_acc": acc, "epoch_s": 1.0,
                               "samples_per_s": 1000.0, "train_loss": 0.1}
                              for e, acc in enumerate(accs, 1)], end={})


SQRT_SEEDS = {"baseline_small": challenge_run(2, batch=32),
              "baseline_large_linear": challenge_run(None),
              "baseline_large_sqrt": challenge_run(11), "baseline_large_sqrt_seed2":
              challenge_run(10, seed=1), "baseline_large_sqrt_seed3": challenge_run(10, seed=2)}


def judged(monkeypatch, answer, trained, baselines=SQRT_SEEDS, **context):
    """The challenge's check of ``answer`` with ``trained`` ({run folder: Run}) as what the
    sweep trained: the decision alone, in milliseconds; the sweeps' flags are returned."""
    asked = []

    def sweep(out, runs, common, **_):
        asked.extend((name, [*common, *flags]) for name, flags in runs)
        return {name: trained[name] for name, _ in runs}

    monkeypatch.setattr(challenge.sweep, "run_sweep", sweep)
    return challenge.check(answer, baselines=dict(baselines), **context), asked


GOOD = "--lr-scaling sqrt --momentum 0.8 --warmup-epochs 1"


def test_the_challenge_passes_a_run_that_beats_the_square_root_run_on_every_seed(monkeypatch):
    trained = {"mine": challenge_run(9), "mine_seed2": challenge_run(8, seed=1),
               "mine_seed3": challenge_run(7, seed=2)}
    verdict, asked = judged(monkeypatch, {"mine": GOOD}, trained, seed=5)
    assert verdict.ok, verdict.reason
    assert "at epoch 9, 8, 7 on seeds 5, 6, 7" in verdict.reason
    assert "(epochs 11, 10, 10; the bar: epoch 9)" in verdict.reason
    assert [flags[flags.index("--seed", flags.index("--batch-size")) + 1]
            for _, flags in asked] == ["5", "6", "7"]  # the notebook's seed, and the next two
    assert verdict.details["seed_epochs"] == {"mine": [9, 8, 7]}


@pytest.mark.parametrize("mine,why", [
    ([10, 8, 7], "not before the earliest seed's epoch 10"),
    ([7, 8, 9], "the seed it collapses on"),
    ([9, None, 7], "a seed that never reaches it")])
def test_the_challenge_fails_a_run_that_wins_on_some_seeds_only(monkeypatch, mine, why):
    collapses = why.startswith("the seed")  # on seed 1
    trained = {f"mine{suffix}": challenge_run(epoch, seed=i, collapse=collapses and i == 1)
               for i, (suffix, epoch) in enumerate(zip(("", "_seed2", "_seed3"), mine,
                                                       strict=True))}
    verdict, _ = judged(monkeypatch, {"mine": GOOD}, trained)
    assert not verdict.ok, why
    assert "by epoch 9, before section 2's square-root run on any of its seeds" in \
        verdict.reason
    assert "mine: reached it at epoch " + ", ".join(str(e or "never") for e in mine) in \
        verdict.reason


@pytest.mark.parametrize("name", ["mine_seed2", "baseline_mine", "my run", "../up"])
def test_the_challenge_refuses_a_run_name_the_check_uses_for_its_own_runs(monkeypatch, name):
    verdict, asked = judged(monkeypatch, {name: GOOD}, {})
    assert not verdict.ok and f"run name {name!r}" in verdict.reason and not asked


def test_the_challenge_without_the_square_root_seeds_judges_holding_alone(monkeypatch):
    """Baselines from a notebook before the seeds (small and linear only): no bar, and the
    failing verdict's hint does not need the square-root run."""
    older = {name: SQRT_SEEDS[name] for name in ("baseline_small", "baseline_large_linear")}
    holds = {"mine": challenge_run(11), "mine_seed2": challenge_run(11, seed=1),
             "mine_seed3": challenge_run(11, seed=2)}
    verdict, _ = judged(monkeypatch, {"mine": GOOD}, holds, baselines=older)
    assert verdict.ok and verdict.details["bar_epoch"] is None, verdict.reason
    never = {name: challenge_run(None) for name in holds}
    verdict, _ = judged(monkeypatch, {"mine": GOOD}, never, baselines=older)
    assert not verdict.ok and "linear rule's run did not hold the target" in verdict.reason
    # A square-root run that reached it in its first epoch leaves no sooner epoch: holding wins
    first = {**SQRT_SEEDS, "baseline_large_sqrt_seed2": challenge_run(1, seed=1)}
    assert challenge.bar_epoch(first, 0.97) is None
