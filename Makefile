# servelab: two commands do everything on a fresh machine.
#   make book   set up .venv if needed, then build the HTML book into _build/html
#   make test   set up .venv (and headless Chromium) if needed, then run every test
#   make vllm   (optional) vLLM's CPU build in .venv-vllm, for the parity tests against vLLM
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.servelab-installed
# One BLAS/torch thread each: results repeat on this 2-vCPU VM and tests do not fight.
export OMP_NUM_THREADS ?= 1
export MKL_NUM_THREADS ?= 1
export PYTHONHASHSEED := 0
PYTEST_ARGS ?=
# Tests run on every core (pytest-xdist); --dist loadfile keeps each test file (its shared
# engine or server, a notebook's cells) in one worker. PYTEST_JOBS=0 runs in one process.
PYTEST_JOBS ?= $(shell nproc 2>/dev/null || echo 1)

.PHONY: setup book test lab browser clean-book lint-prose bench serve profile vllm

setup: $(STAMP)

# Rebuilt only when the pins or the package metadata change.
$(STAMP): requirements.txt pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (Python 3.11) on PATH"; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	@touch $@

# vLLM's CPU build in a venv of its own (.venv is never touched): tests/test_vs_vllm.py
# runs it in a subprocess and skips when it is absent. Rebuilt only when the pins change.
# torch first from the local CPU wheel (any other torch downloads a CUDA build); pip also
# pulls torchvision/torchaudio/torchcodec builds that do not match the CPU torch and break
# `import vllm` ("operator torchvision::nms does not exist"): text models need none of them.
VLLM_VENV := .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.servelab-vllm-installed

vllm: $(VLLM_STAMP)

$(VLLM_STAMP): requirements-vllm.txt
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (Python 3.11) on PATH"; exit 1; }
	@rm -f $@
	@test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --quiet torch==2.13.0
	$(VLLM_PY) -m pip install --quiet -r requirements-vllm.txt
	$(VLLM_PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_PY) -c "import vllm; print('vllm', vllm.__version__, 'in $(VLLM_VENV)')"
	@touch $@

# Headless Chromium for the book's browser test (Debian package).
browser:
	@command -v chromium >/dev/null || { \
	  echo "installing chromium (Debian package) for the browser test"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; }

book: setup
	$(PY) tools/build_book.py --out _build
	@echo "Book: file://$(CURDIR)/_build/html/index.html"

test: setup browser
	@test -f $(VLLM_STAMP) || echo "vLLM parity tests will skip: run 'make vllm' first to get them (vLLM's CPU build in .venv-vllm)"
	$(PY) -m pytest -q -n $(PYTEST_JOBS) --dist loadfile tests chapters solutions --nbval --nbval-current-env \
	  --nbval-sanitize-with tests/nbval_sanitize.cfg -p no:cacheprovider $(PYTEST_ARGS)

# The course voice's reading measures, chapter by chapter (also a test in `make test`).
lint-prose: setup
	$(PY) tools/lint_prose.py

lab: setup
	$(VENV)/bin/jupyter lab chapters

# The OpenAI-compatible server over the course model (chapter 1), on 127.0.0.1:8000.
serve: setup
	$(PY) -m servelab.server --model data/models/servelab-main --port 8000

# Where one engine step's time goes, phase by phase (chapter 17).
profile: setup
	$(PY) -m servelab.engine.profile

# Every speed and memory claim, rerun (about an hour, one thread); results land in
# benchmarks/results/ beside the machine that made them. Re-execute the chapters that
# read them afterwards (see benchmarks/README.md).
bench: setup
	$(PY) benchmarks/bench_bpe.py
	$(PY) benchmarks/bench_roofline.py || echo "bench_roofline: a speed goal was missed (see benchmarks/results/roofline.md)"
	$(PY) benchmarks/bench_engine.py
	$(PY) benchmarks/bench_server.py
	$(PY) benchmarks/bench_speculative.py
	$(PY) benchmarks/bench_quant.py
	$(PY) benchmarks/bench_kernels.py
	$(PY) benchmarks/bench_parallel.py
	$(PY) benchmarks/bench_sim.py

clean-book:
	rm -rf _build
