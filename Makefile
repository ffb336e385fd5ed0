# berth: build, test, lint, benchmarks and generated files.
# GNU make. `make deps` prepares a fresh Debian machine and is a quick no-op on a prepared one.

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help
MAKEFLAGS += --no-print-directory
.DELETE_ON_ERROR:

# The machine's cargo, else the one `make deps` installs with rustup.
CARGO ?= $(shell command -v cargo 2>/dev/null || echo $(HOME)/.cargo/bin/cargo)
PYTHON ?= python3
TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)

VENV := .venv
VENV_BIN := $(abspath $(VENV))/bin
REQUIREMENTS := scripts/requirements.txt
VENV_STAMP := $(VENV)/.stamp

CRDS_FILE := crds/berth.dev.yaml
# The chart ships the same CRDs (tests/chart.rs fails when they differ from `berth crds`).
CHART_CRDS_FILE := charts/berth/crds/berth.dev.yaml
K8S_VERSION := 1.34.0
# How the generated CRDs are checked against the Kubernetes schemas.
TEST_CRDS_CMD ?= $(VENV_BIN)/kubernetes-validate --strict --quiet -k $(K8S_VERSION) $(CRDS_FILE)

# The book (docs/, mdBook) and its one generated page.
MDBOOK_VERSION := 0.5.4
MDBOOK ?= $(shell command -v mdbook 2>/dev/null || echo $(HOME)/.cargo/bin/mdbook)
BOOK_DIR := $(TARGET_DIR)/book

# promtool, for the alert rules' unit tests.
PROMTOOL := $(VENV_BIN)/promtool
MONITORING_DIR := $(TARGET_DIR)/monitoring

# Network namespaces made by tests and the lab all carry this prefix.
NETNS_PREFIX := berth-

# Every bench-<name> target below; `make bench` runs them all and summarises their result lines.
BENCHES := ipam endpoints datapath lab-api controller aws lab failover bgp l2
BENCH_LOG_DIR := $(TARGET_DIR)/bench-logs
TEST_LOG := $(TARGET_DIR)/cargo-test.log

# Tests start tools installed in the venv (moto_server, kubernetes-validate).
export PATH := $(VENV_BIN):$(PATH)
export PIP_DISABLE_PIP_VERSION_CHECK := 1
export PIP_NO_INPUT := 1

.PHONY: help deps deps-system deps-python deps-docs check-cargo build run e2e test test-rust test-crds test-chart \
	test-docs test-monitoring test-workflows test-image-context deps-monitoring book config-reference image e2e-kind lint crds \
	bench $(addprefix bench-,$(BENCHES)) clean-netns

# `make run ARGS=--once` proves and exits; `ARGS='--nodes 5'` changes the lab.
ARGS ?=
BERTH_BIN := $(TARGET_DIR)/debug/berth

help:
	@echo "make run          the whole system in a lab on this host, examples/ applied and proven from a client;"
	@echo "                  stays up until Ctrl-C, then removes everything (ARGS=--once: prove and exit)"
	@echo "make test         deps, cargo test for the workspace, test-crds, test-chart, test-docs,"
	@echo "                  test-monitoring, test-workflows, e2e, test-image-context"
	@echo "make e2e          user journeys with kubectl against a lab (e2e/local)"
	@echo "make deps         install system packages and the Python venv (.venv) the tests need"
	@echo "make build        cargo build, whole workspace, all targets (debug)"
	@echo "make test-crds    validate $(CRDS_FILE) against the Kubernetes $(K8S_VERSION) schemas"
	@echo "make test-chart   render, lint and validate the Helm chart for every value set (charts/berth/ci)"
	@echo "make test-docs    the configuration reference against --help, the book built, every link checked"
	@echo "make test-workflows  .github/workflows against GitHub's workflow schema"
	@echo "make test-monitoring  promtool's unit tests of the chart's alerts; the dashboard and alerts against"
	@echo "                  the metrics berth's binaries export (root: they run in a namespace of their own)"
	@echo "make test-image-context  build berth from exactly what the Dockerfile copies"
	@echo "make book         build the book (docs/) into $(BOOK_DIR)"
	@echo "make config-reference  regenerate docs/configuration.md from berth's --help"
	@echo "make image        build the image without a container registry (mmdebstrap, podman; root) and run it"
	@echo "make e2e-kind     berth on a kind cluster (needs docker, kind, kubectl, helm; not part of test)"
	@echo "make lint         rustfmt check and clippy with warnings denied"
	@echo "make crds         regenerate $(CRDS_FILE) from the Rust types"
	@echo "make bench        run every benchmark ($(BENCHES)) and print a summary"
	@echo "make clean-netns  delete leftover network namespaces named $(NETNS_PREFIX)*"

