# One entry point for learners, instructors and CI.
#   make lab        set up (first time only) and open the course in JupyterLab, as learners use it
#   make instructor JupyterLab on the whole repository, with nbgrader's formgrader
#   make test       set up (first time only) and run the whole test suite
#   make test-fast  the tests that start no processes (under a minute)
#   make test-mid   test-fast, then the training parts' real runs and notebook 00 (~2 min)
#   make check-labs every exercise's check fails its stub and passes its solution
#   make gpu-check  on a GPU workstation: GPU tests, every notebook on the GPUs, a report
#                   (torch alone: PYTHONPATH=. python -m workshop_lib.gpu_check --smoke)
#   make learner-kit KIT=DIR  what learners' machines and images get: no solution, no tests
#   make classroom  as root on a Linux server: the class server (deploy/classroom/README.md)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Re-install only when the dependency list changes.
STAMP := $(VENV)/.installed-from-pyproject
PORT ?= 8888
# JupyterLab refuses to run as root unless told; CI and containers run as root.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: setup lab instructor test test-class test-fast test-mid check-labs gpu-check learner-kit classroom doctor \
	lint html bench clean

# The learner kit (make learner-kit, below) is this repository without tests/ and the
# instructor's part of assessment/: the targets that need those say so there, before
# anything runs.
REPOSITORY_ONLY := test test-fast test-mid lint instructor gpu-check learner-kit classroom
ifeq ($(wildcard tests),)
ifneq ($(filter $(REPOSITORY_ONLY),$(MAKECMDGOALS)),)
$(error make $(filter $(REPOSITORY_ONLY),$(MAKECMDGOALS)): not in the learner kit, which has no tests/ and no instructor's assessment/; run it in the course repository)
endif
endif

setup: $(STAMP)

$(STAMP): pyproject.toml $(wildcard jupyter/*)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
# The course's JupyterLab, server and nbgrader settings (jupyter/) go into the environment,
# never into the user's home.
	install -D -m 644 jupyter/overrides.json5 $(VENV)/share/jupyter/lab/settings/overrides.d/ddp-workshop.json5
	install -D -m 644 jupyter/jupyter_server_config.py $(VENV)/etc/jupyter/jupyter_server_config.py
	install -D -m 644 jupyter/nbgrader_config.py $(VENV)/etc/jupyter/nbgrader_config.py
	touch $@

# The learner's JupyterLab serves a workspace (git-ignored): copies of notebooks/ and of the
# assessment's release, made only when missing, so a learner's work is never overwritten
# (jupyter/learner/make_workspace.py). Nothing of the instructor's kit (assessment/source,
# the gradebook, tests/) is in it, and nbgrader's instructor parts are off: the server
# extensions below, the panels in jupyter/learner/labconfig/page_config.json. nbgrader's
# Validate button stays.
# LAB_ARGS adds JupyterLab flags, e.g. on a remote workstation: make lab LAB_ARGS=--no-browser
WORKSPACE ?= workspace
LEARNER_OFF := formgrader course_list assignment_list
lab: setup
	$(BIN)/python -m workshop_lib doctor
	$(BIN)/python jupyter/learner/make_workspace.py $(WORKSPACE)
	PATH="$(abspath $(BIN)):$$PATH" JUPYTER_CONFIG_PATH="$(abspath jupyter/learner)" \
	  $(BIN)/jupyter lab --port=$(PORT) $(ROOT_FLAG) --ServerApp.root_dir=$(WORKSPACE) \
	  --LabApp.default_url=/lab/tree/notebooks \
	  $(foreach e,$(LEARNER_OFF),--ServerApp.jpserver_extensions=nbgrader.server_extensions.$(e)=False) \
	  $(LAB_ARGS)

# The instructor's JupyterLab: the whole repository, opened on assessment/, with nbgrader's
# Formgrader (it manages assessment/, or the folder WORKSHOP_ASSESSMENT_DIR names) and
# Create Assignment panels.
instructor: setup
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/jupyter lab --port=$(PORT) $(ROOT_FLAG) \
	  --ServerApp.root_dir=. --LabApp.default_url=/lab/tree/assessment $(LAB_ARGS)

# Executed copies of every notebook, as HTML, in build/html (profile auto: this machine's).
html: setup
	mkdir -p build/executed build/html
	cd notebooks && for nb in [0-9]*.ipynb; do \
	  PATH="$(abspath $(BIN)):$$PATH" ../$(BIN)/papermill -k python3 --no-progress-bar \
	    "$$nb" "../build/executed/$$nb" -p runs_dir "../build/runs/$${nb%.ipynb}" || exit 1; \
	done
	$(BIN)/jupyter nbconvert --to html --output-dir build/html build/executed/*.ipynb

# Two pytest processes (tests/conftest.py: a file's tests, or files sharing a fixture, in one):
# while one waits on a hub, a timeout or a hang, the other computes. On 2 cores more would
# only fight over them (three measured: 2% faster, inside the spread of two runs,
# BENCHMARKS.md); TEST_PROCESSES=0 runs the suite in one process.
TEST_PROCESSES ?= 2
test: setup
	$(BIN)/ruff check workshop_lib tests assessment jupyter notebooks
	$(BIN)/python -m pytest -n $(TEST_PROCESSES)

# The class server's whole test as root, with the class of 30 graded (CI leaves that out).
test-class: setup
	$(BIN)/python -m pytest tests/test_classroom.py -rA

# No torchrun, spawned ranks, papermill, nbgrader or browser: the logic, in seconds (in two
# processes too: 39 s against 62 s in one on 2 cores, each process's start included).
test-fast: setup
	$(BIN)/ruff check workshop_lib tests assessment jupyter notebooks
	$(BIN)/python -m pytest -m "not slow" -q -n $(TEST_PROCESSES)

# Everyday work, in a few minutes: the fast tier, then the real multi-process runs of the
# training parts (launcher, DDP, process groups, training, sweeps, the trace, faults) and
# notebook 00 end to end under papermill.
MID_TESTS := tests/test_notebook_00.py tests/test_launch.py tests/test_training.py \
	tests/test_ddp.py tests/test_process_group.py tests/test_sweep.py tests/test_trace.py \
	tests/test_reliability.py
test-mid: test-fast
	$(BIN)/python -m pytest -m slow -q -n $(TEST_PROCESSES) $(MID_TESTS)

# Every exercise's check fails its stub and passes its reference solution, fails the runs
# the notebook made before it, refuses overrides (make test proves the same through the
# notebooks' executions and tests/test_labs.py).
check-labs: setup
	$(BIN)/python -m workshop_lib.labs check

# What a learner's machine or image gets, in the new folder KIT: the repository's tracked
# files less tests/, .ci/ and assessment/ but its release/, no git history; `make lab`, the
# notebooks, the exercises' checks and the assessment's Validate work there
# (jupyter/learner/make_kit.py). Build learner images from it, never from a clone.
KIT ?= build/learner-kit
learner-kit: setup
	$(BIN)/python jupyter/learner/make_kit.py $(KIT)

# The instructor's check of a GPU workstation image: GPU-marked tests, every notebook with
# the GPU profile and the exercises' reference solutions, the quick bench, each under its
# own time limit (workshop_lib/gpu_check/budget.py); the report, logs and runs go to
# build/gpu-check/ (report.md). On a GPU image with torch alone (no `make setup`), the
# one-GPU smoke: PYTHONPATH=. python -m workshop_lib.gpu_check --smoke
gpu-check: setup
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m workshop_lib.gpu_check --out $(abspath build/gpu-check)

# Scaling, loop overhead, communication and data path, measured on this machine (BENCHMARKS.md).
bench: setup
	$(BIN)/python -m workshop_lib.bench --out runs/bench.json

# The class server: JupyterHub with a learner account per learner, nbgrader's exchange and
# the formgrader, everything in CLASS_DIR (deploy/classroom/README.md: the class day, sizing,
# GPUs through SLURM). Run as root; CLASS_ARGS adds `classroom.py init` options, e.g.
#   make classroom CLASS_LEARNERS=30 CLASS_ARGS="--ip 0.0.0.0 --self-signed class.example.org --instructors alice"
# (HTTPS with a certificate made for that name; each learner's own password is on the
# hand-out sheet CLASS_DIR/secrets/handout.txt).
CLASS_DIR ?= /srv/ddp-workshop
CLASS_LEARNERS ?= 30
CLASS_PREFIX ?= learner
CLASS_ARGS ?=
CLASSROOM := /usr/bin/python3 deploy/classroom/classroom.py --state $(CLASS_DIR)
classroom: setup
	$(CLASSROOM) env --course-env $(VENV)
	$(CLASSROOM) init $(CLASS_ARGS)
	$(CLASSROOM) accounts add $(CLASS_LEARNERS) --prefix $(CLASS_PREFIX)
	$(CLASSROOM) serve

doctor: setup
	$(BIN)/python -m workshop_lib doctor

lint: setup
	$(BIN)/ruff check workshop_lib tests assessment jupyter notebooks

clean:
	rm -rf $(VENV) runs notebooks/runs .pytest_cache
