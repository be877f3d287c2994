# Loops to Kernels: the two commands are `make lab` and `make test` (see README.md).
# Both create .venv when missing and install the course into it; a second run installs nothing.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PY     := $(BIN)/python
STAMP  := $(VENV)/.installed
# Extra pip arguments for the first install, e.g. TORCH_SPEC="torch==2.13.0" for a CPU wheel.
TORCH_SPEC ?=
PORT   ?= 8888
LAB_ARGS ?=
# Jupyter refuses to run as root unless told; containers often run as root.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)
NB     ?=
DIR    ?=
PYTEST_ARGS ?=

.PHONY: help install lab test test-fast test-portable lint exercises check-exercises grade grade-class times doctor clean

help:
	@echo "make lab              start JupyterLab on notebooks/ (installs into $(VENV) first if needed)"
	@echo "make test             lint, then the whole test suite (unit tests, nbval, assignment pipeline, grader attacks)"
	@echo "make test-fast        the test suite without the slow tests (no notebook execution)"
	@echo "make test-portable    nbval under emulated CPUs (no SIMD, AVX2), 1 and 2 threads, and without Triton (about 10 min)"
	@echo "make lint             ruff on the package, tests, benchmarks, lessons and solutions"
	@echo "make exercises        regenerate exercises/ from solutions/"
	@echo "make check-exercises  fail when exercises/ differs from what solutions/ generates"
	@echo "make grade NB=path/to/notebook.ipynb   grade a learner's notebook against the pristine problem set"
	@echo "make grade-class DIR=path/to/folder    grade a folder of submissions into gradebook.csv/json"
	@echo "make times            measure every notebook's CPU run time into benchmarks/results/"
	@echo "make doctor           check the installation"
	@echo "make install          create $(VENV) and install the course (TORCH_SPEC=torch==X for a CPU wheel)"
	@echo "make clean            remove $(VENV) and caches"

$(PY):
	$(PYTHON) -m venv $(VENV)

# Reinstall only when the package definition changes.
$(STAMP): pyproject.toml | $(PY)
	$(if $(TORCH_SPEC),$(PY) -m pip install --quiet "$(TORCH_SPEC)",)
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

lab: $(STAMP)
	$(BIN)/jupyter lab --notebook-dir=notebooks --port=$(PORT) $(ROOT_FLAG) $(LAB_ARGS)

test: lint
	$(PY) -m pytest $(PYTEST_ARGS)

test-portable: $(STAMP)
	$(PY) -m course_utils.portable --no-triton

lint: $(STAMP)
	$(BIN)/ruff check .

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

exercises: $(STAMP)
	$(PY) -m course_utils exercises

check-exercises: $(STAMP)
	$(PY) -m course_utils exercises --check

grade: $(STAMP)
	@test -n "$(NB)" || { echo "usage: make grade NB=path/to/notebook.ipynb"; exit 2; }
	$(PY) -m course_utils grade "$(NB)"

grade-class: $(STAMP)
	@test -n "$(DIR)" || { echo "usage: make grade-class DIR=path/to/submissions"; exit 2; }
	$(PY) -m course_utils grade-class "$(DIR)"

times: $(STAMP)
	$(PY) -m course_utils times --output benchmarks/results/notebook_times_cpu.json

doctor: $(STAMP)
	$(PY) -m course_utils doctor

clean:
	rm -rf $(VENV) .pytest_cache
