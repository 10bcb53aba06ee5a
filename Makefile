# gpulab: every target is idempotent; the virtual environment is (re)built only when the
# dependency files change.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.gpulab-installed

# Without an NVIDIA GPU, pin the CPU build of torch (see constraints/cpu.txt).
HAS_NVIDIA_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
ifeq ($(HAS_NVIDIA_GPU),yes)
  TORCH_PIN :=
else
  TORCH_PIN := -c constraints/cpu.txt
endif
TORCH_CPU_INDEX ?=
PIP_INDEX := $(if $(TORCH_CPU_INDEX),--extra-index-url $(TORCH_CPU_INDEX),)

JUPYTER_ARGS ?=
PYTEST_ARGS ?=
BENCH_ARGS ?=

.PHONY: install lab test lint bench doctor clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints/cpu.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check $(TORCH_PIN) $(PIP_INDEX) -e '.[course]'
	@touch $@

lab: install
	$(VENV)/bin/jupyter lab --ServerApp.root_dir="$(CURDIR)" \
	  --LabApp.default_url=/lab/tree/lessons $(JUPYTER_ARGS)

test: install
	$(PY) -m pytest -n 2 --dist loadfile $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check gpulab autograder tests benchmarks

bench: install
	$(PY) benchmarks/run.py $(BENCH_ARGS)

doctor: install
	$(PY) -m gpulab doctor

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
