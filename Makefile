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
# `make test` runs the suite in parallel (pytest-xdist, from the dev extra): JOBS workers, one per CPU the OS reports
# plus one (see below; `make test JOBS=N` overrides), each test file (and so each notebook, whose cells share one kernel) on one worker, the longest files
# first (tests/conftest.py orders them; --no-loadscope-reorder keeps that order). PARALLEL= runs it in one process.
# One worker more than the CPUs: about a third of the suite's wall time is spent waiting (kernels starting, torchrun
# ranks meeting, timed-out cells, nbgrader's commands), and the extra worker fills it (idle, 2 cores: 531 s with 3
# workers, 550 s with 2, same tree).
JOBS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 1) + 1 )))
PARALLEL ?= -n $(JOBS) --dist loadfile --no-loadscope-reorder
SITE_OUT ?= site/_build/html
SITE_STAMP := $(VENV)/.installed-site
# make test-latest: a separate environment with the newest releases; e.g. LATEST_TORCH_ARGS="--index-url <CPU wheel index>".
LATEST ?= .venv-latest
LATEST_TORCH_ARGS ?=

.PHONY: help install lab test test-fast test-tiers test-portable test-latest lint exercises check-exercises grade grade-class times doctor site site-test clean

help:
	@echo "make lab              start JupyterLab on notebooks/ (installs into $(VENV) first if needed)"
	@echo "make test             lint, then the whole test suite (unit tests, nbval, assignment pipeline, grader attacks)"
	@echo "make test-fast        the test suite without the slow tests (no notebook execution)"
	@echo "make test-tiers       the GPU tiers' cells under a simulated sm_90 and T4, and the Triton lessons without Triton"
	@echo "make test-portable    test-tiers, then nbval under emulated CPUs (no SIMD, AVX2), 1 and 2 threads, and without Triton"
	@echo "make test-latest      the test suite against the newest releases in $(LATEST), listing drift from constraints.txt"
	@echo "make lint             ruff on the package, tests, benchmarks, lessons and solutions"
	@echo "make exercises        regenerate exercises/ from solutions/"
	@echo "make check-exercises  fail when exercises/ differs from what solutions/ generates"
	@echo "make grade NB=path/to/notebook.ipynb   grade a learner's notebook against the pristine problem set"
	@echo "make grade-class DIR=path/to/folder    grade a folder of submissions into gradebook.csv/json"
	@echo "make times            measure every notebook's CPU run time into benchmarks/results/"
	@echo "make doctor           check the installation"
	@echo "make site             build the course website from the committed notebooks into $(SITE_OUT) (installs the site extra)"
	@echo "make site-test        build the site in a temporary folder and check it in headless Chromium; screenshots in site/_screenshots"
	@echo "make install          create $(VENV) and install the course (TORCH_SPEC=torch==X for a CPU wheel)"
	@echo "make clean            remove $(VENV) and caches"

$(PY):
	$(PYTHON) -m venv $(VENV)

# Reinstall only when the package definition or the verified versions change.
$(STAMP): pyproject.toml constraints.txt | $(PY)
	$(if $(TORCH_SPEC),$(PY) -m pip install --quiet -c constraints.txt "$(TORCH_SPEC)",)
	$(PY) -m pip install --quiet -c constraints.txt -e ".[dev]"
	touch $(STAMP)

# The website's generator only for those who build it: `make lab` stays lean.
$(SITE_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -c constraints.txt -e ".[dev,site]"
	touch $(SITE_STAMP)

install: $(STAMP)

lab: $(STAMP)
	$(BIN)/jupyter lab --notebook-dir=notebooks --port=$(PORT) $(ROOT_FLAG) $(LAB_ARGS)

# The tests marked `portable` run the course as other machines would (simulated GPU tiers, no Triton): they are
# `make test-tiers`, which CI runs after `make test`.
test: lint
	$(PY) -m pytest $(PARALLEL) -m "not portable" $(PYTEST_ARGS)

test-tiers: $(STAMP)
	$(PY) -m pytest $(PARALLEL) -m portable $(PYTEST_ARGS)

test-portable: test-tiers
	$(PY) -m course_utils.devtools.portable --no-triton

lint: $(STAMP)
	$(BIN)/ruff check .

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow and not portable" $(PARALLEL) $(PYTEST_ARGS)

exercises: $(STAMP)
	$(PY) -m course_utils exercises

check-exercises: $(STAMP)
	$(PY) -m course_utils exercises --check

grade: $(STAMP)
	@test -n "$(NB)" || { echo "usage: make grade NB=path/to/notebook.ipynb"; exit 2; }
	@# exit 1 means "graded, not full marks": a result, not a failure of make
	@$(PY) -m course_utils grade "$(NB)" $(GRADE_ARGS); rc=$$?; [ $$rc -eq 0 ] || [ $$rc -eq 1 ] || exit $$rc

grade-class: $(STAMP)
	@test -n "$(DIR)" || { echo "usage: make grade-class DIR=path/to/submissions"; exit 2; }
	$(PY) -m course_utils grade-class "$(DIR)" $(GRADE_ARGS)

times: $(STAMP)
	$(PY) -m course_utils times --output benchmarks/results/notebook_times_cpu.json

doctor: $(STAMP)
	$(PY) -m course_utils doctor

site: $(SITE_STAMP)
	$(PY) site/build.py --out $(SITE_OUT)

site-test: $(SITE_STAMP)
	SITE_SCREENSHOTS=site/_screenshots $(PY) -m pytest tests/test_site.py $(PYTEST_ARGS)

# Drift: the newest releases of everything, ignoring constraints.txt, in an environment of their own.
test-latest:
	rm -rf $(LATEST)
	$(PYTHON) -m venv $(LATEST)
	$(LATEST)/bin/python -m pip install --quiet --upgrade pip
	$(LATEST)/bin/python -m pip install --quiet --upgrade torch $(LATEST_TORCH_ARGS)
	$(LATEST)/bin/python -m pip install --quiet --upgrade --upgrade-strategy eager -e ".[dev]"
	$(LATEST)/bin/python tools/constraints.py drift
	$(LATEST)/bin/ruff check .
	$(LATEST)/bin/python -m pytest $(PARALLEL) $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(LATEST) .pytest_cache site/_build
