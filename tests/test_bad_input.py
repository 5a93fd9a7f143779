"""Bad input gives one clear line on stderr and a non-zero exit, never a traceback."""
import re

import pytest

from conftest import run_course_command
from workshop_lib import data, faults, train, train_ddp
from workshop_lib.errors import CourseError

TORCHRUN_ENV = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}


def run_main(main, argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.mark.parametrize("argv,expected", [
    (["--dataset", "cifar-100"], "invalid choice: 'cifar-100'"),
    (["--batch-size", "0"], "--batch-size must be a positive integer, got 0"),
    (["--batch-size", "-8"], "--batch-size must be a positive integer"),
    (["--lr", "-0.1"], "--lr must be positive"),
    (["--epochs", "3", "--warmup-epochs", "5"], "--warmup-epochs must be >= 0 and shorter"),
    (["--model", "resnet-9000"], "unknown model 'resnet-9000'; choose one of: cnn"),
    (["--target-accuracy", "95"], "--target-accuracy is a fraction"),
    (["--epochs", "many"], "invalid int value: 'many'"),
])
def test_bad_flags(argv, expected, capsys, tmp_path):
    line = run_main(train.main, argv + ["--out", str(tmp_path)], capsys)
    assert expected in line


@pytest.mark.parametrize("argv,expected", [
    (["--out", ""], "--out needs a folder name"),
    (["--inject-fault", "explode@1:3"], "--inject-fault takes KIND@RANK:STEP"),
])
def test_bad_values_that_need_no_output_folder(argv, expected, capsys):
    assert expected in run_main(train.main, argv, capsys)


def test_resume_without_a_checkpoint(capsys, tmp_path):
    line = run_main(train.main, ["--resume", "--out", str(tmp_path)], capsys)
    assert f"no checkpoint at {tmp_path}/checkpoint.pt to resume from" in line


def test_missing_dataset_says_how_to_get_it(capsys, tmp_path):
    line = run_main(train.main, ["--dataset", "fashion-mnist", "--data-dir", str(tmp_path),
                                 "--out", str(tmp_path / "out")], capsys)
    assert "python -m workshop_lib.data download fashion-mnist" in line


def test_unwritable_output_folder(capsys, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    line = run_main(train.main, ["--out", str(blocker / "run")], capsys)
    assert "cannot write to output folder" in line and "--out" in line


def test_more_processes_than_gpus(capsys, monkeypatch, tmp_path):
    for key, value in TORCHRUN_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 1)
    monkeypatch.setattr("torch.cuda.get_device_capability", lambda i: (8, 0))  # A100s
    line = run_main(train_ddp.main, ["--out", str(tmp_path)], capsys)
    assert "2 process(es) on this machine but 1 GPU(s) visible" in line
    assert "--nproc-per-node=1" in line


def test_gpu_requested_where_there_is_none(capsys, monkeypatch, tmp_path):
    for key, value in TORCHRUN_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 0)
    line = run_main(train_ddp.main, ["--device", "cuda", "--out", str(tmp_path)], capsys)
    assert "PyTorch sees no GPU here" in line and "--device cpu" in line


def test_a_gpu_index_past_the_last_gpu(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 2)
    monkeypatch.setattr("torch.cuda.get_device_capability", lambda i: (8, 0))  # A100s
    line = run_main(train.main, ["--device", "cuda:2", "--out", str(tmp_path)], capsys)
    assert "--device cuda:2 but only 2 GPU(s) are visible (cuda:0 to cuda:1)" in line
    assert "--device takes auto, cpu, cuda or cuda:N" in run_main(
        train.main, ["--device", "gpu", "--out", str(tmp_path)], capsys)


