"""pyproject.toml (pip) and environment.yml (conda) install the same packages and versions."""
import re

import tomllib
import yaml

from conftest import REPO


def normalise(requirement):
    name, _, version = requirement.partition("==")
    return re.sub(r"[-_.]+", "-", name.strip().lower()), version.strip()


def test_environment_yml_pins_what_pyproject_pins():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + project["optional-dependencies"]["dev"]
    pip_pins = dict(map(normalise, requirements))
    assert all(version for version in pip_pins.values()), "pyproject pins exact versions"

    env = yaml.safe_load((REPO / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    conda_pins = dict(normalise(r) for r in pip_section if not r.startswith("-"))
    assert conda_pins == pip_pins
    assert "-e ." in pip_section, "the conda environment installs workshop_lib itself too"
    python = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python="))
    minimum = tuple(map(int, project["requires-python"].lstrip(">=").split(".")))
    assert tuple(map(int, python.split("=")[1].split("."))) >= minimum
