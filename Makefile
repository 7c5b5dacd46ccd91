# shardstream — every target sets up what it needs on a fresh machine (a virtualenv in .venv).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: setup demo test soak bench loadtest scale chaos proto proto-check lint docs image image-smoke clean

setup: $(STAMP)

# torch comes first, pinned: a bare `torch` requirement would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml shardstream/_kernels.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev,torch]'
	$(BIN)/pip install --quiet --no-deps torchtitan==0.3.0  # its deps would pull another torch (pyproject: extra torchtitan)
	touch $(STAMP)

demo: setup                ## end-to-end demo: ingest, 2 servers, 2 ranks train, resume on 3, exactly-once check
	$(BIN)/shardstream demo

test: setup                ## the test suite (real server processes on loopback)
	$(BIN)/python -m pytest

soak: setup                ## slow soak tests, not run in CI
	$(BIN)/python -m pytest -m slow

BENCH_ARGS ?=
bench: setup               ## the benchmarks as ratios (loadtest/README.md); BENCH_ARGS=--quick for a short run
	$(BIN)/python -m loadtest.suite $(BENCH_ARGS)

LOADTEST_ARGS ?= --servers 2 --ranks 4 --step-ms 10 --duration 20
loadtest: setup            ## M servers, N simulated ranks: samples/s, batch wait, stall, read amplification, CPU/RSS
	$(BIN)/python -m loadtest $(LOADTEST_ARGS) --json loadtest/results/loadtest.json --png loadtest/results/loadtest.png

SCALE_ARGS ?=
scale: setup               ## the rank simulator: 1,000 ranks, 4 servers, Redis; start/commit/restart/failover storms (~4 min, not in CI)
	$(BIN)/python -m loadtest.scale $(SCALE_ARGS)

CHAOS_ARGS ?=
chaos: setup               ## every fault against real processes: what the fleet survives (loadtest/chaos.py, ~7 min); CHAOS_ARGS=--small for seconds a fault
	$(BIN)/python -m loadtest.chaos $(CHAOS_ARGS)

proto: setup               ## regenerate shardstream/v1 from protos/
	PYTHON=$(BIN)/python tools/gen_proto.sh

proto-check: proto         ## fail when the committed stubs differ from the protos
	git diff --exit-code -- shardstream/v1 || (echo "generated stubs drifted: run 'make proto' and commit" >&2; exit 1)

lint: setup
	$(BIN)/ruff check .

docs: setup                ## the manual (docs/, the RUNBOOK, the API reference) as a site in site/; a broken link fails it
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

image:                     ## deploy/Dockerfile built with Debian's podman on a base made by mmdebstrap (no registry; ~2 min)
	deploy/image/build.sh

image-smoke: setup image   ## run the image as the chart does: health SERVING, /metrics 200, a Loader here reads a dataset once
	$(BIN)/python -m pytest -q tests/test_image.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis site build/docs-src