## Setup

deps: check-cargo deps-system deps-python deps-docs deps-monitoring

check-cargo:
	@CARGO=$(CARGO) scripts/deps-rust.sh

deps-system:
	@PYTHON=$(PYTHON) scripts/deps-apt.sh

deps-python: $(VENV_STAMP)

deps-monitoring: $(PROMTOOL)

# promtool alone, unpacked from Debian's prometheus package: installing the package would also
# start a Prometheus server on this machine.
$(PROMTOOL): | $(VENV_STAMP)
	@echo "deps: unpacking promtool from Debian's prometheus package into $(VENV_BIN)"
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && cd "$$tmp" && \
		{ apt-get download -qq prometheus 2>/dev/null || { apt-get update -qq && apt-get download -qq prometheus; }; } && \
		dpkg-deb --fsys-tarfile prometheus_*.deb | tar -x ./usr/bin/promtool && \
		install -m 0755 usr/bin/promtool $@
	@$@ --version | head -1

# mdBook from crates.io (Debian 12 has no package), without its server and watcher.
deps-docs: check-cargo
	@if [[ "$$($(MDBOOK) --version 2>/dev/null)" != "mdbook v$(MDBOOK_VERSION)" ]]; then \
		echo "deps: installing mdbook $(MDBOOK_VERSION) with cargo install"; \
		$(CARGO) install --quiet --locked --version $(MDBOOK_VERSION) --no-default-features mdbook; \
	fi

# The stamp is newer than the requirements once they are installed, so an unchanged venv is
# left alone; editing the requirements reinstalls.
$(VENV_STAMP): $(REQUIREMENTS)
	@if [[ ! -x $(VENV_BIN)/python ]]; then \
		echo "deps: creating $(VENV)"; \
		$(PYTHON) -m venv $(VENV); \
	fi
	@echo "deps: installing $(REQUIREMENTS) into $(VENV)"
	@$(VENV_BIN)/python -m pip install -q -r $(REQUIREMENTS)
	@touch $@

## Build and test

build: check-cargo
	$(CARGO) build --workspace --all-targets

# The lab's namespaces are berth-lab-*, its state (kubeconfig, logs, pids) in /run/berth-lab.
run: deps
	$(CARGO) build --bin berth
	$(BERTH_BIN) lab up --apply examples $(ARGS)

# berth explain's packet comparison runs once more on a lab whose agents run iptables (the first
# run: nftables). That lab is a second one with namespaces of its own, so it runs beside the
# first run; its output follows the first run's.
e2e: deps
	$(CARGO) build --bin berth
	@log=$$(mktemp /tmp/berth-e2e-iptables.XXXXXX); \
	BERTH_BACKEND=iptables BERTH_BIN=$(abspath $(BERTH_BIN)) e2e/local/run.sh 90-explain >"$$log" 2>&1 & \
	iptables_run=$$!; \
	BERTH_BIN=$(abspath $(BERTH_BIN)) e2e/local/run.sh && rc=0 || rc=$$?; \
	wait "$$iptables_run" && iptables_rc=0 || iptables_rc=$$?; \
	echo "== e2e on a lab with iptables agents: 90-explain =="; \
	cat "$$log"; rm -f "$$log"; \
	exit $$((rc || iptables_rc))

# A test that returns early because the machine lacks something (root, a tool) prints a line
# `berth-test: SKIPPED <test>: <reason>`; libtest counts it as passed, so the summary moves it to
# skipped and lists the reasons. Under CI=true (or BERTH_REQUIRE_ROOT=1) such a test fails instead.
SKIP_MARKER := berth-test: SKIPPED

test: deps
	@$(MAKE) test-rust
	@$(MAKE) test-crds
	@$(MAKE) test-chart
	@$(MAKE) test-docs
	@$(MAKE) test-monitoring
	@$(MAKE) test-workflows
	@$(MAKE) e2e
	@$(MAKE) test-image-context
	@echo "== cargo test summary =="
	@grep -E '^test result:' $(TEST_LOG)
	@{ grep -oE '$(SKIP_MARKER) .*' $(TEST_LOG) | sed 's/^$(SKIP_MARKER) /skipped: /' || true; \
		grep -oE '^test .* \.\.\. ignored, .*' $(TEST_LOG) | sed -E 's/^test (.*) \.\.\. ignored, /skipped: \1: /' || true; }
	@awk -v marker='$(SKIP_MARKER) ' 'index($$0, marker) { m++ } \
		/^test result:/ { for (i = 1; i <= NF; i++) { \
			if ($$i ~ /^passed/) p += $$(i-1); \
			if ($$i ~ /^failed/) f += $$(i-1); \
			if ($$i ~ /^ignored/) s += $$(i-1) } } \
		END { printf "cargo: %d passed, %d failed, %d skipped\n", p - m, f, s + m }' $(TEST_LOG)

