# odal: `make run` starts everything on the embedded default, `make test` runs the whole suite.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: run test lint format openapi clean mutations fuzz torture partition bench

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml $(VENV)/.installed
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

run: $(VENV)/.installed
	$(BIN)/odal migrate --noinput
	$(BIN)/odal demo
	$(BIN)/odal up

# The suite on PYTEST_WORKERS processes (pytest-xdist, each with its own test database); 0 runs
# it in this one process. PYTEST_ARGS goes last, e.g. PYTEST_ARGS="-k abandon". --dist load hands
# each worker the tests in their order (the transactional ones, which empty the tables, last);
# worksteal would not.
PYTEST_WORKERS ?= 2

test: $(VENV)/.installed-test
	$(BIN)/python tests/pg.py -- $(BIN)/pytest -n $(PYTEST_WORKERS) --dist load $(PYTEST_ARGS)

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

format: $(VENV)/.installed-test
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

openapi: $(VENV)/.installed
	$(BIN)/odal export_openapi_schema --api odal.surfaces.api.api --indent 2 --sorted --output docs/api/openapi.json
	@echo "wrote docs/api/openapi.json"

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache

mutations: $(VENV)/.installed-test
	$(BIN)/python tests/pg.py -- $(BIN)/python tests/mutations.py $(if $(SHARD),--shard $(SHARD))

fuzz: $(VENV)/.installed-test
	ODAL_FUZZ_EXAMPLES=100 ODAL_TEST_DATABASE=test_odal_fuzz $(BIN)/python tests/pg.py -- $(BIN)/pytest -q tests/test_fuzz.py tests/test_state_machines.py

torture: $(VENV)/.installed-test
	$(BIN)/python tests/pg.py -- $(BIN)/python tests/torture.py --events 500 --sweeps 8 --seconds 120 --registry-seconds 60 --json var/torture.json

# Three worker hosts in network namespaces, their links cut (needs root and `ip netns`; it starts
# its own PostgreSQL and Redis, so it needs no DATABASE_URL).
partition: $(VENV)/.installed-test
	$(BIN)/python tests/partition.py --hosts 3 --seconds 240 --settle 60 --require-partitions 20 --require-kills 20 --json var/partition.json

bench: $(VENV)/.installed-test
	$(BIN)/python tests/pg.py -- $(BIN)/python bench/run.py
