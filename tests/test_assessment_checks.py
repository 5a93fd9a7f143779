"""The assessment's grader, piece by piece, in well under a second each: no torchrun, no
nbgrader run.

- every ``check_<grade id>`` of ddp_checks.py on hand-built records: the passing case and
  one case per mistake that the round trip (test_assessment.py) grades, with its reason;
- the pass mark, and that the notebook, its grade ids and points agree with ddp_checks.py;
- ddp_recorder.py run in this process on a two-epoch toy script (no process group), which
  pins the private DataLoader hooks it relies on at the torch version in use;
- autograde_guard.py's script-cell rule, and where nbgrader_config.py puts the guards;
- export_grades.py on a small gradebook.
"""
import base64
import contextlib
import importlib.util
import inspect
import io
import json
import random
import re
import sys
import types
from array import array
from pathlib import Path

import nbformat
import pytest

from conftest import REPO

ASSESSMENT = REPO / "assessment"
SOURCE = ASSESSMENT / "source" / "ddp_refactor"
NOTEBOOK = SOURCE / "ddp_refactor.ipynb"


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


ddp_checks = load("assessment_ddp_checks", SOURCE / "ddp_checks.py")
ddp_recorder = load("assessment_ddp_recorder", SOURCE / "ddp_recorder.py")

# A small job that does everything right: 2 ranks, 2 epochs, 26 training samples in
# batches of 4 (DistributedSampler pads to 13 per rank: one repeat), 2 batches per optimizer
# step, 8 validation samples.
WORLD, EPOCHS, BATCH, ACCUMULATE, N_TRAIN, N_VAL, LR = 2, 2, 4, 2, 26, 8, 0.05
CONFIG = ddp_checks.Config(epochs=EPOCHS, batch_size=BATCH, accumulate=ACCUMULATE, lr=LR,
                           seed=0, target_accuracy=0.85)
PARAMS = [0.5, -1.25, 2.0, 0.0]


def batches(indices, size=BATCH, drop_last=False):
    cut = len(indices) - len(indices) % size if drop_last else len(indices)
    return [indices[i:i + size] for i in range(0, cut, size)]


def sampler_shard(epoch, rank, drop_last=False, world=WORLD):
    """What DistributedSampler(shuffle=True) gives a rank: a slice of an epoch's
    permutation, padded (or trimmed, drop_last) to a multiple of the world size."""
    order = random.Random(epoch).sample(range(N_TRAIN), N_TRAIN)
    if drop_last:
        order = order[:N_TRAIN - N_TRAIN % world]
    else:
        order += order[:(-N_TRAIN) % world]
    return order[rank::world]


def steps_taken(passes, accumulate=ACCUMULATE):
    """The batches each optimizer step takes over ``passes``: ``accumulate`` each, an
    epoch's last step those left."""
    return [min(accumulate, len(p["batches"]) - first) for p in passes
            if p["split"] == "train" for first in range(0, len(p["batches"]), accumulate)]


def steps_follow_the_passes(run):
    """A job's optimizer steps, each of ACCUMULATE batches, after a test changed its
    passes."""
    run.ranks[0]["replay"]["micro_batches"] = [steps_taken(r["passes"]) for r in run.ranks]


def params_b64(values):
    return base64.b64encode(array("f", values).tobytes()).decode()


def good_run(tmp_path, world=WORLD, on_gpu=False, pass_s=0.5, config=CONFIG):
    """The records of a correct job of ``world`` ranks, each pass over the training set
    taking ``pass_s`` seconds."""
    out = tmp_path / "grading_run" / "out"
    out.mkdir(parents=True, exist_ok=True)
    losses = [0.1 * (i + 1) for i in range(N_VAL)]
    correct = [1] * (N_VAL - 1) + [0]
    ranks = []
    for rank in range(world):
        passes = []
        for epoch in range(config.epochs):
            passes.append({"split": "train", "seconds": pass_s,
                           "batches": batches(sampler_shard(epoch, rank, world=world))})
            passes.append({"split": "val", "batches": [list(range(rank, N_VAL, world))],
                           "seconds": 0.01})
        ranks.append({
            "rank": rank, "error": None, "data_loaded": True, "n_train": N_TRAIN,
            "passes": passes, "process_group_size": world, "lrs": [LR * world] * 8,
            "writes": [str(out / "log.jsonl"), str(out / "checkpoint.pt")] if rank == 0 else [],
            "metric_lines": ["epoch  2/2  val_loss 0.4500  val_acc 0.8750"] if rank == 0 else [],
            "stdout": [], "model": {"found": True, "params_b64": params_b64(PARAMS)},
            "val_eval": {"loss": losses, "correct": correct},
            "checkpoint": {"saved": True, "loads": True, "matches_final": True,
                           "problem": ""} if rank == 0 else {"saved": False},
        })
    # Every step matched: the summed and local replays are made only for a segment that
    # does not.
    ranks[0]["replay"] = {"steps": 8, "shared": 0, "shared_steps": 8,
                          "micro_batches": [steps_taken(r["passes"]) for r in ranks],
                          "samples": [8 * BATCH] * world, "optimizer_end_gap": [0.0] * world,
                          "ranks": [{"start": 0.0, "averaged": 3e-7, "summed": None,
                                     "local": None} for _ in range(world)]}
    (out / "log.jsonl").write_text(json.dumps(
        {"epoch": 2, "val_loss": sum(losses) / N_VAL, "val_acc": sum(correct) / N_VAL}) + "\n")
    (out / "checkpoint.pt").write_bytes(b"saved")
    return ddp_checks.Run(script="train_digits_ddp.py", config=config, nproc=world,
                          on_gpu=on_gpu, time_limit_s=60, returncode=0, ranks=ranks,
                          out_dir=out)


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return good_run(tmp_path)


def check(grade_id, run):
    """The check's PASS line, or the reason it gives for failing."""
    output = io.StringIO()
    try:
        with contextlib.redirect_stdout(output):
            ddp_checks.CHECKS[grade_id](run)
    except ddp_checks.RequirementNotMet as reason:
        return f"FAIL: {reason}"
    return output.getvalue().strip()


def failing(run):
    return {grade_id for grade_id in ddp_checks.REQUIREMENTS
            if check(grade_id, run).startswith("FAIL")}


# -- the passing case ------------------------------------------------------------------

def test_a_correct_job_meets_every_requirement_and_passes(run):
    for grade_id in ddp_checks.REQUIREMENTS:
        assert check(grade_id, run).startswith("PASS: "), grade_id
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert ddp_checks.report(run) == (12, True)
    assert "Total: 12 of 12 points" in printed.getvalue()
    assert "Result: PASSED" in printed.getvalue()


# -- one case per mistake the round trip grades ----------------------------------------

def test_overlapping_shards_fail_cover(run):
    for rank, record in enumerate(run.ranks):  # every rank draws everything, shuffled apart
        for epoch, p in enumerate(r for r in record["passes"] if r["split"] == "train"):
            p["batches"] = batches(random.Random(10 * epoch + rank).sample(range(N_TRAIN),
                                                                           N_TRAIN))
    steps_follow_the_passes(run)
    assert failing(run) == {"shards_disjoint_and_cover"}
    assert "the ranks train on overlapping data" in check("shards_disjoint_and_cover", run)


def no_sampler(run):
    """DDP without a sampler: every rank shuffles the whole set with the same seed, so
    the ranks draw the same batches, and the replay finds every sample of the first steps
    on every rank (its local and averaged replays are then the same)."""
    for record in run.ranks:
        for epoch, p in enumerate(r for r in record["passes"] if r["split"] == "train"):
            p["batches"] = batches(random.Random(epoch).sample(range(N_TRAIN), N_TRAIN))
    steps_follow_the_passes(run)
    run.ranks[0]["replay"].update(shared=3 * BATCH, samples=[3 * BATCH] * WORLD)
    for result in run.ranks[0]["replay"]["ranks"]:
        result.update(averaged=2e-7, local=2e-7)


