"""`python -m workshop_lib doctor` tells a learner what this machine will do."""
from conftest import run_course_command


def test_doctor_reports_backend_processes_and_dataset():
    result = run_course_command(["-m", "workshop_lib", "doctor"])
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "torch 2.14.1" in out
    assert "GPUs: none visible" in out
    assert "gloo backend on the CPU, 2 processes" in out
    assert "dataset auto -> digits" in out and "download fashion-mnist" in out
