# The two commands of the README:  make synth  and  make test.
# Both set up everything they need from this repository's own files, then run:
#   make synth  a virtual environment with what synthesis needs (requirements-synth.txt) and the
#               pinned CDK CLI (package-lock.json);
#   make test   the same environment plus the tests' toolchain (requirements-dev.txt).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := .make
# jsii prints a banner on every process under Node 20, whose support ended on 2026-10-30; this
# repository is tested on Node 20, so the banner is silenced (Node 22 or 24 need nothing).
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export PATH := $(CURDIR)/$(BIN):$(PATH)
export PYTHONDONTWRITEBYTECODE := 1
export CDK_DISABLE_VERSION_CHECK := 1
# The product layer of the library's functions (rayito_constructs/wheels.py): its Linux wheels are
# fetched, and the layer built from them, when the environment is set up (fetch-wheels), so a synth
# reaches no package index and even the first one builds nothing; other layers are cached per clone.
export RAYITO_CONSTRUCTS_WHEELHOUSE := $(CURDIR)/$(STAMP)/wheels
export RAYITO_CONSTRUCTS_CACHE := $(CURDIR)/$(STAMP)/cache

.PHONY: synth test lint bench clean

synth: $(STAMP)/synth $(STAMP)/node
	npx cdk synth --quiet --no-notices --no-version-reporting $(CDK_ARGS)
	$(BIN)/python -m rayito_constructs assembly cdk.out

# make test: the suite on $(WORKERS) pytest-xdist workers under coverage (branches, and every
# subprocess a test starts, through coverage's subprocess patch: pyproject.toml), then the report
# and the floor of issue #17 (tests/coverage_floor.py: 95% lines, 90% branches for each Lambda under
# lambdas/ and for rayito_constructs/egress). A partial run (PYTEST_ARGS=tests/test_x.py) skips
# the floor with COVERAGE_FLOOR=0. --dist loadfile keeps each file's tests on one worker, in order:
# module-scoped synths are made once, and tests/test_fleet.py's stability check compares two
# synths of one file's run, as it does without xdist. --no-loadscope-reorder: files are handed out
# in collection order (tests/conftest.py puts the longest first), not by their count of tests.
# One worker more than the cores: a worker that waits on real time (a contract test's Lambda
# process, a client's timeout, the CDK's Node process) leaves its core to another (2 cores: 3).
WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
COVERAGE_FLOOR ?= 1
test: $(STAMP)/python
	$(BIN)/ruff check rayito_constructs lambdas benchmarks tests app.py
	$(BIN)/mypy
	rm -rf $(STAMP)/coverage && mkdir -p $(STAMP)/coverage
	$(BIN)/python -m coverage run -m pytest -n $(WORKERS) --dist loadfile --no-loadscope-reorder --durations=25 $(PYTEST_ARGS)
	$(BIN)/python -m coverage combine --quiet
	$(BIN)/python -m coverage report
	test "$(COVERAGE_FLOOR)" = 0 || $(BIN)/python -m tests.coverage_floor

bench: $(STAMP)/python
	$(BIN)/python -m benchmarks.synth
	$(BIN)/python -m benchmarks.emulator
	$(BIN)/python -m benchmarks.egress
	$(BIN)/python -m benchmarks.reconciler --fleets 100 --seed 1
	$(BIN)/python -m benchmarks.metrics

$(STAMP)/synth: requirements-synth.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements-synth.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	$(BIN)/python -m rayito_constructs fetch-wheels $(STAMP)/wheels
	mkdir -p $(STAMP) && touch $@

$(STAMP)/python: $(STAMP)/synth requirements.txt requirements-dev.txt requirements-lambda-runtime.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --upgrade \
		--target $(STAMP)/lambda-runtime -r requirements-lambda-runtime.txt
	$(BIN)/python -m rayito_constructs fetch-wheels --host $(STAMP)/wheels
	mkdir -p $(STAMP) && touch $@

$(STAMP)/node: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	mkdir -p $(STAMP) && touch $@

clean:
	rm -rf $(VENV) $(STAMP) node_modules cdk.out
