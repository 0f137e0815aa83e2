# Set-up and entry points. `make demo` and `make test` each do the whole set-up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# CPU PyTorch first, pinned: an unpinned torch pulls a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
# ALGO empty: the demo config's algorithm (espo on the block model, with its recipe; tracerl on the full, vision and gemma ones)
# MODEL: block | full | block8 | vision (the LLaDA-V-shaped model on the shapes image task) | gemma (DiffusionGemma-shaped)
ALGO ?=
MODEL ?= block
# RECIPE: a named recipe over the demo's (speed: a speed reward where the answer is right; docs/rewards.md)
RECIPE ?=
PYTEST_ARGS ?=
# Test workers (pytest-xdist): most tests run tiny models single-threaded, so one worker per core (at most 4)
# nearly halves the suite on CI's 2 cores. TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= auto

.PHONY: install sysdeps cxx deepspeed-ops test lint docs demo bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet "$(TORCH_SPEC)"
	$(PIP) install --quiet -e ".[test,serve]"
	touch $@

install: $(VENV)/.installed

# A C++ compiler: torch.compile on CPU builds its kernels with one (rollout.compile and its tests).
# Installed only when missing and when we are root.
cxx:
	@if ! command -v g++ >/dev/null && [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null; then \
	  echo "installing system packages: g++"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ >/dev/null; \
	fi

# System packages the tests use: bubblewrap (code sandbox) and chromium (trace viewer browser test).
# Installed only when missing and when we are root; otherwise the tests that need them say so and skip.
sysdeps: cxx
	@if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null; then \
	  missing=""; \
	  command -v bwrap >/dev/null || missing="$$missing bubblewrap"; \
	  command -v chromium >/dev/null || missing="$$missing chromium"; \
	  if [ -n "$$missing" ]; then \
	    echo "installing system packages:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  fi; \
	fi

# DeepSpeed's CPU ops (shared-memory all-reduce, CPU Adam), JIT-built into torch's extension cache before the
# suite, so the ZeRO tests do not compile them inside the 2-rank launches. Checked on every `make test` (a few
# seconds when built): torch rebuilds an op whose build paths changed, e.g. after another virtual environment
# built it into the same cache (measured: a 237 s rebuild inside the ZeRO-3 offload test).
deepspeed-ops: install
	$(MAKE) --no-print-directory cxx
	$(PY) scripts/build_deepspeed_ops.py

# ruff (with the C90 complexity gate of pyproject.toml) runs first: a lint failure stops `make test` before the suite.
# --dist loadfile: each test module runs on one worker, so its module fixtures (a module's 2-rank launches, the CLI
# forks of tests/core/test_user_errors.py) run once. `--dist loadgroup` with xdist_group marks does not group under
# pytest 9 (xdist renames node ids through an attribute pytest 9 no longer reads), and split modules ran those
# fixtures on both workers: the suite took 9:26 that way and 8:33 with loadfile (2 workers, quiet machine).
test: lint sysdeps deepspeed-ops
	$(PY) scripts/run_tests.py -n $(TEST_WORKERS) --maxprocesses 4 --dist loadfile $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check src tests benchmarks scripts

# every generated part of the docs: docs/config.md and the preset table of docs/methods.md (a test checks them)
docs: install
	$(PY) scripts/make_docs.py

# each `make demo` starts afresh in runs/demo/MODEL-ALGO, replacing the previous demo run there
demo: install
	$(PY) -m dllm_rl demo $(if $(ALGO),--algorithm $(ALGO)) $(if $(RECIPE),--recipe $(RECIPE)) --model $(MODEL)

# the sampler's speed gate: both text demos' decoding as a ratio against the in-repo reference loop of the same run,
# checked against benchmarks/bench_floor.json (exit 1 below a floor); about 2 minutes on 2 cores, out of the suite
bench: install
	$(PY) benchmarks/bench.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache
