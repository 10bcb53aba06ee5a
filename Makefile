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
# Lessons are committed with the cpu runner's outputs: nbval compares them there. On the gpu
# runner (a GPU here and GPULAB_RUNNER not cpu) the outputs differ by design (GPU names, sizes,
# timings), so each lesson must run without error and its own asserts check the facts.
ifeq ($(HAS_NVIDIA_GPU)$(filter cpu,$(GPULAB_RUNNER)),yes)
  NBVAL ?= --nbval-lax
else
  NBVAL ?= --nbval
endif
TORCH_CPU_INDEX ?=
PIP_INDEX := $(if $(TORCH_CPU_INDEX),--extra-index-url $(TORCH_CPU_INDEX),)
# The install runs uv (resolving in parallel: seconds where pip takes minutes), with pip as the
# fallback. uv does not read pip's configuration, so the folders of local wheels pip is told
# about (a machine's copy of the CPU torch wheel, say) are passed on to it. It compiles the
# bytecode as pip does: where PYTHONDONTWRITEBYTECODE is set, or the venv is read-only (the
# grading sandbox), every process would otherwise compile torch's sources again.
PIP_FIND_LINKS ?= $(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null)
UV_FIND_LINKS = $(foreach links,$(PIP_FIND_LINKS),--find-links $(links))

JUPYTER_ARGS ?=
# Containers and cloud notebooks often run as root, which Jupyter refuses unless told.
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root,)
PYTEST_ARGS ?=
TEST_WORKERS ?= 3
BENCH_ARGS ?=
GPU_CHECK_ARGS ?=

# Grading (README, "Instructors"): make release LAB=...; make grade LAB=... SUBMISSIONS=...
LAB ?=
SUBMISSIONS ?=
RUNNER ?= cpu
JOBS ?= 1

.PHONY: install grader-tools browser-tools lab lab-instructor test test-quick lint bench gpu-check doctor \
  release grade clean hub hub-tools hub-users

# The course's own sources are compiled to bytecode on every install: where PYTHONDONTWRITEBYTECODE
# is set (CI machines, containers), Python never writes it, and every process (each grading
# kernel, rank and worker) would compile gpulab's 30k lines again. Only stale files are redone.
install: $(STAMP)
	@$(PY) -m compileall -q -j 0 gpulab autograder benchmarks tests >/dev/null

$(STAMP): pyproject.toml constraints/cpu.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check uv && \
	  $(VENV)/bin/uv pip install --quiet --compile-bytecode --python $(PY) $(UV_FIND_LINKS) \
	    $(TORCH_PIN) $(PIP_INDEX) --index-strategy unsafe-best-match -e '.[course]' || \
	  $(PY) -m pip install --quiet --disable-pip-version-check $(TORCH_PIN) $(PIP_INDEX) \
	    -e '.[course]'
	@touch $@

# The grading sandbox needs bubblewrap; install it where we can (root with apt), else say so.
grader-tools: install
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get install -y -qq bubblewrap >/dev/null 2>&1 || \
	    { apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null; }; \
	  else \
	    echo "warning: bubblewrap (bwrap) is missing: grading runs without its sandbox." \
	         "Install it with: sudo apt-get install bubblewrap"; \
	  fi; }
	@$(PY) -m autograder.sandbox >/dev/null || $(PY) -m autograder.sandbox | sed 's/^/warning: /'

# tests/test_browser.py drives headless Chromium; install it where we can, else it is skipped.
BROWSER_PACKAGES := chromium chromium-driver
browser-tools:
	@command -v chromedriver >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get install -y -qq --no-install-recommends $(BROWSER_PACKAGES) >/dev/null 2>&1 || \
	    { apt-get update -qq && \
	      apt-get install -y -qq --no-install-recommends $(BROWSER_PACKAGES) >/dev/null; } || \
	    echo "warning: could not install $(BROWSER_PACKAGES): the browser test is skipped."; \
	  else \
	    echo "warning: chromedriver is missing: the browser test (tests/test_browser.py) is" \
	         "skipped. Install it with: sudo apt-get install $(BROWSER_PACKAGES)"; \
	  fi; }

