# Two entry points for a fresh machine (see README): `make run` and `make test`.
# Everything they need is installed by them: Java and Maven from Debian's
# packages if missing, Python packages into .venv (the Rust matching kernel,
# kernel/, a dependency of bitroute's, built there by cargo through maturin), JVM jars into .cache/. A
# second run finds it all there and starts at once.

PYTHON ?= python3
# rustup installs cargo under ~/.cargo/bin, which non-login shells may not have on PATH.
export PATH := $(HOME)/.cargo/bin:$(PATH)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-unit lint install jars prereqs clean

# True when rustc is at least the kernel's rust-version (1.77).
RUSTC_RECENT = rustc --version | awk '{ split($$2, v, "."); exit !(v[1] > 1 || v[2] >= 77) }'

# Java 17 runs Spark and the Kafka broker (its javac builds realtime/); Maven resolves
# conf/jvm.toml; cargo builds the kernel (kernel/) from crates.io, with librdkafka compiled from source
# (C and C++ compilers: its configure wants both; make, pkg-config and OpenSSL's headers).
prereqs:
	@command -v java >/dev/null && command -v javac >/dev/null && command -v mvn >/dev/null || { \
	  echo "installing Java 17 (with javac) and Maven from Debian's packages"; \
	  apt-get update -qq && apt-get install -y -qq openjdk-17-jdk-headless maven >/dev/null; }
	@command -v cargo >/dev/null && command -v rustc >/dev/null && $(RUSTC_RECENT) || { \
	  echo "installing Rust (rustc >= 1.77, the kernel's) from Debian's packages: cargo-web where Debian's cargo is older (bookworm's is 1.63)"; \
	  apt-get update -qq && { apt-get install -y -qq cargo-web >/dev/null 2>&1 || apt-get install -y -qq cargo >/dev/null; }; \
	  $(RUSTC_RECENT) || { echo "rustc $$(rustc --version) is older than the kernel's 1.77: install a newer Rust (rustup) and run make again"; exit 1; }; }
	@command -v cc >/dev/null && command -v c++ >/dev/null && command -v make >/dev/null && pkg-config --exists openssl 2>/dev/null || { \
	  echo "installing C and C++ compilers, make, pkg-config and OpenSSL's headers from Debian's packages (the kernel's librdkafka: its configure wants a C++ compiler)"; \
	  apt-get update -qq && apt-get install -y -qq gcc g++ make perl pkg-config libssl-dev >/dev/null; }

# The Python module (kernel/src) and the pure-Rust core it is built on (kernel/core); the
# JNI library (kernel/jni) is the realtime jar's, built by its own cargo command, but a
# change of its manifest changes the workspace's Cargo.lock, so it is listed too.
KERNEL_SOURCES := kernel/Cargo.toml kernel/Cargo.lock kernel/pyproject.toml kernel/bitroute_kernel.pyi $(wildcard kernel/src/*.rs) \
	kernel/core/Cargo.toml $(wildcard kernel/core/src/*.rs) kernel/jni/Cargo.toml

$(STAMP): pyproject.toml $(KERNEL_SOURCES)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	@echo "installing bitroute into $(VENV), with its matching kernel (kernel/, Rust, built by cargo)"
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

install: prereqs $(STAMP)

# Resolve the JVM artifacts of conf/jvm.toml from Maven Central into .cache/jars, and
# build realtime mode's jar (realtime/ with the kernel's JNI library, kernel/jni: cargo
# and javac) into .cache/realtime/ (streaming/realtime/jar.py; rebuilt when they change).
jars: install
	$(BIN)/bitroute jars

# The router on the embedded default: local Spark, the embedded Kafka broker
# (started if it is not running), Delta tables under .bitroute/.
run: jars
	$(BIN)/bitroute run

test: jars
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The unit tests alone, in a few minutes at most: no broker, no JVM, no Delta table
# (tests/conftest.py marks every test that needs one `integration`).
test-unit: install
	$(BIN)/python -m pytest -m "not integration" $(PYTEST_ARGS)

# The linter and the type checker, in seconds ([tool.ruff] and [tool.mypy] in
# pyproject.toml say what they check): ruff over the code, the tests and the
# kernel's stub, then mypy over the same, named as their importers name them (the
# packages, tests.<folder>, the tests' support modules by their own names, the stub
# as bitroute_kernel). CI runs it before the tests (.ci/run).
LINT_PATHS := streaming compiler schemas benchmarks tests kernel/bitroute_kernel.pyi
MYPY_TARGETS := -p streaming -p compiler -p schemas -p benchmarks -m bitroute_kernel \
	$(patsubst tests/%/,-p tests.%,$(sort $(dir $(wildcard tests/*/*.py)))) \
	$(patsubst tests/%.py,-m %,$(wildcard tests/*.py))

# Then rustfmt over the kernel's three crates (one workspace: kernel/, core/, jni/).
# rustup's default profile has it; Debian's cargo-web and cargo do not (rustfmt-web
# and rustfmt are packages of their own), so lint installs it where it is missing.
lint: install
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/mypy $(MYPY_TARGETS)
	@cargo fmt --version >/dev/null 2>&1 || { \
	  echo "installing rustfmt (cargo fmt), the kernel's formatter"; \
	  if command -v rustup >/dev/null; then rustup component add rustfmt; \
	  elif dpkg -s cargo-web >/dev/null 2>&1; then apt-get update -qq && apt-get install -y -qq rustfmt-web >/dev/null; \
	  else apt-get update -qq && apt-get install -y -qq rustfmt >/dev/null; fi; }
	cargo fmt --all --check --manifest-path kernel/Cargo.toml

clean:
	-$(BIN)/bitroute broker stop
	rm -rf .bitroute