test-rust: check-cargo
	@mkdir -p $(dir $(TEST_LOG))
	$(CARGO) test --workspace --no-fail-fast 2>&1 | tee $(TEST_LOG)

# The Dockerfile's build stage copies enough to build the binary (no image is built or pulled).
test-image-context: check-cargo
	@CARGO=$(CARGO) scripts/image-context.sh

test-crds: deps-python
	@test -s $(CRDS_FILE) || { echo "$(CRDS_FILE) is missing: run 'make crds'" >&2; exit 1; }
	$(TEST_CRDS_CMD)
	@echo "test-crds: $(CRDS_FILE) is valid for Kubernetes $(K8S_VERSION)"

# The chart with the real Helm engine (helm-python-sdk): lint, render every value set, validate
# each manifest against the oldest and newest supported Kubernetes, check security contexts,
# capabilities and RBAC. Its RBAC against berth's real requests is tests/chart_rbac.rs.
# The rendered flags are also handed to the binary, which must accept them.
test-chart: deps-python check-cargo
	$(CARGO) build -q --bin berth
	BERTH_BIN=$(abspath $(TARGET_DIR))/debug/berth $(VENV_BIN)/python scripts/chart.py check

# The book: docs/configuration.md is what `berth --help` says, the book builds without a warning,
# and no link is broken, in the Markdown (README, docs/, the crates' READMEs) or in the rendered book.
test-docs: deps-docs check-cargo
	$(CARGO) build -q --bin berth
	$(PYTHON) scripts/docs.py reference --bin $(BERTH_BIN) --check
	@$(MAKE) book
	$(PYTHON) scripts/docs.py links --book $(BOOK_DIR)

# The alerts: promtool's own checks and unit tests (series shaped like berth's), then the
# dashboard's and the alerts' queries against the /metrics pages of the real controller and agent.
# Without root (the binaries run in a network namespace of their own) the second part skips,
# except under CI=true or BERTH_REQUIRE_ROOT=1, where it fails.
test-monitoring: deps-python deps-monitoring check-cargo
	$(PROMTOOL) check rules charts/berth/monitoring/alerts.yaml
	$(PROMTOOL) test rules tests/monitoring/alerts_test.yaml
	@if [[ $$(id -u) -ne 0 && "$${CI:-}" != true && "$${BERTH_REQUIRE_ROOT:-}" != 1 ]]; then \
		echo "test-monitoring: SKIPPED the check against berth's /metrics: needs root"; exit 0; fi; \
	$(CARGO) build -q --bin berth && \
	$(VENV_BIN)/python scripts/monitoring.py scrape --bin $(BERTH_BIN) --out $(MONITORING_DIR) && \
	$(VENV_BIN)/python scripts/monitoring.py check --metrics $(MONITORING_DIR)/controller.txt $(MONITORING_DIR)/agent.txt