def test_ddp_without_a_sampler_does_not_pass_and_says_why(run):
    no_sampler(run)
    assert failing(run) == {"shards_disjoint_and_cover", "gradients_averaged_over_ranks"}
    assert "Give each rank its own shard (DistributedSampler)" in check(
        "shards_disjoint_and_cover", run)
    reason = check("gradients_averaged_over_ranks", run)
    assert "the ranks trained on the same samples" in reason
    assert "Give each rank its own shard (DistributedSampler)" in reason
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert ddp_checks.report(run) == (7, False)
    assert "Not passed without shards_disjoint_and_cover and " \
           "gradients_averaged_over_ranks" in printed.getvalue()


def test_copies_without_a_process_group_do_not_pass_and_say_why(run):
    """A single-device script with its I/O on rank 0 and the rate times WORLD_SIZE, but no
    process group, no DDP, no sampler: N identical trainings."""
    no_sampler(run)
    for record in run.ranks:
        record["process_group_size"] = 1
    assert failing(run) == {"shards_disjoint_and_cover", "gradients_averaged_over_ranks"}
    reason = check("gradients_averaged_over_ranks", run)
    assert "in a process group of 1 process, not of the job's 2" in reason
    assert "dist.init_process_group was never called" in reason
    assert "DistributedDataParallel" in reason
    assert not ddp_checks.passes(set(ddp_checks.REQUIREMENTS) - failing(run))


def test_samples_the_sampler_repeats_to_pad_are_no_shared_training(run):
    run.ranks[0]["replay"]["shared"] = WORLD - 1  # DistributedSampler's padding at most
    assert check("gradients_averaged_over_ranks", run).startswith("PASS")
    run.ranks[0]["replay"]["shared"] = WORLD
    assert "the ranks trained on the same samples" in check("gradients_averaged_over_ranks",
                                                            run)


def test_same_order_every_epoch_fails_reshuffling(run):
    for record in run.ranks:  # no set_epoch: epoch 0's permutation every epoch
        first = next(p for p in record["passes"] if p["split"] == "train")["batches"]
        for p in record["passes"]:
            if p["split"] == "train":
                p["batches"] = first
    assert failing(run) == {"shards_reshuffled_each_epoch"}
    assert "call set_epoch(epoch)" in check("shards_reshuffled_each_epoch", run)


@pytest.mark.parametrize("mistake, reason", [
    ("summed", "gradients are summed, not averaged"),
    ("local", "each rank stepped on its own gradients"),
])
def test_gradients_not_averaged_are_named(run, mistake, reason):
    run.ranks[0]["replay"]["segment"] = [1, 8]
    for result in run.ranks[0]["replay"]["ranks"]:
        result.update({"averaged": 0.6, "summed": 0.5, "local": 0.6, mistake: 1e-7})
    assert failing(run) == {"gradients_averaged_over_ranks"}
    assert reason in check("gradients_averaged_over_ranks", run)
    assert check("gradients_averaged_over_ranks", run).startswith(
        "FAIL: in optimizer steps 1-8 (of 8) ")


def test_a_step_after_every_batch_fails_the_accumulation_with_its_batches(run):
    """The flag --accumulate added but ignored: DDP averages every step, and the replay
    matches, but each step took one batch, not the graded run's two."""
    replay = run.ranks[0]["replay"]
    replay["micro_batches"] = [steps_taken(r["passes"], accumulate=1) for r in run.ranks]
    assert failing(run) == {"gradients_averaged_over_ranks"}
    reason = check("gradients_averaged_over_ranks", run)
    assert reason.startswith("FAIL: rank 0's optimizer steps took 1 batch(es) of train_set "
                             "each (step 1 took 1, expected 2): the graded run passes "
                             "--accumulate 2")


def test_an_epochs_last_step_takes_the_batches_left(tmp_path, monkeypatch):
    """Three ranks: 9 samples each, 3 batches an epoch, steps of 2 batches and 1."""
    monkeypatch.chdir(tmp_path)
    run = good_run(tmp_path, world=3)
    assert run.ranks[0]["replay"]["micro_batches"][0] == [2, 1, 2, 1]
    assert check("gradients_averaged_over_ranks", run).startswith("PASS")
    run.ranks[0]["replay"]["micro_batches"][2] = [2, 2, 2]  # across the epoch's end
    assert "rank 2's optimizer steps took 2 batch(es) of train_set each (step 2 took 2, " \
        "expected 1)" in check("gradients_averaged_over_ranks", run)


def test_gradients_summed_over_the_steps_batches_are_named(run):
    """At 2 ranks and 2 batches a step, batches summed and ranks summed give the same
    gradient: the reason names both."""
    run.ranks[0]["replay"]["segment"] = [1, 8]
    for result in run.ranks[0]["replay"]["ranks"]:
        result.update({"averaged": 0.6, "summed": 1e-7, "local": 0.6})
    assert "and each batch's loss by the number of batches its step accumulates " \
        "(--accumulate 2)" in check("gradients_averaged_over_ranks", run)


def test_a_job_that_stops_averaging_late_fails_in_that_segment(run):
    """Every step is replayed: a job that averages its gradients for most of the run and
    then lets each rank step alone fails in the segment where it stopped."""
    replay = run.ranks[0]["replay"]
    replay.update(steps=1080, segment=[1073, 1080])
    for result in replay["ranks"]:
        result.update(averaged=0.4, summed=0.9, local=3e-7)
    reason = check("gradients_averaged_over_ranks", run)
    assert reason.startswith("FAIL: in optimizer steps 1073-1080 (of 1080) each rank's "
                             "parameters equal a replay of its own batches alone")
    assert "or averaging only some steps, is not the same" in reason


def test_ranks_whose_optimizer_state_ends_apart_fail(run):
    """Parameters averaged after one last step of each rank's own equal the averaged step
    (SGD is linear in the gradient), but each rank's momentum is its own."""
    run.ranks[0]["replay"]["optimizer_end_gap"] = [0.0, 0.03]
    assert failing(run) == {"gradients_averaged_over_ranks"}
    assert "rank 1's optimizer state (its momentum) differs from rank 0's" in check(
        "gradients_averaged_over_ranks", run)


def test_ranks_starting_apart_miss_a_broadcast(run):
    run.ranks[0]["replay"]["ranks"][1].update(start=0.3, averaged=0.4)
    assert "started training from different parameters" in check(
        "gradients_averaged_over_ranks", run)


def test_another_replay_mismatch_says_by_how_much(run):
    run.ranks[0]["replay"]["segment"] = [1, 8]
    run.ranks[0]["replay"]["ranks"][1].update(averaged=0.25, summed=0.3, local=0.3)
    assert "rank 1's parameters differ from a single-process replay of the same global " \
           "batches by 0.25 of a step's update" in check("gradients_averaged_over_ranks", run)


def test_ranks_that_drift_apart_later_fail(run):
    run.ranks[1]["model"]["params_b64"] = params_b64([0.5, -1.25, 2.0, 0.01])
    assert "after training rank 1's parameters differ from rank 0's" in check(
        "gradients_averaged_over_ranks", run)


def test_a_replay_the_recorder_could_not_do_fails_with_its_reason(run):
    run.ranks[0]["replay"] = {"problem": "rank 1 made 7 optimizer steps and rank 0 8: "
                                         "every rank must take the same steps."}
    assert check("gradients_averaged_over_ranks", run) == (
        "FAIL: the training steps could not be checked: rank 1 made 7 optimizer steps and "
        "rank 0 8: every rank must take the same steps.")


def test_checkpoint_written_by_every_rank_fails_rank0_only(run):
    run.ranks[1]["writes"] = [str(run.out_dir / "checkpoint.pt")]
    assert failing(run) == {"rank0_only_logs_and_writes"}
    assert "rank 1 wrote out/checkpoint.pt" in check("rank0_only_logs_and_writes", run)


