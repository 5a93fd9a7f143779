"""`python -m workshop_lib doctor` tells a learner what this machine will do."""
import pytest

from conftest import run_course_command
from workshop_lib import doctor, hardware

pytestmark = pytest.mark.slow  # starts processes: torchrun, spawned ranks, papermill


def test_doctor_reports_this_machine_as_the_machine_description_has_it():
    result = run_course_command(["-m", "workshop_lib", "doctor"])
    assert result.returncode == 0, result.stderr
    out = result.stdout.splitlines()
    # The command prints what the library computes for this machine, whatever it is
    # (tests/test_machine_shapes.py checks what that is on other machines).
    assert out == doctor.report()
    machine = hardware.detect()
    assert any(line.startswith(f"CPU: {machine.cpu_cores} core(s)") for line in out)
    assert any(line.startswith("course runs: ") for line in out)
    assert any(line.startswith("dataset auto -> ") for line in out)


def test_doctor_rejects_a_bad_flag_in_one_line():
    result = run_course_command(["-m", "workshop_lib", "doctor", "--no-such-flag"])
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "error:" in result.stderr