# The release workflow is never run here: it is checked against GitHub's workflow schema.
test-workflows: deps-python
	$(VENV_BIN)/check-jsonschema --builtin-schema vendor.github-workflows .github/workflows/*.yml

book: deps-docs
	@rm -rf $(BOOK_DIR) && mkdir -p $(dir $(BOOK_DIR))
	@$(MDBOOK) build docs -d $(abspath $(BOOK_DIR)) 2>&1 | tee $(BOOK_DIR).log
	@! grep -E '(WARN|ERROR)' $(BOOK_DIR).log >/dev/null || { echo "book: mdbook warned (above)" >&2; exit 1; }

config-reference: check-cargo
	$(CARGO) build -q --bin berth
	$(PYTHON) scripts/docs.py reference --bin $(BERTH_BIN)

# The image on a machine with Debian's archive and no container registry (root): a trixie root
# filesystem by mmdebstrap, the stripped release binary, podman build, then the image run
# (scripts/image.sh says what it proves). Installs mmdebstrap, podman and runc when missing.
# Opt-in: not part of `make test`.
image: check-cargo
	CARGO=$(CARGO) scripts/image.sh

# A real cluster: kind without kube-proxy, the image built from this checkout, the chart installed.
# Opt-in: it needs a container runtime, which `make test` does not assume.
e2e-kind:
	e2e/kind/run.sh

lint: check-cargo
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	# The production binary without `berth lab` (the default feature `lab`) builds and is clean.
	$(CARGO) clippy -p berth --no-default-features --bins -- -D warnings

## Generated files

crds: check-cargo
	@mkdir -p $(dir $(CRDS_FILE))
	$(CARGO) run -q -- crds > $(CRDS_FILE).tmp
	@cp $(CRDS_FILE).tmp $(CHART_CRDS_FILE)
	@mv $(CRDS_FILE).tmp $(CRDS_FILE)
	@echo "crds: wrote $(CRDS_FILE) and $(CHART_CRDS_FILE)"

## Benchmarks

bench: check-cargo
	@mkdir -p $(BENCH_LOG_DIR)
	@for name in $(BENCHES); do \
		$(MAKE) bench-$$name 2>&1 | tee $(BENCH_LOG_DIR)/$$name.log; \
	done
	@scripts/bench-summary.sh $(addprefix $(BENCH_LOG_DIR)/,$(addsuffix .log,$(BENCHES)))

bench-ipam: check-cargo
	$(CARGO) bench -p berth-ipam --bench ipam_table

bench-endpoints: check-cargo
	$(CARGO) bench -p berth-endpoints --bench endpoints_table

# Planning and sync (both dispatch modes), first-packet latency through real iptables in network
# namespaces (root), and the agent's memory; ends with the `datapath: ...` summary line.
bench-datapath: check-cargo
	@CARGO=$(CARGO) scripts/bench-datapath.sh

bench-lab-api: check-cargo
	$(CARGO) bench -p berth-apiserver --bench lab_api_table

# Cold start of `berth controller` (a release build, run as a child) against 10,000 LoadBalancer
# Services, and of the endpoints controller against 100,000 pods.
bench-controller: check-cargo
	$(CARGO) build --release --bin berth
	BERTH_BIN=$(abspath $(TARGET_DIR))/release/berth $(CARGO) bench -p berth-controller --bench controller_table

# Network-programming latency on a lab (root): a release `berth lab up` with 3 nodes, 1,000
# Services x 10 endpoints, readiness flips; ends with `programming-latency: p50_ms=<n> p99_ms=<n>`.
bench-lab: check-cargo
	$(CARGO) build --release --bin berth
	BERTH_BIN=$(abspath $(TARGET_DIR))/release/berth $(CARGO) bench --bench lab_programming

# ELBv2 calls through the real AWS SDK against moto_server: converge, steady-state resync, sweep,
# 100 nodes. Counts do not depend on optimisation, so the dev profile saves a release build of the SDK.
bench-aws: check-cargo deps-python
	$(CARGO) bench --profile dev -p berth-aws --bench aws_calls

# L2 failover with three real agents in network namespaces (root): outage after a crash, a link
# down and a graceful stop, time to a new connection and the owner's return, the crashes again
# under stress-ng with a watch for false takeovers, Lease only, and the agents' API load with
# 1,000 LoadBalancer Services. Built with the dev profile: the outage is set by detection
# timeouts, not CPU, and the test build is reused. About twenty minutes; BERTH_FAILOVER_TRIALS=N
# and BERTH_FAILOVER_WATCH_SECONDS=S (600) shorten it.
bench-failover: check-cargo
	$(CARGO) bench --profile dev -p berth --bench failover

# BGP: SIGKILL and link-cut withdrawal at a real FRR router, p50/p99 over BERTH_BGP_TRIALS (20);
# then 1,000 Services to routes through the real agents and their API requests/s at steady
# state. One `bgp:` line with both parts' fields.
bench-bgp: check-cargo
	$(CARGO) bench --profile dev -p berth-bgp --bench bgp_failover > target/bench-bgp-failover.txt
	BERTH_BGP_FAILOVER="$$(grep '^bgp:' target/bench-bgp-failover.txt)" \
		$(CARGO) bench --profile dev -p berth --bench bgp_services

# The announcer's election at 10,000 Services and 100 nodes: the incremental table against the
# election from scratch, in the same run (pure, no root).
bench-l2: check-cargo
	$(CARGO) bench -p berth-l2 --bench election_table

## Recovery

# Only namespaces with the berth prefix: anything else on the machine is not ours to remove.
clean-netns:
	@command -v ip >/dev/null 2>&1 || { echo "clean-netns: 'ip' not found (make deps installs iproute2)" >&2; exit 1; }
	@for ns in $$(ip netns list | awk '{ print $$1 }' | grep -E '^$(NETNS_PREFIX)' || true); do \
		echo "clean-netns: deleting $$ns"; \
		ip netns delete "$$ns"; \
	done