def test_table_printed_by_every_rank_fails_rank0_only(run):
    run.ranks[1]["metric_lines"] = run.ranks[0]["metric_lines"]
    assert "rank 1 printed the per-epoch table too, on stdout" in check(
        "rank0_only_logs_and_writes", run)


def test_the_table_on_stderr_counts_and_the_check_says_so(run):
    """logging writes to stderr: rank 0's table there meets requirement 5, and the PASS
    line says where it was found; another rank's table there fails it."""
    for record in run.ranks:
        record["stderr_metric_lines"], record["metric_lines"] = record["metric_lines"], []
    verdict = check("rank0_only_logs_and_writes", run)
    assert verdict.startswith("PASS: only rank 0 printed the table (on stderr, where "
                              "logging writes: stdout and stderr both count)")
    run.ranks[1]["stderr_metric_lines"] = ["INFO:root:epoch 2 val_loss=0.45 val_acc=0.875"]
    assert "rank 1 printed the per-epoch table too, on stderr" in check(
        "rank0_only_logs_and_writes", run)


@pytest.mark.parametrize("line, table", [
    ("epoch  2/2  val_loss 0.4500  val_acc 0.8750", True),
    ("INFO:train:epoch=2 val_loss=0.45 val_acc=0.875", True),
    ('{"epoch": 2, "val_loss": 0.45, "val_acc": 0.875}', True),
    ("val_acc: tensor(0.8750)", True),
    ("val_acc:0.9 val_loss NaN", True),
    # A warning or traceback quoting the script's source: no value, not the table.
    ('    print(f"val_loss {val_loss:.4f}  val_acc {val_acc:.4f}")', False),
    ("    val_loss, val_correct, val_n = val_sums.tolist()", False),
])
def test_a_table_line_gives_val_loss_or_val_acc_a_value(line, table):
    assert bool(ddp_recorder.METRIC_LINE.search(line)) is table


def test_wrapped_checkpoint_fails_loading(run):
    run.ranks[0]["checkpoint"].update(loads=False, problem="Unexpected key(s) in state_dict:"
                                                           " \"module.0.weight\".")
    assert failing(run) == {"checkpoint_loads_into_plain_model"}
    assert "Save model.module.state_dict()" in check("checkpoint_loads_into_plain_model", run)


def test_metrics_of_one_rank_fail_global_metrics(run):
    shard = range(0, N_VAL, WORLD)  # rank 0's share alone
    losses, correct = run.ranks[0]["val_eval"]["loss"], run.ranks[0]["val_eval"]["correct"]
    (run.out_dir / "log.jsonl").write_text(json.dumps({
        "val_loss": sum(losses[i] for i in shard) / len(shard),
        "val_acc": sum(correct[i] for i in shard) / len(shard)}) + "\n")
    assert failing(run) == {"validation_metrics_are_global"}
    assert "sum the ranks' sums (dist.all_reduce)" in check("validation_metrics_are_global",
                                                            run)


def test_unscaled_learning_rate_fails(run):
    for record in run.ranks:
        record["lrs"] = [LR] * 8
    assert failing(run) == {"learning_rate_follows_global_batch"}
    assert check("learning_rate_follows_global_batch", run) == (
        "FAIL: rank 0's optimizer trained with a learning rate of at most 0.05; the global "
        "batch is 2 x --batch-size, so scale --lr 0.05 by the world size: 0.1 (linear) or "
        "0.07071 (square-root).")


@pytest.mark.parametrize("lrs, rule", [
    ([LR * 2 ** 0.5] * 8, "square-root"),
    ([LR * 2 * (step + 1) / 4 for step in range(4)] + [LR * 2 * 0.9] * 4, "linear"),
])
def test_square_root_rule_and_warmup_pass(run, lrs, rule):
    for record in run.ranks:
        record["lrs"] = lrs
    assert f"({rule} rule)" in check("learning_rate_follows_global_batch", run)


def test_low_accuracy_fails_the_target(run):
    for record in run.ranks:
        record["val_eval"]["correct"] = [1] * 6 + [0] * 2
    assert check("runs_and_reaches_target_accuracy", run) == (
        "FAIL: after 2 epochs the model classifies 75.0% of the validation set correctly; "
        "the target is 85%.")


@pytest.mark.parametrize("loader_drops, sampler_drops", [(True, False), (False, True),
                                                         (True, True)])
def test_drop_last_keeps_cover(run, loader_drops, sampler_drops):
    for rank, record in enumerate(run.ranks):
        train = [p for p in record["passes"] if p["split"] == "train"]
        for epoch, p in enumerate(train):
            p["batches"] = batches(sampler_shard(epoch, rank, drop_last=sampler_drops),
                                   drop_last=loader_drops)
    assert check("shards_disjoint_and_cover", run).startswith("PASS")


def test_more_left_out_than_drop_last_allows_fails_cover(run):
    for record in run.ranks:
        for p in record["passes"]:
            if p["split"] == "train":
                p["batches"] = p["batches"][:-2]  # a whole batch more than drop_last's
    assert "went to no rank" in check("shards_disjoint_and_cover", run)


@pytest.mark.parametrize("failure, reason", [
    ({"timed_out": True, "output": "epoch 1\n"},
     "the job did not finish within 60 s and was stopped"),
    ({"returncode": 1}, "the job exited with status 1"),
])
def test_a_job_that_cannot_be_graded_fails_every_check(run, failure, reason):
    for key, value in failure.items():
        setattr(run, key, value)
    for grade_id in ddp_checks.REQUIREMENTS:
        assert reason in check(grade_id, run)


def test_a_script_that_never_loads_the_data_fails_every_check(run):
    """What a script cell of kernel code patching the checks becomes when it is graded as
    the script it writes: a job that trains nothing."""
    for record in run.ranks:
        record["data_loaded"] = False
    for grade_id in ddp_checks.REQUIREMENTS:
        assert check(grade_id, run) == ("FAIL: the script never called "
                                        "load_data(): keep loading the data "
                                        "with it.")


def test_a_crash_names_the_rank_the_line_and_the_unwritten_part(run):
    run.returncode = 1
    run.ranks[1]["error"] = {"type": "NotImplementedError", "message": "",
                             "where": "train_digits_ddp.py line 22, in <module>: raise "
                                      "NotImplementedError()"}
    assert check("shards_disjoint_and_cover", run) == (
        "FAIL: rank 1 stopped with NotImplementedError (train_digits_ddp.py line 22, in "
        "<module>: raise NotImplementedError()). A place marked '# YOUR CODE HERE' still "
        "needs your code.")


# -- the pass mark and the notebook -----------------------------------------------------

PASS_MARK_CASES = [  # requirements lost -> passes; README.md states the same examples
    (set(), True),
    ({"validation_metrics_are_global", "learning_rate_follows_global_batch"}, True),
    ({"shards_reshuffled_each_epoch", "rank0_only_logs_and_writes",
      "checkpoint_loads_into_plain_model"}, True),
    ({"shards_reshuffled_each_epoch", "validation_metrics_are_global",
      "learning_rate_follows_global_batch"}, False),  # 8 points
    ({"shards_disjoint_and_cover"}, False),  # 10 points, without a shard per rank
    ({"gradients_averaged_over_ranks"}, False),  # 9 points, without synchronised steps
    ({"runs_and_reaches_target_accuracy"}, False),  # 11 points, without training (or speed)
]


@pytest.mark.parametrize("lost, passed", PASS_MARK_CASES)
def test_pass_mark(lost, passed):
    assert ddp_checks.passes(set(ddp_checks.REQUIREMENTS) - lost) is passed


def test_the_pass_mark_requires_what_makes_a_job_data_parallel():
    assert set(ddp_checks.PASS_REQUIRES) == {"runs_and_reaches_target_accuracy",
                                             "shards_disjoint_and_cover",
                                             "gradients_averaged_over_ranks"}
    for grade_id in ddp_checks.PASS_REQUIRES:  # each alone, whatever the other points
        assert not ddp_checks.passes(set(ddp_checks.REQUIREMENTS) - {grade_id})


