# ferroplasma — `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help
CARGO ?= $(shell command -v cargo 2>/dev/null || echo $(HOME)/.cargo/bin/cargo)
VENV := .venv
PYTHON ?= python3
# Arguments for `make run`, e.g. make run ARGS="--memory 2GiB --prefault"
ARGS ?=

.PHONY: help build run test lint fmt bench clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-8s %s\n", $$1, $$2}'

$(VENV)/bin/activate:
	$(PYTHON) -m venv $(VENV)

build: $(VENV)/bin/activate ## Build (release) and install the `ferroplasma` command into .venv/bin
	$(CARGO) build --release --bin ferroplasma
	install -m 0755 target/release/ferroplasma $(VENV)/bin/ferroplasma
	@echo "built: $(VENV)/bin/ferroplasma"

run: build ## Build and start a store with the defaults (Ctrl-C stops it); ARGS="..." adds flags
	$(VENV)/bin/ferroplasma store $(ARGS)

test: ## Run every test (unit, property, integration against real stores)
	$(CARGO) test --workspace

lint: ## cargo fmt --check and clippy with warnings as errors
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt: ## Format the code
	$(CARGO) fmt --all

bench: ## Per-operation latency next to a Unix-socket round trip, as ratios
	$(CARGO) build --release --bin ferroplasma --bin ferroplasma-bench
	target/release/ferroplasma-bench --json target/bench-latency.json

clean: ## Remove build outputs and .venv
	$(CARGO) clean
	rm -rf $(VENV)
