# Two entry points for a fresh machine (see README): `make run` and `make test`.
# Everything they need is installed by them, into .venv and .cache/; a second
# run finds it there and starts at once.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test install jars clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# Resolve the JVM artifacts of conf/jvm.toml from Maven Central into .cache/jars.
jars: $(STAMP)
	$(BIN)/bitroute jars

run: jars
	$(BIN)/bitroute broker start
	$(BIN)/bitroute run

test: jars
	$(BIN)/python -m pytest $(PYTEST_ARGS)

clean:
	-$(BIN)/bitroute broker stop
	rm -rf .bitroute
