"""Every notebook's plan on machines this one is not: no GPU, 1, 2, 4, 6 and 8 GPUs, each
under profile "auto" and profile "cpu", with and without Fashion-MNIST downloaded.

Nothing runs: each notebook's launches come from ``workshop_lib.plans`` (the functions its
cells call, with the defaults of its parameters cell), and each is checked against the
machine: no GPU and no NCCL under profile "cpu", never more GPU processes than GPUs, every
rank a shard, the largest batch of a sweep 100 optimizer steps, every fault inside its run.
The notebooks themselves are read too: they decide nothing from ``hardware.detect()``, and
every course script they launch from Python names its device.
"""
import ast
import functools
import math
import re
from pathlib import Path

import nbformat
import pytest

from conftest import REPO
from workshop_lib import data, hardware, nodes, plans, profile, shards
from workshop_lib.errors import CourseError
from workshop_lib.hardware import Machine

NOTEBOOKS = REPO / "notebooks"
MACHINES = {f"{gpus} GPUs": Machine(gpus=gpus, gpu_names=("NVIDIA A100-SXM4-80GB",) * gpus,
                                    gpu_memory_gib=(79.2,) * gpus, listed_gpus=gpus,
                                    driver="580.65.06", torch_cuda="13.0",
                                    cpu_cores=16 * max(gpus, 1))
            for gpus in (0, 1, 2, 4, 6, 8)}
SHAPES = [(machine, name) for machine in MACHINES for name in ("auto", "cpu")]


@pytest.fixture(params=["no_fashion", "with_fashion"])
def data_dir(request, tmp_path):
    if request.param == "with_fashion":
        raw = data.fashion_mnist_raw_dir(tmp_path)
        raw.mkdir(parents=True)
        for name in data.FASHION_MNIST_FILES:
            (raw / name).write_bytes(b"")
    return tmp_path


@functools.cache
def notebook_cells(notebook):
    return nbformat.read(NOTEBOOKS / f"{notebook}.ipynb", as_version=4).cells


def parameters(notebook):
    """The defaults of a notebook's parameters cell: {name: value}."""
    cells = notebook_cells(notebook)
    (cell,) = [c for c in cells if "parameters" in c.metadata.get("tags", [])]
    return {target.id: ast.literal_eval(node.value) for node in ast.parse(cell.source).body
            if isinstance(node, ast.Assign) for target in node.targets}


def profiles(machine_name, name, data_dir):
    """(one-device profile, DDP-launch profile) of a notebook on that machine."""
    def get(launches):
        return profile.get_profile(name, machine=MACHINES[machine_name], launches=launches,
                                   data_dir=data_dir)
    return get(profile.ONE_DEVICE), get(profile.PROCESSES)


def every_plan(one, ddp):
    """Each notebook's plan, with its own parameters' defaults, and the profile it was made
    from (the one its notebook sets up): {notebook: (profile, plan)}."""
    return plans.every_notebook(one, ddp, parameters)


# The plan function each notebook's cells call (notebooks 00, 02 and 07 launch with the
# profile's $NPROC and $DDP_DEVICE alone: their plans describe those cells).
CALLED = {"01_sgd_and_batch_size": "plans.batch_size_sweep(P, ",
          "03_keeping_accuracy_at_scale": "plans.accuracy_at_scale(P, ",
          "04_when_things_go_wrong": "plans.failures(P)",
          "05_worked_example": "plans.worked_example(P, ",
          "06_beyond_one_machine": "plans.beyond(P, "}


