# Everything a fresh machine needs: `make demo` runs the main job, `make test` the suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test coverage bench bench-peers clean setup

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@# mypy's cache (.mypy_cache) made once with the environment: what it learns of numpy, torch and
	@# the other dependencies stays valid, so make test's type check (tests/guards/test_types.py)
	@# checks only conveyor's modules that changed. Its findings are make test's to report.
	-$(PY) -m mypy > /dev/null
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m conveyor.cli demo

# The lint and format check first (seconds; [tool.ruff] in pyproject.toml), then the suite: on
# JOBS pytest processes (pytest-xdist; the tests of Ray in one group, on one process:
# tests/conftest.py), then the tests marked serial (they load or measure the whole machine) alone,
# collected from the files that mark them only. Both passes run; either failing fails.
# JOBS is more than this machine's two cores: many tests wait (on workers starting, on Ray, on
# timeouts they test), and a third process fills those waits.
LINTED := src tests bench examples
JOBS ?= 3

test: $(STAMP)
	$(PY) -m ruff check $(LINTED)
	$(PY) -m ruff format --check $(LINTED)
	status=0; \
	$(PY) -m pytest -q -n $(JOBS) --dist loadgroup -m "not serial" || status=$$?; \
	$(PY) -m pytest -q -m serial $$(grep -rlE 'mark\.serial' tests --include='test_*.py') || status=$$?; \
	exit $$status

# The suite under coverage.py, workers included (see [tool.coverage.run] in
# pyproject.toml); the report is printed even when a test fails.
coverage: $(STAMP)
	rm -f .coverage .coverage.*
	$(PY) -m coverage run -m pytest -q; status=$$?; \
	$(PY) -m coverage combine -q && $(PY) -m coverage report; \
	exit $$status

bench: $(STAMP)
	$(PY) bench/run.py

# The peers bench/mix.py and bench/scale_order.py measure conveyor against (Grain, Hugging Face
# datasets, litdata, MosaicML Streaming), in a folder beside the environment, not in it: their own
# requirements would move the dev environment's numpy, fsspec and transformers, and Streaming's a
# torchvision that does not load against the CPU torch (pip install --dry-run shows both). So each
# is installed with --no-deps, with the few modules it imports that the environment lacks; the
# benchmarks add the folder to sys.path after the environment's own (--peers-path, their default
# when it exists).
PEERS := .bench-peers
PEER_PACKAGES := grain==0.2.18 absl-py==2.5.1 etils==1.15.0 array_record==0.8.6 portpicker==1.6.0 \
	datasets==5.0.1 dill==0.4.1 multiprocess==0.70.19 xxhash==4.1.0 httpx==0.29.0 httpcore==1.0.9 \
	litdata==0.2.76 mosaicml-streaming==0.13.0

bench-peers: $(STAMP)
	$(PY) -m pip install --quiet --no-deps --target $(PEERS) $(PEER_PACKAGES)

clean:
	rm -rf $(VENV) $(PEERS) build src/*.egg-info .pytest_cache .coverage .coverage.*
