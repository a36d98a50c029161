# ferroplasma — `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help
CARGO ?= $(shell command -v cargo 2>/dev/null || echo $(HOME)/.cargo/bin/cargo)
VENV := .venv
# Plasma's C++ client and store from the pyarrow 11 wheel (see below);
# defined here because test-python, above its rule, needs it.
PLASMA_CPP := target/plasma-cpp/.extracted
PYTHON ?= python3
# Arguments for `make run`, e.g. make run ARGS="--memory 2GiB --prefault"
ARGS ?=

PREFIX ?= /usr/local

.PHONY: help test-sysdeps build c-lib install-c header test-go java-sysdeps java test-java wheel run test test-rust test-python test-plasma lint fmt bench bench-spill bench-python bench-compare bench-calls bench-scale bench-cluster bench-scan bench-jobs test-ucx stress scale chaos clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' \
	  '{ name[NR] = $$1; text[NR] = $$2; if (length($$1) > w) w = length($$1) } \
	   END { for (i = 1; i <= NR; i++) printf "  make %-*s  %s\n", w, name[i], text[i] }'

# Python tools and test dependencies, from PyPI, into .venv (once).
$(VENV)/.deps: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q "maturin>=1.5,<2" ruff mypy pytest pytest-timeout numpy pandas pyarrow matplotlib duckdb tqdm "dask[distributed,dataframe]"
	touch $@

build: $(VENV)/.deps c-lib ## Build (release) the Python package into .venv, with the `ferroplasma` command, and the C library
	@echo "build: compiling the Python package in release mode (about 7 minutes the first time on 2 cores; seconds after)"
	PIP_QUIET=1 VIRTUAL_ENV=$(CURDIR)/$(VENV) $(VENV)/bin/maturin develop --release
	@echo "built: $(VENV)/bin/ferroplasma and 'import ferroplasma' in $(VENV); the C library in target/c"

# The C library (docs/languages.md): libferroplasma.so and .a, ferroplasma.h
# and ferroplasma.hpp, and a pkg-config file, laid out as under a prefix.
# With them, Plasma's C++ client headers on ferroplasma
# (include/ferroplasma-plasma/plasma/*.h) and ferroplasma-plasma.pc, whose
# flags add Arrow C++ from the .venv's pyarrow (headers and libarrow).
C_OUT := target/c
PYARROW_INCLUDE = $(shell $(VENV)/bin/python -c "import pyarrow as pa; print(pa.get_include())")
PYARROW_LIBARROW = $(shell $(VENV)/bin/python -c "import glob, pyarrow as pa; print(sorted(glob.glob(pa.get_library_dirs()[0] + '/libarrow.so.*'))[0])")
define plasma_pc
printf '%s\n' 'prefix=$(1)' 'libdir=$${prefix}/lib' 'includedir=$${prefix}/include' '' \
  'Name: ferroplasma-plasma' \
  'Description: Plasma'"'"'s C++ client (#include <plasma/client.h>) on ferroplasma and Arrow C++' \
  'Version: 0.1.0' \
  'Cflags: -I$${includedir}/ferroplasma-plasma -I$${includedir} -I$(PYARROW_INCLUDE)' \
  'Libs: -L$${libdir} -lferroplasma -Wl,-rpath,$${libdir} $(PYARROW_LIBARROW) -Wl,-rpath,$(dir $(PYARROW_LIBARROW))'