@pytest.mark.parametrize("machine_name,name", SHAPES)
def test_every_launch_fits_the_machine_and_the_profile(machine_name, name, data_dir):
    machine = MACHINES[machine_name]
    one, ddp = profiles(machine_name, name, data_dir)
    for notebook, (used, plan) in every_plan(one, ddp).items():
        for launch in plans.launches_of(plan):
            where = f"{notebook} {launch.name} on {machine_name}, profile {name}"
            assert launch.device in ("cpu", "cuda"), where
            if name == "cpu" or not machine.gpus:
                assert launch.device == "cpu" and launch.backend != "nccl", where
            if launch.device == "cuda":
                # One GPU per process, and each node its own share of the GPUs.
                assert launch.processes <= machine.gpus, where
                assert launch.processes // launch.nodes <= machine.gpus // launch.nodes, where
            if launch.backend is not None:
                assert launch.backend == hardware.backend_for(launch.device), where
            assert launch.processes >= 1 and launch.processes % launch.nodes == 0, where
            if launch.batch_size is not None:  # a global batch the dataset can fill
                assert launch.batch_size * launch.processes <= data.DATASETS[
                    used.dataset].train_size, where
            if launch.steps is not None:
                assert launch.steps >= 1, where


@pytest.mark.parametrize("machine_name,name", SHAPES)
def test_the_largest_batch_of_every_sweep_gets_100_steps(machine_name, name, data_dir):
    one, ddp = profiles(machine_name, name, data_dir)
    found = every_plan(one, ddp)
    _, sweep = found["01_sgd_and_batch_size"]
    assert sweep.batches[0] == one.batch_size and sweep.largest == one.batch_size * parameters(
        "01_sgd_and_batch_size")["batch_scale"]
    _, at_scale = found["03_keeping_accuracy_at_scale"]
    swept = [launch for launch in [*sweep.launches, *at_scale.launches]
             if launch.name in ("batch_size", "base_lr", "hot_lr", "challenge")]
    assert len(swept) == 4
    for launch in swept:  # at its largest batch
        assert launch.steps >= profile.MIN_SWEEP_STEPS, (launch, machine_name, name)


@pytest.mark.parametrize("machine_name,name", SHAPES)
def test_every_fault_of_notebook_04_fires_inside_its_run(machine_name, name, data_dir):
    _, ddp = profiles(machine_name, name, data_dir)
    plan = plans.failures(ddp)
    total = plan.epochs * plan.steps_per_epoch
    assert plan.last_rank == ddp.nproc - 1
    for kind, epoch in (("raise", 1), ("hang", 1), ("kill", 2)):
        spec = plan.fault(kind, epoch)
        rank, step = map(int, spec.split("@")[1].split(":"))
        assert rank < ddp.nproc and 0 <= step < total, spec
        if kind == "kill":  # after the first epoch's checkpoint: the restart resumes
            assert step >= plan.steps_per_epoch, spec


@pytest.mark.parametrize("machine_name,name", SHAPES)
def test_notebook_06_deals_every_rank_a_shard_and_its_demo_stays_uneven(machine_name, name,
                                                                         data_dir):
    _, ddp = profiles(machine_name, name, data_dir)
    plan = plans.beyond(ddp, parameters("06_beyond_one_machine")["num_shards"])
    info = data.DATASETS[ddp.dataset]
    # Section 1: the dataset's shards, dealt by the course's own schedule and loader
    # (they raise where there are fewer shards than ranks). Validation: 359 digits.
    for split, samples in (("train", info.train_size), ("val", 359)):
        counts = tuple(shards.shard_counts(samples, plan.num_shards))
        schedule = shards.ShardSchedule(shards.Split(Path("unused"), split, counts),
                                        rank=0, world_size=ddp.nproc, seed=0)
        assert len(shards.ShardLoader(schedule, ddp.batch_size, "cpu")) >= 1
    if ddp.nproc < 2:
        return
    # Section 2: the uneven demo (batches of 32): the ranks' step counts differ.
    counts = tuple(shards.shard_counts(info.train_size, plan.uneven_shards))
    schedule = shards.ShardSchedule(shards.Split(Path("unused"), "train", counts), rank=0,
                                    world_size=ddp.nproc, seed=0, equal_steps=False)
    shares, _ = schedule.epoch_plan()
    batches = [math.ceil(n / 32) for n in schedule.samples_per_rank(shares)]
    assert len(set(batches)) > 1 and min(batches) >= 1, batches
    # Sections 3 and 4: two nodes on the profile's DDP device, each its own GPUs.
    visible = [str(i) for i in range(MACHINES[machine_name].gpus)]
    per_node, envs = nodes.node_envs(plans.NODES, plan.node_nproc, visible, ddp.ddp_device)
    assert per_node == plan.node_nproc
    given = [env["CUDA_VISIBLE_DEVICES"] for env in envs]
    if ddp.ddp_device == "cpu":
        assert given == [""] * plans.NODES, "a CPU job's agents see no GPU"
    else:
        gpus = [g for env in given for g in env.split(",")]
        assert len(gpus) == len(set(gpus)) == plans.NODES * per_node