def test_readme_states_the_pass_mark_with_examples_that_follow_from_it():
    """Each row of the README's table of examples: the requirements lost, the points left,
    and whether that passes, as ddp_checks.passes decides."""
    readme = (ASSESSMENT / "README.md").read_text()
    numbers = {i + 1: grade_id for i, grade_id in enumerate(ddp_checks.REQUIREMENTS)}
    assert f"**{pass_mark_sentence()}**" in readme
    rows = re.findall(r"^\| lost: ([^|]*) \| (\d+) \| (passes|does not pass) \|$", readme,
                      re.M)
    assert len(rows) >= len(PASS_MARK_CASES)
    for lost, points, verdict in rows:
        lost = {numbers[int(n)] for n in re.findall(r"#(\d)", lost)}
        met = set(ddp_checks.REQUIREMENTS) - lost
        assert sum(ddp_checks.REQUIREMENTS[g] for g in met) == int(points), lost
        assert ddp_checks.passes(met) is (verdict == "passes"), lost
    assert "still passes, two do not" not in readme


def pass_mark_sentence():
    """The pass mark as the notebook and README state it, from ddp_checks."""
    numbers = [str(i + 1) for i, grade_id in enumerate(ddp_checks.REQUIREMENTS)
               if grade_id in ddp_checks.PASS_REQUIRES]
    return (f"Pass mark: requirements {', '.join(numbers[:-1])} and {numbers[-1]}, and at "
            f"least {ddp_checks.PASS_POINTS} of the {sum(ddp_checks.REQUIREMENTS.values())} "
            f"points.")


# -- the speed-up: required on GPUs, reported on the CPU ---------------------------------

def with_one_process_run(tmp_path, run, pass_s):
    """``run`` with the records of the same script as a single process, each of its passes
    over the training set taking ``pass_s`` seconds."""
    alone = good_run(tmp_path / "one_process", world=1, on_gpu=run.on_gpu, pass_s=pass_s,
                     config=ddp_checks.replace(run.config, epochs=ddp_checks.BASELINE_EPOCHS))
    run.one_process = alone
    return run


def four_gpu_run(tmp_path, speedup):
    """A 4-GPU grader's records of a correct job ``speedup`` times as fast as one GPU: each
    rank's pass holds a quarter of the samples (plus the sampler's padding)."""
    run = good_run(tmp_path, world=4, on_gpu=True, pass_s=0.1)
    per_pass = N_TRAIN + (-N_TRAIN) % 4  # DistributedSampler pads 26 to 28
    return with_one_process_run(tmp_path, run, pass_s=0.1 * speedup * N_TRAIN / per_pass)


@pytest.mark.parametrize("speedup", [3.6, 2.41, 2.39, 1.0, 0.5])
def test_on_four_gpus_the_speed_up_is_reported_and_never_fails(tmp_path, monkeypatch,
                                                               speedup):
    """Until the bar is calibrated on the grading machine, a speed-up below it costs
    nothing: the verdict reports it, with where to look when it is low."""
    monkeypatch.chdir(tmp_path)
    run = four_gpu_run(tmp_path, speedup)
    assert run.speed()[0] == pytest.approx(speedup)
    verdict = check("runs_and_reaches_target_accuracy", run)
    assert verdict.startswith("PASS"), verdict
    assert f"{speedup:.2f} times as fast as one GPU (the bar, 0.6 x 4 = 2.40, is " \
           f"{ddp_checks.SPEEDUP_UNCALIBRATED})" in verdict
    assert ("Below the bar, look for work that every rank repeats" in verdict) is (
        speedup < 2.4)
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert ddp_checks.report(run) == (12, True)
    assert f"{speedup:.2f}x (the bar, 0.6 x 4 = 2.40x, is reported, not required" in \
        printed.getvalue()


def test_a_correct_job_on_a_cpu_starved_seat_is_not_failed_on_speed(tmp_path, monkeypatch):
    """The timing spread of a correct job: 2 GPU ranks fed by 1 core, or one 15 ms stall in
    a launch-bound pass, time the job at 1.0x or less of one process against a 1.2x bar.
    Its run meets every requirement and passes."""
    monkeypatch.chdir(tmp_path)
    for pass_s in (0.5, 1.0, 2.0):  # one GPU's pass takes 0.5 s: 1.0x, 0.5x, 0.25x
        run = good_run(tmp_path / f"starved{pass_s}", world=2, on_gpu=True, pass_s=pass_s)
        with_one_process_run(tmp_path / f"starved{pass_s}", run, pass_s=0.5)
        assert run.speed()[0] == pytest.approx(0.5 / pass_s)
        assert failing(run) == set()
        with contextlib.redirect_stdout(io.StringIO()):
            assert ddp_checks.report(run) == (12, True)