def test_ddp_script_outside_torchrun_says_how_to_launch(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("RANK", raising=False)
    line = run_main(train_ddp.main, ["--out", str(tmp_path)], capsys)
    assert "torchrun --standalone --nproc-per-node=2 -m workshop_lib.train_ddp" in line


@pytest.mark.slow
def test_command_line_error_is_one_line_from_a_real_process(tmp_path):
    result = run_course_command(["-m", "workshop_lib.train", "--batch-size", "0",
                                 "--out", str(tmp_path)])
    assert result.returncode == 2
    assert result.stderr.strip() == "error: --batch-size must be a positive integer, got 0"


DIGITS_STEPS = data.steps_per_epoch(len(data.load("digits")[0]), 1, 64)  # one process


@pytest.mark.parametrize("fault, why", [
    (f"kill@0:{DIGITS_STEPS}", "the first step past the last"),
    ("kill@0:5000", "far past the last step"),
    ("raise@1:5", "a rank the one-process run does not have"),
])
def test_a_fault_that_could_never_fire_is_refused_at_the_start(fault, why, capsys, tmp_path):
    line = run_main(train.main, ["--dataset", "digits", "--epochs", "1", "--batch-size", "64",
                                 "--inject-fault", fault, "--out", str(tmp_path)], capsys)
    assert f"--inject-fault {fault} would never fire" in line, why
    assert f"last step is {DIGITS_STEPS - 1}" in line and "world size is 1" in line


def test_the_fault_check_names_the_last_step_and_the_world_size():
    check = faults.check_fires
    check(faults.Fault("kill", 3, 0), world_size=4, epochs=2, steps_per_epoch=10)
    check(faults.Fault("hang", 0, 19), world_size=4, epochs=2, steps_per_epoch=10)
    check(faults.Fault("raise", 1, 10), world_size=2, epochs=2, steps_per_epoch=10,
          steps_done=10)
    for fault, steps_done in [(faults.Fault("kill", 4, 5), 0), (faults.Fault("kill", 0, 20), 0),
                              (faults.Fault("raise", 1, 9), 10)]:
        with pytest.raises(CourseError) as refused:
            check(fault, world_size=4, epochs=2, steps_per_epoch=10, steps_done=steps_done)
        message = str(refused.value)
        assert "last step is 19" in message and "world size is 4" in message
        assert f"pick a step from {steps_done} to 19 and a rank below 4" in message


def test_a_restarted_job_runs_clean_without_checking_its_old_fault(monkeypatch):
    """After an elastic restart the fault is off, and the world may have shrunk (notebook
    06): a fault for a rank that is gone must not stop the restarted job."""
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    loader = [0] * 10
    assert faults.inject(loader, "kill@1:15", rank=0, world_size=1, epochs=2) is loader


@pytest.mark.slow
def test_a_fault_past_the_last_step_is_one_line_from_a_real_process(tmp_path):
    result = run_course_command(["-m", "workshop_lib.train", "--dataset", "digits",
                                 "--epochs", "1", "--inject-fault", "kill@0:5000",
                                 "--out", str(tmp_path)])
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --inject-fault kill@0:5000"), lines
    assert re.search(r"last step is \d+ .* world size is 1", lines[0]), lines[0]


ENTRY_POINTS = ["workshop_lib.__main__", "workshop_lib.train", "workshop_lib.train_ddp",
                "workshop_lib.bench.__main__", "workshop_lib.trace.__main__",
                "workshop_lib.equivalence", "workshop_lib.dataparallel",
                "workshop_lib.launch.__main__",
                "workshop_lib.doctor", "workshop_lib.data", "workshop_lib.gpu_check.__main__",
                "workshop_lib.gpu_check.probes", "workshop_lib.gpu_check.run_notebook",
                "workshop_lib.gpu_check.stuck_collective",
                "workshop_lib.labs.__main__", "workshop_lib.labs._from_scratch_job",
                "workshop_lib.sweep", "workshop_lib.uneven_inputs",
                "workshop_lib.naive_ddp", "workshop_lib.inside_ddp.verify",
                "workshop_lib.inside_ddp.experiments", "workshop_lib.inside_ddp.timing",
                "workshop_lib.day", "workshop_lib.ddp_diff"]


def test_every_entry_point_is_listed():
    from conftest import REPO
    found = set()
    for path in (REPO / "workshop_lib").rglob("*.py"):
        if "files" in path.parts:  # the exercises' scripts, the learner's to change
            continue
        if 'if __name__ == "__main__"' in path.read_text():
            module = path.relative_to(REPO).with_suffix("").as_posix().replace("/", ".")
            found.add(module)
    # doctor's main is reached as `python -m workshop_lib doctor`
    assert found == set(ENTRY_POINTS) - {"workshop_lib.doctor"}


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_every_entry_point_answers_a_bad_flag_with_one_line(module, capsys, monkeypatch):
    """``python -m MODULE --no-such-flag``, in and out of torchrun: one line, exit code 2."""
    import importlib
    for name in TORCHRUN_ENV:
        monkeypatch.delenv(name, raising=False)
    main = importlib.import_module(module).main
    try:
        code = main(["--no-such-flag"])
    except SystemExit as exit_info:
        code = exit_info.code
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, (code, err)
    assert len(lines) == 1 and lines[0].startswith(("error: ", "usage: ")), err