@pytest.mark.parametrize("machine_name,name", SHAPES)
def test_dataparallel_runs_on_the_profiles_gpus_only(machine_name, name, data_dir):
    machine = MACHINES[machine_name]
    one, _ = profiles(machine_name, name, data_dir)
    plan = plans.worked_example(one, parameters("05_worked_example")["epochs"])
    if name == "cpu" or machine.gpus < 2:
        assert plan.dataparallel_gpus == 0 and plan.dataparallel_skip
    else:
        assert plan.dataparallel_gpus == machine.gpus and plan.dataparallel_skip is None


def test_hot_rate_is_the_same_02_at_every_profiles_reference_batch():
    """Notebook 03's hot rate follows the profile: 20x digits' 0.01, 4x the Wide ResNet's
    0.05 (20x would start it at 1.0 with momentum 0.9)."""
    for sizes in profile.SIZES.values():
        assert sizes.hot_factor * sizes.lr == pytest.approx(0.2)
    assert profile.SIZES[("cpu", "digits")].hot_factor == 20


def test_the_assessment_grades_on_the_gpus_it_has(monkeypatch):
    """The engine that grades notebook 02's conversion and the assessment: one process per
    GPU with NCCL on two or more, else two CPU processes. (Their sizes belong to the engine's
    ``Config``; ``plans.conversion_check`` is where they join the plans above.)"""
    from workshop_lib.labs import from_one_gpu_to_many as conversion

    engine = conversion.engine()
    monkeypatch.delenv(engine.NPROC_ENV, raising=False)
    for gpus in (0, 1, 2, 4, 6, 8):
        monkeypatch.setattr(engine, "visible_gpus", lambda gpus=gpus: gpus)
        processes, on_gpu = engine.process_layout()
        assert on_gpu == (gpus >= 2)
        assert processes == (gpus if on_gpu else engine.CPU_PROCESSES)


