# One entry point for learners, instructors and CI.
#   make lab    set up (first time only) and open the course in JupyterLab
#   make test   set up (first time only) and run the whole test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Re-install only when the dependency list changes.
STAMP := $(VENV)/.installed-from-pyproject
PORT ?= 8888
# JupyterLab refuses to run as root unless told; CI and containers run as root.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: setup lab test doctor lint html clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

lab: setup
	$(BIN)/python -m workshop_lib doctor
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/jupyter lab --port=$(PORT) $(ROOT_FLAG) notebooks

# Executed copies of every notebook, as HTML, in build/html (profile auto: this machine's).
html: setup
	mkdir -p build/executed build/html
	cd notebooks && for nb in [0-9]*.ipynb; do \
	  PATH="$(abspath $(BIN)):$$PATH" ../$(BIN)/papermill -k python3 --no-progress-bar \
	    "$$nb" "../build/executed/$$nb" -p runs_dir "../build/runs/$${nb%.ipynb}" || exit 1; \
	done
	$(BIN)/jupyter nbconvert --to html --output-dir build/html build/executed/*.ipynb

test: setup
	$(BIN)/ruff check workshop_lib tests
	$(BIN)/python -m pytest

doctor: setup
	$(BIN)/python -m workshop_lib doctor

lint: setup
	$(BIN)/ruff check workshop_lib tests

clean:
	rm -rf $(VENV) runs notebooks/runs .pytest_cache