endef
c-lib: ## Build the C library, its headers and ferroplasma.pc into target/c (PKG_CONFIG_PATH=target/c/lib/pkgconfig)
	$(CARGO) build --release -p ferroplasma-capi
	mkdir -p $(C_OUT)/lib/pkgconfig $(C_OUT)/include
	cp target/release/libferroplasma.so target/release/libferroplasma.a $(C_OUT)/lib/
	cp crates/capi/include/ferroplasma.h crates/capi/include/ferroplasma.hpp crates/capi/include/ferroplasma_arrow.hpp $(C_OUT)/include/
	mkdir -p $(C_OUT)/include/ferroplasma-plasma/plasma
	cp crates/capi/include/plasma/*.h $(C_OUT)/include/ferroplasma-plasma/plasma/
	sed -e 's|@PREFIX@|$(CURDIR)/$(C_OUT)|' -e 's|@VERSION@|0.1.0|' crates/capi/ferroplasma.pc.in > $(C_OUT)/lib/pkgconfig/ferroplasma.pc
	$(call plasma_pc,$(CURDIR)/$(C_OUT)) > $(C_OUT)/lib/pkgconfig/ferroplasma-plasma.pc

install-c: c-lib ## Install the C library, headers and pkg-config file under PREFIX (default /usr/local)
	install -d $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/include
	install -m 755 $(C_OUT)/lib/libferroplasma.so $(DESTDIR)$(PREFIX)/lib/
	install -m 644 $(C_OUT)/lib/libferroplasma.a $(DESTDIR)$(PREFIX)/lib/
	install -m 644 $(C_OUT)/include/ferroplasma.h $(C_OUT)/include/ferroplasma.hpp $(C_OUT)/include/ferroplasma_arrow.hpp $(DESTDIR)$(PREFIX)/include/
	install -d $(DESTDIR)$(PREFIX)/include/ferroplasma-plasma/plasma
	install -m 644 $(C_OUT)/include/ferroplasma-plasma/plasma/*.h $(DESTDIR)$(PREFIX)/include/ferroplasma-plasma/plasma/
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|0.1.0|' crates/capi/ferroplasma.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/ferroplasma.pc
	$(call plasma_pc,$(PREFIX)) > $(DESTDIR)$(PREFIX)/lib/pkgconfig/ferroplasma-plasma.pc

header: ## Regenerate crates/capi/include/ferroplasma.h from the code (cbindgen)
	FP_WRITE_HEADER=1 $(CARGO) test -q -p ferroplasma-capi --test header

# A wheel for machines without Rust (manylinux, for the .venv's Python).
wheel: $(VENV)/.deps ## Build a manylinux wheel into target/wheels/ (pip install it anywhere, no Rust needed)
	rm -f target/wheels/ferroplasma-*.whl
	$(VENV)/bin/maturin build --release -q -i $(VENV)/bin/python -o target/wheels
	@ls target/wheels/ferroplasma-*.whl

run: build ## Build and start a store with the defaults (Ctrl-C stops it); ARGS="..." adds flags
	$(VENV)/bin/ferroplasma store $(ARGS)

test: test-rust test-python test-plasma test-go test-java ## Run every test (Rust, Python, Plasma's own suite, Go and Java, against real stores)

# Tests that need root (network namespaces, other users) are marked ignored,
# so that elsewhere they are reported as skipped; as root they run here.
test-rust: ## Rust unit, property and integration tests (root-only ones when root), and the loom models of the shared table and of writes without a round trip
	$(CARGO) build -p ferroplasma-capi
	$(CARGO) test --workspace
	RUSTFLAGS="--cfg ferroplasma_loom" CARGO_TARGET_DIR=target/loom $(CARGO) test --release -p ferroplasma-protocol --test table_model --test fast_writes_model
	@if [ "$$(id -u)" = 0 ]; then \
	  echo "test-rust: as root, the root_ tests run too: they create network namespaces (removed after) and run clients as uid 65534"; \
	  $(CARGO) test --workspace -- --ignored root_; \
	else echo "test-rust: root-only tests skipped (not root)"; fi

test-python: build wheel test-sysdeps $(PLASMA_CPP) java ## Python tests (pytest) against real stores
	$(VENV)/bin/python -m pytest -q --durations=10 python/tests

# Debian packages only tests use: Prometheus (it scrapes a store in
# test_metrics.py; skipped without it) and GoogleTest (the C++ Plasma suite,
# test_plasma_cpp.py, which fails without it). Installed when root.
test-sysdeps:
	@missing=""; command -v prometheus >/dev/null || missing="$$missing prometheus"; \
	  [ -f /usr/src/googletest/googletest/src/gtest-all.cc ] || missing="$$missing libgtest-dev"; \
	  if [ -n "$$missing" ]; then \
	    if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	      echo "test-sysdeps: as root, installing Debian's$$missing (test_metrics.py scrapes a store with prometheus; test_plasma_cpp.py builds on GoogleTest)"; \
	      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	    else echo "test-sysdeps: not root, not installed:$$missing (apt-get install them)"; fi; fi

# Plasma's C++ client and store, from the same wheel: the C++ suite
# (crates/capi/tests/cpp/plasma_client_test.cc) is built against them too and
# must pass on Plasma as on ferroplasma (python/tests/test_plasma_cpp.py).
$(PLASMA_CPP): | $(VENV)/.deps
	mkdir -p $(dir $@)
	$(VENV)/bin/pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
	  --platform manylinux2014_x86_64 -d $(dir $@) pyarrow==11.0.0
	$(VENV)/bin/python -c "import glob, os, zipfile; \
	  z = zipfile.ZipFile(glob.glob('$(dir $@)pyarrow-11.0.0-*.whl')[0]); \
	  keep = ('pyarrow/include/', 'pyarrow/libarrow.so.1100', 'pyarrow/libplasma.so.1100', 'pyarrow/plasma-store-server'); \
	  [z.extract(n, '$(dir $@)') for n in z.namelist() if n.startswith(keep)]; \
	  os.chmod('$(dir $@)pyarrow/plasma-store-server', 0o755)"
	rm -f $(dir $@)pyarrow-11.0.0-*.whl
	touch $@

# Plasma's own tests, from the last pyarrow that shipped Plasma (fetched from
# PyPI, never committed), run against ferroplasma.plasma.
PLASMA_SUITE := target/plasma-suite/test_plasma.py
$(PLASMA_SUITE): | $(VENV)/.deps
	mkdir -p $(dir $@)
	$(VENV)/bin/pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
	  --platform manylinux2014_x86_64 -d $(dir $@) pyarrow==11.0.0
	$(VENV)/bin/python -c "import glob, zipfile; \
	  z = zipfile.ZipFile(glob.glob('$(dir $@)pyarrow-11.0.0-*.whl')[0]); \
	  open('$@', 'wb').write(z.read('pyarrow/tests/test_plasma.py'))"
	rm -f $(dir $@)pyarrow-11.0.0-*.whl

test-plasma: build $(PLASMA_SUITE) ## Plasma's own test suite (pyarrow 11.0.0's test_plasma.py) against ferroplasma.plasma
	cd $(dir $(PLASMA_SUITE)) && PYTHONPATH=$(CURDIR)/python/tests/plasma_suite \
	  $(CURDIR)/$(VENV)/bin/python -m pytest -q -rs -p plasma_suite_plugin test_plasma.py

# The Go client (go/ferroplasma, cgo over the C library): needs Go >= 1.25.
GO ?= $(shell command -v go 2>/dev/null || echo /usr/local/go/bin/go)
GO_ENV := PKG_CONFIG_PATH=$(CURDIR)/$(C_OUT)/lib/pkgconfig CGO_LDFLAGS=-Wl,-rpath,$(CURDIR)/$(C_OUT)/lib
test-go: build ## Go client tests against a real store (go vet, go test)
	cd go/ferroplasma && $(GO_ENV) $(GO) vet ./... && \
	  $(GO_ENV) FERROPLASMA_BIN=$(CURDIR)/$(VENV)/bin/ferroplasma $(GO) test ./...

# The Java client (java/: Plasma's Java API and Arrow Java tables in place, JNI
# over the C library, built with Maven): needs a JDK >= 11 and Maven, installed
# from Debian's packages when root. The JNI library links the C library in
# statically and travels inside the jar; target/java/lib has it under its own
# name and Plasma's (libplasma_java.so), for code that loads it itself.
JAVA_HOME ?= $(shell j=$$(command -v javac) && dirname $$(dirname $$(readlink -f $$j)))
MVN ?= mvn
MVN_FLAGS := -q -B -Dstyle.color=never
JNI_LIB := target/java/native/io/ferroplasma/plasma/native/linux-x86_64/libferroplasma_jni.so
java-sysdeps:
	@if ! command -v javac >/dev/null || ! command -v $(MVN) >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "java-sysdeps: as root, installing Debian's default-jdk-headless and maven (the Java client)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends default-jdk-headless maven >/dev/null; \
	  else echo "java-sysdeps: the Java client needs a JDK (11 or newer) and Maven: apt-get install default-jdk-headless maven"; exit 1; fi; fi
java: c-lib java-sysdeps ## Build the Java client: the JNI library and the jar (target/java/maven/ferroplasma-0.1.0.jar)
	mkdir -p $(dir $(JNI_LIB)) target/java/lib
	cc -shared -fPIC -O2 -Wall -Wextra -Werror -I$(JAVA_HOME)/include -I$(JAVA_HOME)/include/linux -I$(C_OUT)/include \
	  java/src/main/c/ferroplasma_jni.c $(C_OUT)/lib/libferroplasma.a -lpthread -ldl -lm \
	  -Wl,--gc-sections -Wl,--exclude-libs,ALL -s -o $(JNI_LIB)
	cp $(JNI_LIB) target/java/lib/libferroplasma_jni.so
	cp $(JNI_LIB) target/java/lib/libplasma_java.so
	cd java && $(MVN) $(MVN_FLAGS) package -DskipTests
	cd java && $(MVN) $(MVN_FLAGS) dependency:build-classpath -Dmdep.includeScope=test -Dmdep.outputFile=$(CURDIR)/target/java/classpath.txt
test-java: build java ## Java client tests (JUnit, against real stores)
	cd java && FERROPLASMA_BIN=$(CURDIR)/$(VENV)/bin/ferroplasma $(MVN) $(MVN_FLAGS) test

lint: $(VENV)/.deps ## cargo fmt --check, clippy -D warnings, no import circles, ruff, _native.pyi against the built module (stubtest)
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) test -q -p ferroplasma-capi --test header
	@test -z "$$(cd go/ferroplasma && $(dir $(GO))gofmt -l .)" || { echo "go/ferroplasma is not gofmt-clean: gofmt -w go/ferroplasma"; exit 1; }
	$(VENV)/bin/ruff check python bench
	$(VENV)/bin/ruff format --check python bench
	$(VENV)/bin/python bench/check_import_circles.py crates
	$(MAKE) build
	$(VENV)/bin/python -m mypy.stubtest ferroplasma._native

fmt: $(VENV)/.deps ## Format the code
	$(CARGO) fmt --all
	$(VENV)/bin/ruff format python bench

# The cluster's fault-injection test, long: SEED and MINUTES pick the run
# (the same seed replays the same faults and operations). As root, members
# run in network namespaces and the nemesis also cuts links.
SEED ?= 1
MINUTES ?= 10
chaos: ## Fault injection on a 3-member cluster (kills, pauses, link cuts) with an invariant checker: make chaos SEED=7 MINUTES=10
	FP_CHAOS_SEED=$(SEED) FP_CHAOS_FAULTS=2 FP_CHAOS_SECONDS=$$(( $(MINUTES) * 60 )) $(CARGO) test --release -p ferroplasma-daemon --test nemesis -- --nocapture

# A member joining one that holds 10^6 objects, beside two CPU hogs (issue
# 38); make test runs it at 200,000.
scale: ## Cluster join beside 10^6 objects with two CPU hogs: join time, RSS per directory entry, no member declared dead
	FP_SCALE_OBJECTS=1000000 $(CARGO) test --release -p ferroplasma-daemon --test cluster_scale -- --nocapture

# The reliability tests at 20x their CI size; they print their counts.
stress: ## Fuzz, kill, stress and hostile-input tests, 20x longer than in make test
	FP_STRESS_SCALE=20 FP_FUZZ_CASES=500000 $(CARGO) test --release -p ferroplasma-protocol --test fuzz_decoder -- --nocapture
	FP_FUZZ_CASES=500000 $(CARGO) test --release -p ferroplasma-daemon --lib connection::fuzz -- --nocapture
	FP_STRESS_SCALE=20 $(CARGO) test --release -p ferroplasma-daemon --test chaos --test robustness --test reliability -- --nocapture --test-threads=1

bench: ## Per-operation latency next to a Unix-socket round trip, as ratios; with and without a scraped metrics endpoint; the state machine's cost per object
	$(CARGO) build --release --bin ferroplasma --bin ferroplasma-bench --bin ferroplasma-bench-metrics --bin ferroplasma-bench-state
	target/release/ferroplasma-bench --json target/bench-latency.json
	target/release/ferroplasma-bench-metrics
	target/release/ferroplasma-bench-state

# QUICK=1: 10^3 to 10^5 objects (minutes), results in bench/results/.
bench-scale: build ## get, contains, batched get, put and the store's RSS against the object count (10^3..10^7, 64 B) for ferroplasma, Plasma, Ray, shared_memory, interleaved; QUICK=1
	$(CARGO) build --release -p ferroplasma-bench --bin ferroplasma-bench-floor
	cd bench && ../$(VENV)/bin/python -m scale.run --setup $(if $(QUICK),--quick)

bench-cluster: build ## Local vs remote gets, the microbenchmarks of the ThymesisFlow Plasma paper (Abrahamse et al., 2022), across two network namespaces next to raw TCP (root); plot into docs/img
	$(CARGO) build --release --bin ferroplasma --bin ferroplasma-bench-cluster
	target/release/ferroplasma-bench-cluster --json bench/results/cluster.json $(if $(QUICK),--reps 2 --max-total-mb 100,)
	$(VENV)/bin/python bench/cluster_report.py bench/results/cluster.json --out docs

# The UCX binding (ucxx, ~350 MB with its CUDA-built libraries; runs without
# a GPU): for the scan's UCX transport, its tests and its bench figures.
$(VENV)/.ucx: $(VENV)/.deps
	$(VENV)/bin/pip install -q ucxx-cu12
	touch $@

test-ucx: build $(VENV)/.ucx ## The scan tests over the UCX transport too (installs the ucxx binding into .venv)
	$(VENV)/bin/python -m pytest -q -rs python/tests/test_scan.py -k ucx

bench-scan: build $(VENV)/.ucx ## TPC-H column selectivity as in the Thallus paper (Chakraborty et al., 2024): scan vs serializing RPC vs Arrow Flight vs raw TCP (root); QUICK=1
	$(VENV)/bin/python bench/scan_bench.py run --json bench/results/scan.json $(if $(QUICK),--reps 2,)
	cd bench && ../$(VENV)/bin/python scan_report.py results/scan.json --out ../docs

bench/.spark-venv/.ok:
	$(PYTHON) -m venv bench/.spark-venv
	bench/.spark-venv/bin/pip install -q pyspark
	touch $@

bench-jobs: build bench/.spark-venv/.ok ## DataFrame sample sort (Plasma blog post, 2017) vs pandas (100M rows), record sort (Stolpmann's map/reduce post, 2012) vs GNU sort and Spark (10 GiB); on Dask across 3 hosts vs Dask alone; QUICK=1
	$(VENV)/bin/python bench/jobs_bench.py dataframe --json bench/results/jobs-df.json $(if $(QUICK),--rows 20000000 --reps 2,--single-worker)
	$(VENV)/bin/python bench/jobs_bench.py records --json bench/results/jobs-rec.json $(if $(QUICK),--size 1GiB --reps 2,)
	cd bench && ../$(VENV)/bin/python jobs_report.py results/jobs-df.json results/jobs-rec.json --out ../docs
	$(VENV)/bin/python bench/jobs_dask_bench.py --json bench/results/jobs-dask.json --out docs $(if $(QUICK),--size 256MiB --rows 5000000 --reps 2,)

bench-calls: build java $(PLASMA_CPP) ## Per-call cost of the C, C++, Go, Java, Python and Rust clients next to Plasma 11's C++ client (get, contains, create+seal, batched get); QUICK=1
	$(CARGO) build --release -p ferroplasma-bench --bin ferroplasma-bench-calls
	$(VENV)/bin/python bench/calls.py $(if $(QUICK),--rounds 1)

bench-spill: build ## p50/p99/max of a 1 KiB get while the store spills 256 MiB batches, next to an idle store
	@mkdir -p bench/results
	$(VENV)/bin/python bench/spill_latency.py --json bench/results/spill.json

bench-python: build ## Python serialization (the Ray serialization post's objects, Moritz and Nishihara, 2017) and numpy put/get vs pickle and memcpy; plots into docs/img
	$(VENV)/bin/python bench/python_serialization.py --out docs

# QUICK=1: one measured round, fewer samples, results in bench/results/ (minutes).
bench-compare: build ## ferroplasma vs Plasma, Ray, Vineyard, shared_memory, pickle (QUICK=1 for a short run)
	cd bench && ../$(VENV)/bin/python -m compare.run --setup $(if $(QUICK),--quick)

clean: ## Remove build outputs and .venv
	$(CARGO) clean
	rm -rf $(VENV)