def test_on_gpus_a_speed_up_that_could_not_be_measured_is_reported(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = four_gpu_run(tmp_path, 3.0)
    run.one_process.returncode, run.one_process.ranks[0]["error"] = 1, {
        "type": "KeyError", "message": "'LOCAL_RANK'", "where": "train_digits_ddp.py line 3"}
    verdict = check("runs_and_reaches_target_accuracy", run)
    assert verdict.startswith("PASS")
    assert "could not be measured: rank 0 stopped with KeyError" in verdict


@pytest.mark.parametrize("speedup", [0.4, 1.6])
def test_on_the_cpu_the_speed_up_is_reported_where_asked_for_not_required(tmp_path,
                                                                          monkeypatch, speedup):
    monkeypatch.chdir(tmp_path)
    run = good_run(tmp_path, config=ddp_checks.replace(CONFIG, measure_speedup=True))
    assert run.measures_speedup
    with_one_process_run(tmp_path, run, pass_s=0.5 * speedup * N_TRAIN / N_TRAIN)
    verdict = check("runs_and_reaches_target_accuracy", run)
    assert verdict.startswith("PASS")
    assert f"{speedup:.2f} times as fast as one process" in verdict
    assert "on the CPU the speed-up is not required" in verdict
    assert failing(run) == set()


def test_by_default_the_speed_up_is_measured_on_gpus_only(tmp_path, monkeypatch, run):
    """The single-process launch is a second launch per learner: made where the speed-up
    counts (two or more GPUs), not on the CPU, where no point depends on it."""
    assert CONFIG.measure_speedup is None
    assert not run.measures_speedup
    assert run.speed() == (None, f"not measured ({ddp_checks.SPEEDUP_NOT_REQUIRED_ON_CPU}).")
    assert check("runs_and_reaches_target_accuracy", run).startswith("PASS")
    assert good_run(tmp_path / "gpus", world=4, on_gpu=True).measures_speedup
    assert not good_run(tmp_path / "one", world=1, on_gpu=True).measures_speedup
    assert not good_run(tmp_path / "off", world=4, on_gpu=True, config=ddp_checks.replace(
        CONFIG, measure_speedup=False)).measures_speedup


def test_the_speed_counts_the_passes_after_the_first(tmp_path):
    run = good_run(tmp_path, world=2, pass_s=0.5)
    for record in run.ranks:  # a slow first epoch (warm-up) does not count
        next(p for p in record["passes"] if p["split"] == "train")["seconds"] = 50.0
    assert run.samples_per_s == pytest.approx(N_TRAIN / 0.5)
    run.ranks[1]["passes"][2]["seconds"] = 1.0  # the slowest rank sets the pace
    assert run.samples_per_s == pytest.approx(N_TRAIN / 1.0)


# -- the notebook's plain launch: the job's output and one line on how it ended ------------

# What torchrun --tee 3 --log-line-prefix-template "[rank${rank}]: " printed for a 2-process
# job whose rank 1 raised (torch 2.14.1; torchrun's traceback and summary shortened).
TORCHRUN_OUTPUT = """W1201 14:01:20.164000 26689 torch/distributed/run.py:851] Setting OMP
[rank0]: [rank 0/2] cpu
[rank1]: Traceback (most recent call last):
[rank1]:   File "/tmp/train.py", line 5, in <module>
[rank1]:     raise ValueError("boom")
[rank1]:     ^^^^^^^^^^^^^^^^^^^^^^^^
[rank1]: ValueError: boom
[rank0]: epoch  1/3  val_loss 0.5000  val_acc 0.8000
[rank0]:   an indented line of the script's own
[rank1]: [rank 1/2] cpu
E1201 14:01:35.385000 26689 torch/distributed/elastic/multiprocessing/api.py:1002] failed
Traceback (most recent call last):
  File "/work/main/.venv/bin/torchrun", line 6, in <module>
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_14:01:35
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 26791)
============================================================
"""


def test_the_launch_cell_shows_the_jobs_lines_and_which_rank_failed_first():
    shown = []
    output = ddp_checks.JobOutput(show=shown.append)
    for line in TORCHRUN_OUTPUT.splitlines(keepends=True):
        output.feed(line)
    assert shown == ["[rank 0/2] cpu", "[rank 1] ValueError: boom",
                     "epoch  1/3  val_loss 0.5000  val_acc 0.8000",
                     "  an indented line of the script's own", "[rank 1] [rank 1/2] cpu"]
    assert output.ending("train.py on 2 CPU processes", 1, 15.2) == (
        "FAILED after 15 s: train.py on 2 CPU processes: rank 1 failed first (exit code 1): "
        "ValueError: boom")
    assert output.ending("train.py on 2 CPU processes", 0, 9.6) == (
        "SUCCESS: train.py on 2 CPU processes, finished in 10 s.")
    assert output.ending("job", -15, 300.4, time_limit_s=300).startswith(
        "STOPPED: job did not finish within 300 s.")


def test_report_of_a_job_without_averaged_gradients_does_not_pass(run):
    for result in run.ranks[0]["replay"]["ranks"]:
        result.update(averaged=0.7, local=1e-7)
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert ddp_checks.report(run) == (9, False)
    assert "not met  gradients_averaged_over_ranks (0 of 3)" in printed.getvalue()
    assert "Result: NOT PASSED" in printed.getvalue()


def nbgrader_cells():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    return [(cell, cell.metadata.get("nbgrader", {})) for cell in notebook.cells]


def test_notebook_grades_exactly_the_requirements_of_ddp_checks():
    cells = nbgrader_cells()
    graded = {meta["grade_id"]: meta["points"] for _, meta in cells if meta.get("grade")}
    assert graded == ddp_checks.REQUIREMENTS
    assert list(graded) == list(ddp_checks.REQUIREMENTS)  # the same order
    for cell, meta in cells:
        if meta.get("grade"):  # each test cell calls the check named after it
            assert f"ddp_checks.check_{meta['grade_id']}(run)" in cell.source
    assert all(callable(ddp_checks.CHECKS[grade_id]) for grade_id in ddp_checks.REQUIREMENTS)


def test_every_cell_belongs_to_the_assignment_and_only_the_script_is_editable():
    cells = nbgrader_cells()
    assert all(meta.get("grade_id") for _, meta in cells)
    editable = [meta["grade_id"] for _, meta in cells if not meta["locked"]]
    assert editable == ["ddp_script"]
    script = next(cell for cell, meta in cells if meta["grade_id"] == "ddp_script")
    assert script.source.split("\n")[0] == "%%writefile train_digits_ddp.py"
    assert 3 <= script.source.count("### BEGIN SOLUTION") <= 4
    assert "DDP step" not in script.source


def test_notebook_states_the_points_the_pass_mark_and_the_speed_bar_of_ddp_checks():
    cells = {meta["grade_id"]: " ".join(cell.source.split()) for cell, meta in nbgrader_cells()}
    intro = cells["intro"]
    assert f"**{pass_mark_sentence()}**" in intro
    assert pass_mark_sentence().removeprefix("Pass mark: ").removesuffix(".") in cells[
        "result_intro"]
    rows = [line for line in nbgrader_cells()[0][0].source.split("\n")
            if line.startswith("| ") and line[2].isdigit()]
    assert [int(row.rstrip(" |").rsplit("|", 1)[1]) for row in rows] == list(
        ddp_checks.REQUIREMENTS.values())
    assert "every optimizer step" in intro
    assert "stdout or stderr" in intro and "renamed into place" in intro
    assert f"{ddp_checks.SPEEDUP_PER_GPU} x N times as many samples per second" in intro
    assert "reported, not required" in intro
    assert ddp_checks.SPEEDUP_NOT_REQUIRED_ON_CPU[0].upper() + \
        ddp_checks.SPEEDUP_NOT_REQUIRED_ON_CPU[1:] in intro
    assert "one optimizer step per batch" not in intro  # accumulation is allowed
    total = sum(ddp_checks.REQUIREMENTS.values())
    required = sum(ddp_checks.REQUIREMENTS[g] for g in ddp_checks.PASS_REQUIRES)
    assert (f"it passes unless it loses more than {total - ddp_checks.PASS_POINTS} of the "
            f"other requirements' {total - required} points") in intro


def test_notebook_warns_that_other_ranks_printing_metrics_costs_requirement_five():
    cells = {meta["grade_id"]: cell.source for cell, meta in nbgrader_cells()}
    assert "val_loss" in cells["run_ddp_intro"] and "requirement 5" in cells["run_ddp_intro"]
    assert ddp_recorder.METRIC_LINE.search("val_loss 0.5") and \
        ddp_recorder.METRIC_LINE.search("val_acc=0.9")
    assert "ddp_checks.run_script(" in cells["run_ddp"]
    assert "torchrun" not in cells["run_ddp"]  # no raw torchrun output


def test_the_graded_cells_launch_on_the_notebooks_layout():
    """The test cell launches with the NPROC and ON_GPU the setup cell chose (the grader's
    layout), the visible run and the graded one each with its own Config."""
    cells = {meta["grade_id"]: cell.source for cell, meta in nbgrader_cells()}
    assert "NPROC, ON_GPU = ddp_checks.process_layout()" in cells["setup"]
    assert 'ddp_checks.launch("train_digits_ddp.py", config, NPROC, ON_GPU)' in cells[
        "runs_and_reaches_target_accuracy"]


# -- the recorder, in this process, on a toy script --------------------------------------

TOY_SCRIPT = '''
import argparse
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from digits_data import load_data

parser = argparse.ArgumentParser()
parser.add_argument("--sampler", action="store_true")
parser.add_argument("--rank", type=int, default=0)
parser.add_argument("--accumulate", type=int, default=1)
parser.add_argument("--batch-size", type=int, default=256)
parser.add_argument("--out", type=Path)
parser.add_argument("--fail", action="store_true")
parser.add_argument("--save", default="path")
parser.add_argument("--log", action="store_true")
args = parser.parse_args()
if args.log:  # a logger of its own: pytest's handlers sit on the root logger
    import logging
    log = logging.getLogger("toy")
    handler = logging.StreamHandler()  # sys.stderr
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
train_set, val_set = load_data()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
if args.sampler:  # rank --rank of 2, without a process group
    sampler = DistributedSampler(train_set, num_replicas=2, rank=args.rank, shuffle=True,
                                 seed=0)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
else:
    loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
for epoch in range(2):
    if args.sampler:
        sampler.set_epoch(epoch)
    for i, (x, y) in enumerate(loader):  # a step every --accumulate batches
        in_step = min(args.accumulate, len(loader) - i // args.accumulate * args.accumulate)
        (F.cross_entropy(model(x), y) / in_step).backward()
        if (i + 1) % args.accumulate == 0 or i + 1 == len(loader):
            optimizer.step()
            optimizer.zero_grad()
    with torch.no_grad():
        for x, y in DataLoader(val_set, batch_size=100):
            model(x)
    if args.log:
        log.info("epoch %d  val_loss 0.5  val_acc 0.9", epoch + 1)
    else:
        print(f"epoch {epoch + 1}  val_loss 0.5  val_acc 0.9")
if args.fail:
    raise NotImplementedError()
args.out.mkdir(parents=True, exist_ok=True)
path = args.out / "checkpoint.pt"
if args.save == "path":
    torch.save({"model": model.state_dict()}, path)
elif args.save == "save_atomic":  # the course's own: a file object of a temporary file
    from workshop_lib import checkpoint
    checkpoint.save_atomic({"model": model.state_dict()}, path)
elif args.save == "file_object":
    with open(path, "wb") as f:
        torch.save(model.state_dict(), f)
elif args.save == "rename":
    import os
    import tempfile
    fd, tmp = tempfile.mkstemp(dir=args.out, suffix=".tmp")
    os.close(fd)
    torch.save({"model_state_dict": model.state_dict()}, tmp)
    Path(tmp).replace(path)
elif args.save == "module":
    torch.save(model, path)
'''


def record_toy(tmp_path, *flags, rank=0, world_size=1):
    script = tmp_path / "toy.py"
    script.write_text(TOY_SCRIPT)
    evidence, out = tmp_path / "evidence", tmp_path / "out"
    evidence.mkdir(exist_ok=True)
    recorder = ddp_recorder.Recorder(rank, world_size, evidence, out, script)
    recorder.run(["--out", str(out), *flags])
    return recorder, recorder.record()


def test_the_assessments_digits_are_scikit_learns_read_without_importing_it():
    """digits_data.load_data's samples are load_digits' (data / 16, target), split as
    before; a fresh process that loads them imports no scikit-learn (about a second of
    every graded rank's start)."""
    import subprocess

    import torch
    from sklearn.datasets import load_digits

    digits_data = load("assessment_digits_data", SOURCE / "digits_data.py")
    found = load_digits()
    pixels, labels = digits_data.digits()
    assert torch.equal(pixels, torch.tensor(found.data, dtype=torch.float32))
    assert torch.equal(labels, torch.tensor(found.target, dtype=torch.int64))
    train_set, val_set = digits_data.load_data()
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    assert torch.equal(val_set.tensors[0], pixels[order[:360]] / 16)
    assert torch.equal(train_set.tensors[1], labels[order[360:]])
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, digits_data; digits_data.load_data(); "
         "print('sklearn' in {m.split('.')[0] for m in sys.modules})"],
        capture_output=True, text=True, timeout=120, cwd=SOURCE)
    assert loaded.stdout.strip() == "False", loaded.stderr[-2000:]