def test_nodes_on_the_cpu_hide_the_gpus_and_gpu_nodes_split_them():
    per_node, envs = nodes.node_envs(2, 1, ["0", "1", "2", "3"], device="cpu")
    assert per_node == 1 and [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["", ""]
    per_node, envs = nodes.node_envs(2, 3, [str(i) for i in range(6)], device="cuda")
    assert per_node == 3 and [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0,1,2", "3,4,5"]
    with pytest.raises(CourseError, match="needs at least 4 GPUs; this machine has 2"):
        nodes.node_envs(2, 2, ["0", "1"], device="cuda")


def test_a_shard_count_below_the_ranks_is_one_clear_error(tmp_path):
    ddp = profile.get_profile("auto", machine=MACHINES["8 GPUs"], launches=profile.PROCESSES,
                              data_dir=tmp_path)
    with pytest.raises(CourseError, match="num_shards is 5, fewer than the 8 ranks"):
        plans.beyond(ddp, 5)


def code_cells(notebook):
    return [c.source for c in notebook_cells(notebook)
            if c.cell_type == "code" and not c.source.startswith("%%")]


ALL_NOTEBOOKS = sorted(p.stem for p in NOTEBOOKS.glob("[0-9]*.ipynb"))


@pytest.mark.parametrize("notebook", ALL_NOTEBOOKS)
def test_notebooks_decide_from_the_profile_not_the_machine(notebook):
    source = "\n".join(code_cells(notebook))
    assert "hardware.detect" not in source and "torch.cuda" not in source, (
        f"{notebook}: a launch decision from the machine, not from the profile P")
    if notebook in CALLED:
        assert CALLED[notebook] in source, f"{notebook} takes its plan from {CALLED[notebook]}"


COURSE_SCRIPT = re.compile(r"workshop_lib\.(train|train_ddp|sweep|equivalence|trace)")


@pytest.mark.parametrize("notebook", ALL_NOTEBOOKS)
def test_every_python_launch_names_its_device(notebook):
    """A course script launched from Python (a list like ["-m", "workshop_lib.train_ddp",
    ...]) says ``--device``, itself or in a list it spreads (``*TRAINING``)."""
    trees = [ast.parse(source) for source in code_cells(notebook)]
    lists = {target.id: node.value for tree in trees for node in ast.walk(tree)
             if isinstance(node, ast.Assign) and isinstance(node.value, ast.List)
             for target in node.targets if isinstance(target, ast.Name)}

    def says_device(node):
        for item in node.elts:
            if isinstance(item, ast.Constant) and item.value == "--device":
                return True
            if (isinstance(item, ast.Starred) and isinstance(item.value, ast.Name)
                    and item.value.id in lists and says_device(lists[item.value.id])):
                return True
        return False

    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.List) and any(
                    isinstance(item, ast.Constant) and isinstance(item.value, str)
                    and COURSE_SCRIPT.fullmatch(item.value) for item in node.elts):
                assert says_device(node), f"{notebook}: {ast.unparse(node)}"


def test_the_rank_tag_of_the_browser_test_reads_gpu_devices_too():
    import torch
    from test_browser import RANK_TAG

    for device in (torch.device("cpu"), torch.device("cuda", 0), torch.device("cuda", 7)):
        line = f"[rank 7/8] {device} samples=7500 steps=59 threads=0"  # train_ddp's format
        assert RANK_TAG.findall(line) == [("7", "8")], line


@pytest.mark.parametrize("machine_name,name", SHAPES)
def test_notebook_03s_warmup_is_at_most_a_tenth_of_its_run(machine_name, name, data_dir):
    """Its warmup runs take the plan's warmup, a tenth of the sweep's epochs or less, at the
    notebook's epochs and at the one-process test's shortest sweep (Goyal et al. warm up for
    5 of 90 epochs); no warmup in its cells is a number the plan did not size."""
    one, _ = profiles(machine_name, name, data_dir)
    for epochs in (None, 6):
        plan = plans.accuracy_at_scale(one, 16, epochs)
        assert 0 < plan.warmup_epochs <= plan.epochs * plans.WARMUP_SHARE, plan
    cells = "\n".join(c.source for c in notebook_cells("03_keeping_accuracy_at_scale"))
    assert cells.count("--warmup-epochs $WARMUP_EPOCHS") == 1  # section 2's warmup run
    assert not re.search(r"--warmup-epochs \d", cells), "a warmup the plan did not size"


def test_notebook_03s_rescue_verdicts_rest_on_the_seeds_it_states():
    """The rescue verdicts' bar is the square-root run's seed spread: the hot sweep trains
    that run on each seed the findings name (SPREAD_SEEDS), each a distinct seed from the
    notebook's, the notebook says so, its plan counts the runs, and the challenge's
    baselines take every one of them."""
    from workshop_lib.findings import keeping_accuracy_at_scale as nb03

    cells = notebook_cells("03_keeping_accuracy_at_scale")
    sweep = next(c.source for c in cells if "--out $RUNS/hot_lr" in c.source)
    seeds = [re.search(rf'--variant {name}="[^"]*?(?:--seed (\$\w+))?"', sweep)
             for name in nb03.SPREAD_SEEDS]
    assert all(seeds), "each of the square-root run's seeds is a variant of the hot sweep"
    given = [m[1] or "$SEED" for m in seeds]  # the first takes the sweep's own --seed $SEED
    assert len(set(given)) == len(nb03.SPREAD_SEEDS) == 3, given
    setup = next(c.source for c in cells if "notebook.export(" in c.source and "SEED2" in c.source)
    assert "SEED2=seed + 1, SEED3=seed + 2" in setup
    assert sweep.count("--variant ") == plans.HOT_LR_RUNS
    text = "\n".join(c.source for c in cells)
    assert "the square-root run is trained on three seeds" in " ".join(text.split())
    assert "for name in findings.SPREAD_SEEDS" in text  # the challenge's baselines