# Learners get JupyterLab without nbgrader's instructor tools (its menu, Create Assignment, the
# formgrader, the course and assignment lists) but with its Validate button: the Jupyter config
# in jupyter-config/learner/ turns them off for this launch only, ahead of the installed config.
# `make lab-instructor` opens the same JupyterLab with all of them.
# LAB_ROOT: the folder it serves (the tests serve a scratch one).
LAB_ROOT ?= $(CURDIR)
LAB_ARGS = --ServerApp.root_dir="$(LAB_ROOT)" --LabApp.default_url=/lab/tree/lessons \
  $(ALLOW_ROOT) $(JUPYTER_ARGS)
LEARNER_CONFIG := $(CURDIR)/jupyter-config/learner

lab: install
	JUPYTER_CONFIG_PATH="$(LEARNER_CONFIG)$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH}" \
	  $(VENV)/bin/jupyter lab $(LAB_ARGS)

lab-instructor: install
	$(VENV)/bin/jupyter lab $(LAB_ARGS)

# The class in a box (docs/instructors.md, "A class on one JupyterHub"): JupyterHub from PyPI
# (the `course` extra), its proxy from npm into .hub-tools/ (nothing global), demo accounts of
# hub/roster.py as system users, each user's JupyterLab started as that user. Root only: the
# hub switches to each user's account. HUB_STATE: its exchange, grading root, users' Jupyter state.
HUB_STATE ?= $(CURDIR)/.hub
HUB_PORT ?= 8000
HUB_ARGS ?=
HUB_TOOLS := $(CURDIR)/.hub-tools
HUB_PROXY := $(HUB_TOOLS)/node_modules/.bin/configurable-http-proxy
HUB_PROXY_VERSION := 4

hub-tools:
	@test -x $(HUB_PROXY) || { \
	  if command -v npm >/dev/null 2>&1; then \
	    npm install --silent --no-audit --no-fund --prefix $(HUB_TOOLS) \
	      configurable-http-proxy@$(HUB_PROXY_VERSION) >/dev/null 2>&1 || \
	    echo "warning: npm could not install configurable-http-proxy into $(HUB_TOOLS):" \
	         "make hub cannot start, and the hub test (tests/test_hub.py) is skipped."; \
	  else \
	    echo "warning: npm is missing: make hub needs JupyterHub's proxy" \
	         "(configurable-http-proxy, from npm), and tests/test_hub.py is skipped." \
	         "Install Node.js and npm (sudo apt-get install npm), then run make hub-tools."; \
	  fi; }

hub-users: install
	@test "$$(id -u)" = 0 || { echo "make hub runs as root: the hub starts each user's" \
	  "JupyterLab as that user's own account (see hub/jupyterhub_config.py). sudo make hub"; \
	  exit 2; }
	@for user in $$($(PY) hub/roster.py); do \
	  id -u $$user >/dev/null 2>&1 || useradd --create-home --shell /bin/bash $$user; done
	@# Every user runs the course's Python: a folder above it that others cannot enter (a
	@# Python built under root's private home, say) is opened for traversal only (o+x).
	@for path in $$(readlink -f $(PY)) $(abspath $(PY)); do dir=$$(dirname $$path); \
	  while [ "$$dir" != / ]; do \
	    if [ -z "$$(find $$dir -maxdepth 0 -perm -o=x)" ]; then chmod o+x $$dir && \
	      echo "make hub: $$dir may now be traversed by every user (o+x), so that the hub's" \
	           "users can run the course's Python"; fi; \
	    dir=$$(dirname $$dir); done; done