@pytest.fixture(scope="module")
def first_use_imports():
    """What torch's first optimizer imports on first use (torch._dynamo, about 2 s here),
    once for the module rather than in a test."""
    import torch

    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)


@pytest.fixture
def toy(tmp_path, monkeypatch, first_use_imports):
    """digits_data.py beside the toy script, as in the assignment's folder; one intra-op
    thread, as in a graded rank (two threads' OpenMP spinning on 2 shared cores makes
    this tiny model's steps ten times slower)."""
    import torch

    (tmp_path / "digits_data.py").write_text((SOURCE / "digits_data.py").read_text())
    monkeypatch.delitem(sys.modules, "digits_data", raising=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield tmp_path
    torch.set_num_threads(threads)


def test_recorder_records_each_batch_the_steps_and_a_replay(toy):
    import builtins

    import torch.utils.data.dataloader as dataloader

    originals = (dataloader._BaseDataLoaderIter._next_index, builtins.open, sys.stdout)
    recorder, record = record_toy(toy)
    assert record["error"] is None
    train = [p["batches"] for p in record["passes"] if p["split"] == "train"]
    val = [p["batches"] for p in record["passes"] if p["split"] == "val"]
    assert [[len(b) for b in batches] for batches in train] == [[256] * 5 + [157]] * 2
    assert all(sorted(i for b in batches for i in b) == list(range(1437)) for batches in train)
    assert train[0] != train[1]  # shuffled anew
    assert val == [[list(range(0, 100)), list(range(100, 200)), list(range(200, 300)),
                    list(range(300, 360))]] * 2
    assert all(p["seconds"] > 0 for p in record["passes"])  # each pass timed
    assert record["lrs"] == [0.1] * 12
    assert record["process_group_size"] == 1
    replay = record["replay"]
    assert replay["steps"] == 12  # every step replayed
    # One rank: its own steps are the averaged replay; every segment matched, so the
    # replays that name a mistake were not needed.
    assert replay["ranks"][0]["start"] == 0
    assert replay["ranks"][0]["averaged"] < 1e-5
    assert replay["ranks"][0]["summed"] is None and "segment" not in replay
    # The samples of its first epoch's steps (6 batches of 256)
    assert (replay["shared"], replay["shared_steps"], replay["samples"]) == (0, 6, [1437])
    assert replay["optimizer_end_gap"] == [0.0]
    assert record["checkpoint"] == {"saved": True, "loads": True, "matches_final": True,
                                    "problem": ""}
    assert record["writes"] == [str(toy / "out" / "checkpoint.pt")]
    assert record["metric_lines"] == ["epoch 1  val_loss 0.5  val_acc 0.9",
                                      "epoch 2  val_loss 0.5  val_acc 0.9"]
    assert sorted(p.name for p in (toy / "evidence").iterdir()) == ["steps.rank0.pt"]
    # Everything patched is back as it was.
    assert (dataloader._BaseDataLoaderIter._next_index, builtins.open, sys.stdout) == originals


def test_recorder_replays_each_step_on_the_batches_it_accumulated(toy):
    """Two batches per optimizer step (loss / 2 each, one step after the second): each
    replayed step trains on both, so the replay matches the script's training."""
    import torch

    _, record = record_toy(toy, "--accumulate", "2", "--batch-size", "128")
    # The graded run's data ends each epoch in a short step: 1,408 of the 1,437 samples, 11
    # batches an epoch, a step every second and the last on one batch.
    assert record["lrs"] == [0.1] * 12
    replay = record["replay"]
    # Each epoch's last step holds one batch, its loss not halved: the replay weighs it so
    # (the mean of the step's batches' means), as DDP would.
    assert replay["ranks"][0]["averaged"] < 1e-5
    steps = torch.load(ddp_recorder.steps_file(toy / "evidence", 0), weights_only=False)
    train = [p["batches"] for p in record["passes"] if p["split"] == "train"]
    assert steps["batches"] == [train[e][i:i + 2] for e in range(2) for i in range(0, 11, 2)]
    assert [len(batches) for batches in steps["batches"]] == ([2] * 5 + [1]) * 2
    assert [first for first, _, _ in steps["snapshots"]] == list(
        range(0, 12, ddp_recorder.SEGMENT_STEPS))
    assert replay["samples"] == [1408]


def test_recorder_sees_copies_of_one_training_as_such(toy):
    """What a script with no process group leaves in the records, two ranks of it run one
    after the other in this process: each rank took its steps outside any process group,
    on the same samples, so the replay cannot tell averaging from training alone."""
    for rank in (1, 0):  # rank 0 last: it replays once rank 1's first steps are there
        _, record = record_toy(toy, rank=rank, world_size=2)
        assert record["process_group_size"] == 1
    replay = record["replay"]
    assert replay["shared"] == replay["samples"][0] == replay["samples"][1] == 1437
    assert all(r["averaged"] < 1e-5 for r in replay["ranks"])


def test_recorder_finds_ranks_that_step_alone_on_their_own_shards(toy):
    for rank in (1, 0):
        _, record = record_toy(toy, "--sampler", "--rank", str(rank), rank=rank,
                               world_size=2)
    replay = record["replay"]
    # The first epoch's 3 steps are each rank's whole shard, with the one sample
    # DistributedSampler repeats to make 1,437 samples two equal shards.
    assert replay["shared"] == 1 and replay["samples"] == [719, 719]
    assert replay["shared_steps"] == 3
    assert replay["segment"] == [1, 6]
    assert all(r["local"] < 1e-5 < 0.1 < r["averaged"] for r in replay["ranks"])


@pytest.mark.parametrize("how", ["save_atomic", "file_object", "rename", "module"])
def test_recorder_sees_every_way_of_saving_the_checkpoint(toy, how):
    """A path, a file object (the course's checkpoint.save_atomic writes through one, to a
    temporary file renamed into place), a temporary file renamed with Path.replace; a dict
    holding the state dict, the state dict itself, the module: each is a save, under the
    name it ends with, and loads into the plain model."""
    _, record = record_toy(toy, "--save", how)
    assert record["checkpoint"] == {"saved": True, "loads": True, "matches_final": True,
                                    "problem": ""}, how
    assert str(toy / "out" / "checkpoint.pt") in record["writes"]
    assert not any(path.endswith(".tmp") for path in record["writes"])  # renamed away


def test_recorder_reads_the_table_from_stderr_too(toy):
    """logging writes to stderr: its lines are the table's as much as print's."""
    _, record = record_toy(toy, "--log")
    assert record["metric_lines"] == []
    assert record["stderr_metric_lines"] == ["INFO epoch 1  val_loss 0.5  val_acc 0.9",
                                             "INFO epoch 2  val_loss 0.5  val_acc 0.9"]


def test_recorder_follows_a_distributed_sampler(toy):
    from torch.utils.data.distributed import DistributedSampler

    _, record = record_toy(toy, "--sampler")
    train = [p["batches"] for p in record["passes"] if p["split"] == "train"]
    train_set = sys.modules["digits_data"].load_data()[0]
    for epoch, batches in enumerate(train):
        sampler = DistributedSampler(train_set, num_replicas=2, rank=0, shuffle=True, seed=0)
        sampler.set_epoch(epoch)
        expected = list(sampler)
        assert batches == [expected[i:i + 256] for i in range(0, len(expected), 256)]


def test_recorder_reports_a_crash_at_the_scripts_line(toy):
    _, record = record_toy(toy, "--fail")
    line = TOY_SCRIPT.split("\n").index("    raise NotImplementedError()") + 1
    assert record["error"] == {"type": "NotImplementedError", "message": "",
                               "where": f"toy.py line {line}, in <module>: raise "
                                        f"NotImplementedError()"}
    assert "replay" not in record


def test_recorder_reports_why_the_script_exited(toy):
    """A flag the script does not have: argparse's error, its last line on stderr."""
    _, record = record_toy(toy, "--no-such-flag", "2")
    assert record["error"]["type"] == "SystemExit"
    assert record["error"]["message"].startswith("exit status 2, its last line on stderr: ")
    assert record["error"]["message"].endswith(
        "error: unrecognized arguments: --no-such-flag 2")


def test_the_private_dataloader_methods_the_recorder_patches_exist():
    """torch's _BaseDataLoaderIter: __init__(loader), _reset(loader, first_iter=False),
    _next_index() returning one batch's indices. A torch upgrade that changes them breaks
    the recorder: the tests above say so first."""
    from torch.utils.data import dataloader

    base = dataloader._BaseDataLoaderIter
    assert list(inspect.signature(base.__init__).parameters) == ["self", "loader"]
    reset = inspect.signature(base._reset).parameters
    assert list(reset) == ["self", "loader", "first_iter"]
    assert reset["first_iter"].default is False
    assert list(inspect.signature(base._next_index).parameters) == ["self"]
    # __next__ hands out the batches (the recorder pairs them with the optimizer steps):
    # the iterators inherit it, so patching the base class patches them all.
    for iterator in (dataloader._SingleProcessDataLoaderIter,
                     dataloader._MultiProcessingDataLoaderIter):
        assert "__next__" not in vars(iterator) and iterator.__next__ is base.__next__


# -- the grading guard and the grade export ---------------------------------------------

autograde_guard = load("assessment_autograde_guard", ASSESSMENT / "autograde_guard.py")
FIRST_LINE = "%%writefile train_digits_ddp.py"


@pytest.mark.parametrize("source, expected", [
    (f"{FIRST_LINE}\nimport torch", f"{FIRST_LINE}\nimport torch"),
    ("\n\n%%writefile  other.py\nimport torch", f"{FIRST_LINE}\nimport torch"),
    ("import ddp_checks\nddp_checks.check_x = print", f"{FIRST_LINE}\nimport ddp_checks\n"
                                                      f"ddp_checks.check_x = print"),
    ("%%bash\necho hi", f"{FIRST_LINE}\n%%bash\necho hi"),
    ("", FIRST_LINE),
])
def test_the_script_cell_always_writes_the_script(source, expected):
    assert autograde_guard.as_script_cell(source, FIRST_LINE) == expected


def test_the_guards_run_in_autogrades_sanitize_step_before_overwrite_cells():
    from nbgrader.converters import Autograde
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=str(ASSESSMENT)).load_config()
    configured = [p.__name__ for p in config.Autograde.sanitize_preprocessors]
    default = [p.__name__ for p in Autograde.class_traits()["sanitize_preprocessors"]
               .default()]
    at = default.index("OverwriteCells")
    assert default[:at] == ["ClearOutput", "DeduplicateIds", "OverwriteKernelspec"]
    assert configured == [*default[:at], "KeepAssignmentCellsOnly",
                          "KeepAssignmentFilesOnly", "UseInstructorGradingFiles",
                          *default[at:]]
    script = next(cell for cell, meta in nbgrader_cells()
                  if meta["grade_id"] == config.KeepAssignmentCellsOnly.script_cell)
    assert script.source.split("\n")[0] == config.KeepAssignmentCellsOnly.script_first_line


