# The same commands run locally and in CI (.ci/run calls `make test`).
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

.PHONY: core install test lint docs demo bench bench-quick interop interop04 interop07 clean

# Two stamps in one venv. The core (.core) is all `make demo` needs: rollgym and its required
# dependencies, about 320 MB. The dev extra (.installed) adds what the tests exercise: torch,
# Ray, TRL, transformers, OpenEnv, reasoning-gym, OpenTelemetry, the docs tools (gigabytes).
$(BIN)/.core: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	@# An editable install leaves src/ uncompiled, and with PYTHONDONTWRITEBYTECODE set every
	@# server process would compile rollgym again at each start (a pip-installed wheel ships
	@# its bytecode). Stale files are recompiled by Python itself on import.
	$(BIN)/python -m compileall -q src
	touch $@

$(BIN)/.installed: $(BIN)/.core
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

core: $(BIN)/.core

install: $(BIN)/.installed

lint: install
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy src
	$(BIN)/python scripts/import_cycles.py
	$(BIN)/python scripts/gen_reference.py --check
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# The docs site (mkdocs.yml) into out/site: plain HTML files that open offline.
docs: install
	$(BIN)/python scripts/gen_reference.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The container tests need podman, runc and a base image: installed and built once, where
# missing (scripts/install_containers.sh says in one line what it could not do).
test: lint
	scripts/install_containers.sh $(BIN)/python
	$(BIN)/pytest -q

demo: core
	rm -rf out/demo
	$(BIN)/rollgym run src/rollgym/envs/lookup/config.yaml --output out/demo; \
	  code=$$?; [ $$code -le 1 ] || exit $$code

bench: install
	$(BIN)/python bench/suite.py

bench-quick: install
	$(BIN)/python bench/throughput.py

# Interoperability with the real NeMo Gym (not part of test): nemo-gym==0.4.0 in its own
# Python 3.12 venv, nemo-gym==0.7.0 in a Python 3.13 one; one pytest run each, so the two
# releases' stacks never run side by side.
INTEROP_VENV ?= .interop-venv
INTEROP07_VENV ?= .interop07-venv

interop: interop04 interop07

interop04: install
	interop/setup.sh $(INTEROP_VENV)
	INTEROP_VENV=$(abspath $(INTEROP_VENV)) $(BIN)/pytest -q interop --ignore-glob='interop/test_ng07_*' \
	  tests/openenv/test_mixed_run.py

interop07: install
	interop/setup.sh --nemo 0.7 $(INTEROP07_VENV)
	INTEROP07_VENV=$(abspath $(INTEROP07_VENV)) $(BIN)/pytest -q interop/test_ng07_*.py

clean:
	rm -rf $(VENV) out .interop-venv .interop07-venv