hub: install grader-tools hub-tools hub-users
	@test -x $(HUB_PROXY) || { echo "make hub: no proxy in $(HUB_TOOLS) (see the warning" \
	  "above)"; exit 2; }
	@mkdir -p $(HUB_STATE)
	cd $(HUB_STATE) && GPULAB_HUB_STATE=$(HUB_STATE) GPULAB_HUB_PORT=$(HUB_PORT) \
	  GPULAB_HUB_PROXY=$(HUB_PROXY) $(abspath $(VENV))/bin/jupyterhub \
	  -f $(CURDIR)/hub/jupyterhub_config.py $(HUB_ARGS)

# Unit and end-to-end tests, and every lesson re-executed against its committed outputs.
# Three workers on two cores: a good part of the suite waits (kernels and ranks starting, a
# grader's timeouts, Chromium, pip), and a third worker keeps both cores busy meanwhile.
# --dist loadfile: a file's tests on one worker, as nbval needs (a notebook's cells share a
# kernel); each notebook's grading batch is a file of its own, and tests/conftest.py sends the
# longest files first (--no-loadscope-reorder keeps that order).
# Its wall time goes to benchmarks/results/make-test.json, which `make bench` reports (target:
# under 20 minutes on a 2-core machine).
test: install grader-tools browser-tools hub-tools
	@start=$$(date +%s); \
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests lessons \
	  $(NBVAL) --nbval-sanitize-with lessons/nbval_sanitize.cfg --durations=15 $(PYTEST_ARGS); \
	status=$$?; mkdir -p benchmarks/results; \
	printf '{"seconds": %s, "exit": %s, "cores": %s, "commit": "%s", "args": "%s", "date": "%s"}\n' \
	  $$(( $$(date +%s) - start )) $$status $$(nproc) "$$(git rev-parse --short HEAD 2>/dev/null)" \
	  "$(subst ",',$(PYTEST_ARGS))" "$$(date -u +%FT%TZ)" > benchmarks/results/make-test.json; \
	exit $$status

# While you work: the tests that need no ranks, no cluster and no grading batch (the library's
# units, the simulator, the checkers' registry and layering, the fork server's protocol), in
# under 3 minutes on 2 cores. `make test` runs them too, with everything else.
QUICK_TESTS = tests/test_layering.py tests/test_runtime_forkserver.py tests/test_env.py \
  tests/test_compat.py tests/test_hardware.py tests/test_cloud_cost.py tests/test_cloud_templates.py \
  tests/test_distributed_schedule.py tests/test_distributed_groups.py tests/test_hints.py \
  tests/test_sim_races.py tests/test_sim_trace.py tests/test_sim_count_loops.py \
  tests/test_simulator_fix.py tests/test_quiz.py tests/test_quiz_slips.py \
  tests/test_autograder_units.py tests/test_models.py tests/test_data.py tests/test_run_log.py
test-quick: install
	$(PY) -m pytest -q $(QUICK_TESTS) -m "not slow and not dist and not gpu and not browser" \
	  $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check gpulab autograder tests benchmarks

bench: install
	$(PY) benchmarks/run.py $(BENCH_ARGS)

# On an NVIDIA GPU: GPU tests, lessons, grading on the gpu runner and the GPU benchmarks, about
# 8 minutes, written to docs/gpu-report.md. Without a GPU it says so and runs nothing.
gpu-check: install grader-tools
	$(PY) benchmarks/gpu_check.py $(GPU_CHECK_ARGS)

doctor: install
	$(PY) -m gpulab doctor

release: install
	@test -n "$(LAB)" || { echo "usage: make release LAB=lab1_cuda_kernels"; exit 2; }
	$(PY) -m autograder release $(LAB)

grade: install grader-tools
	@test -n "$(LAB)" || { echo "usage: make grade LAB=lab1_cuda_kernels SUBMISSIONS=dir"; exit 2; }
	$(PY) -m autograder grade $(LAB) $(SUBMISSIONS) --runner $(RUNNER) --jobs $(JOBS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