def graded_by_the_guard(course, student):
    """UseInstructorGradingFiles run on ``student``'s folder of ``course``."""
    from traitlets.config import Config

    config = Config()
    config.CourseDirectory.root = str(course)
    guard = autograde_guard.UseInstructorGradingFiles(config=config)
    resources = {"nbgrader": {"student": student, "assignment": "ddp_refactor"}}
    return guard.preprocess(nbformat.v4.new_notebook(), resources)


def test_each_learner_is_graded_with_the_instructors_grading_files(tmp_path, monkeypatch):
    """A submission's copies of the checks or the recorder (altered, a link, or missing)
    are replaced by the instructor's before its grading; the instructor's copies are those
    source/ held for the first learner, and a change there since stops grading."""
    monkeypatch.setattr(autograde_guard, "_INSTRUCTOR_COPIES", {})
    source = tmp_path / "source" / "ddp_refactor"
    source.mkdir(parents=True)
    names = autograde_guard.UseInstructorGradingFiles.class_traits()["files"].default()
    # Every module beside the notebook grades: the checks and the recorder with their rooms.
    assert set(names) == {path.name for path in SOURCE.glob("*.py")
                          if not path.name.startswith("train_digits")}
    assert {"ddp_checks.py", "ddp_recorder.py", "ddp_sandbox.py", "digits_data.py"} < set(names)
    for name in names:
        (source / name).write_bytes((SOURCE / name).read_bytes())
    for student in ("alice", "bob"):
        graded = tmp_path / "autograded" / student / "ddp_refactor"
        graded.mkdir(parents=True)
        for name in names:
            (graded / name).write_bytes((SOURCE / name).read_bytes())
    alice = tmp_path / "autograded" / "alice" / "ddp_refactor"
    (alice / "ddp_checks.py").write_text("def check_x(run):\n    print('PASS')\n")
    (alice / "ddp_recorder.py").unlink()
    (alice / "ddp_recorder.py").symlink_to(tmp_path / "elsewhere.py")
    (alice / "digits_data.py").unlink()
    graded_by_the_guard(tmp_path, "alice")
    for name in names:
        assert not (alice / name).is_symlink()
        assert (alice / name).read_bytes() == (SOURCE / name).read_bytes(), name
    assert not (tmp_path / "elsewhere.py").exists()
    # A job that wrote into source/ between two learners: the next is not graded.
    (source / "ddp_recorder.py").write_text("REPLAY_MATCH = 1e9\n")
    with pytest.raises(autograde_guard.GradingFilesChanged,
                       match="ddp_recorder.py changed while autograde ran"):
        graded_by_the_guard(tmp_path, "bob")


def test_grades_export_has_a_column_per_requirement_and_the_verdict():
    """export_grades.grade_rows on a stand-in for nbgrader's Gradebook (the round trip
    checks the real grades.csv against the real gradebook)."""
    from types import SimpleNamespace

    from nbgrader.api import MissingEntry

    export_grades = load("assessment_export_grades", ASSESSMENT / "export_grades.py")
    scores = {"alice": dict(ddp_checks.REQUIREMENTS),
              "bob": {**ddp_checks.REQUIREMENTS, "gradients_averaged_over_ranks": 0}}

    def find_submission(assignment, student):
        if student not in scores:
            raise MissingEntry()
        grades = [SimpleNamespace(name=name, score=score, max_score=ddp_checks.REQUIREMENTS[
            name]) for name, score in scores[student].items()]
        return SimpleNamespace(notebooks=[SimpleNamespace(grades=grades)], timestamp=None,
                               score=sum(scores[student].values()), max_score=12)

    gradebook = SimpleNamespace(
        students=[SimpleNamespace(id=s, first_name=None, last_name=None)
                  for s in ("carol", "bob", "alice")],
        find_submission=find_submission)
    # The checks as export_grades.py loads them (by path, outside sys.modules).
    checks = export_grades.load_checks("ddp_refactor")
    assert checks.pass_rule() == ddp_checks.pass_rule()
    rows = {row["student_id"]: row for row in export_grades.grade_rows(
        gradebook, "ddp_refactor", checks)}
    assert [rows[s]["passed"] for s in ("alice", "bob", "carol")] == ["yes", "no", "no"]
    assert (rows["bob"]["score"], rows["bob"]["max_score"]) == (9, 12)
    assert rows["bob"]["gradients_averaged_over_ranks"] == 0
    assert list(rows["alice"])[4:-3] == list(ddp_checks.REQUIREMENTS)


def test_each_copy_of_the_grader_uses_the_rooms_beside_it(tmp_path):
    """ddp_checks and ddp_recorder load their rooms (ddp_checks_*.py, ddp_recorder_*.py) by
    their own path: each copy loaded by path (from source/, release/, a graded folder) uses
    the rooms beside it, and loading another copy leaves an earlier one's rooms in place.
    Each launch copies every room of the recorder into the job's folder."""
    for path in SOURCE.glob("*.py"):
        (tmp_path / path.name).write_bytes(path.read_bytes())
    checks = load("copied_ddp_checks", tmp_path / "ddp_checks.py")
    recorder = load("copied_ddp_recorder", tmp_path / "ddp_recorder.py")
    for module, folder in ((checks, tmp_path), (ddp_checks, SOURCE)):
        check = module.check_gradients_averaged_over_ranks
        assert Path(check.__code__.co_filename).parent == folder.resolve()
        run = module.Run(script="x.py", config=module.Config(), nproc=2, on_gpu=False,
                         time_limit_s=60, missing_script=True)
        with pytest.raises(module.RequirementNotMet, match="x.py does not exist"):
            check(run)  # the room's RequirementNotMet is the one this copy exports
    assert checks.Run is not ddp_checks.Run
    for module, folder in ((recorder, tmp_path), (ddp_recorder, SOURCE)):
        replay = module.Recorder.replay_steps
        assert Path(replay.__code__.co_filename).parent == folder.resolve()
    assert set(ddp_checks.RECORDER_FILES) == {path.name for path in SOURCE.glob("ddp_recorder*.py")}


@pytest.mark.slow
def test_the_process_layout_asks_torch_not_nvidia_smi(tmp_path, monkeypatch):
    """nvidia-smi listing four GPUs that PyTorch cannot use must not make a GPU layout."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\n" + "".join(f"echo 'GPU {i}: NVIDIA A100 (UUID: GPU-{i})'\n"
                                             for i in range(4)))
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{__import__('os').environ['PATH']}")
    import torch

    if torch.cuda.is_available():
        pytest.skip("PyTorch can use this machine's GPUs: the fake listing stands for GPUs "
                    "it cannot use")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv(ddp_checks.NPROC_ENV, raising=False)
    assert ddp_checks.visible_gpus() == 0
    assert ddp_checks.process_layout() == (ddp_checks.CPU_PROCESSES, False)


@pytest.mark.slow
def test_the_launch_cell_runs_torchrun_and_summarises_the_job(tmp_path, monkeypatch, capsys):
    """run_script on a real torchrun (its --tee and prefix flags at the installed torch):
    the ranks' lines, tagged, and which rank failed first, without torchrun's traceback."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.py").write_text(
        "import os\nrank = os.environ['RANK']\nprint(f'hello from rank {rank}', flush=True)\n"
        "if rank == '1':\n    raise ValueError('boom')\n")
    assert ddp_checks.run_script("job.py", nproc=2, on_gpu=False, time_limit_s=120) == 1
    shown = capsys.readouterr().out.splitlines()
    assert "hello from rank 0" in shown and "[rank 1] hello from rank 1" in shown
    assert shown[-1].startswith("FAILED after ")
    assert shown[-1].endswith("job.py on 2 CPU processes: rank 1 failed first (exit code 1): "
                              "ValueError: boom")
    assert not any("Traceback" in line or "Root Cause" in line for line in shown)


def test_a_pass_is_timed_once_the_gpu_has_run_what_was_queued(monkeypatch):
    """CUDA runs asynchronously: without a synchronisation a pass over the training set
    would end when its last step was launched. Where CUDA is in use the recorder waits for
    the GPU at each pass's start and end (a CPU job has nothing to wait for)."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    waited = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: waited.append("sync"))
    train = TensorDataset(torch.arange(8.0))
    recorder = types.SimpleNamespace(splits={id(train): "train"}, recording=True, passes=[],
                                     handed_out=[])
    undo = ddp_recorder.patch_dataloader_iterators(recorder)
    try:
        batches = list(DataLoader(train, batch_size=4))
    finally:
        undo()
    assert len(batches) == 2 and waited == ["sync", "sync"]
    assert recorder.passes[0]["seconds"] >= 0 and len(recorder.handed_out) == 2


INSTRUCTION_WORDS = 600  # the notebook's reading budget: about five minutes


def visible_words(markdown):
    """The words a learner reads without opening a collapsed part: a <details> block counts
    only its <summary>; tags, table rules and punctuation alone are not words."""
    return re.findall(r"[A-Za-z0-9]\S*", re.sub(r"<[^>]+>", "", visible_text(markdown)))


def test_the_instructions_fit_their_reading_budget_the_rest_folded():
    """The requirement table and the pass mark in view; how grading works, the workshop's
    reminders and the data's details folded, each under a summary saying what it holds."""
    cells = [cell for cell, _ in nbgrader_cells() if cell.cell_type == "markdown"]
    words = sum(len(visible_words(cell.source)) for cell in cells)
    assert words < INSTRUCTION_WORDS, f"{words} words of instructions in view"
    for cell in cells:
        assert cell.source.count("<details>") == cell.source.count("</details>") == \
            cell.source.count("<summary>")
    intro = cells[0].source
    assert "| 4 |" in visible_text(intro) and "**Pass mark:" in visible_text(intro)
    assert "What the grader relies on" in intro and "What the grader relies on" not in \
        visible_text(intro)
    assert len(visible_words("<details>\n<summary>Two words</summary>\n\nmany more\n</details>"
                             " | --- | x")) == 3


def visible_text(markdown):
    return re.sub(r"<details>\s*<summary>(.*?)</summary>.*?</details>", r"\1", markdown,
                  flags=re.S)
