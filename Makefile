# ec2-topology-labeler: one profile (dev, tuned in Cargo.toml) serves tests, e2e and the demo.
# Caches live outside the checkout so CI runs on a fresh clone reuse them.
EC2TL_CACHE ?= $(HOME)/.cache/ec2-topology-labeler
export EC2TL_CACHE
export CARGO_TARGET_DIR ?= $(EC2TL_CACHE)/target
BIN := $(CARGO_TARGET_DIR)/debug
CHART := charts/ec2-topology-labeler
NAMESPACE := ec2-topology-labeler

.PHONY: all build controlplane schedulers tools demo test e2e bench lint fmt schema kind manifests check-manifests ci clean-cache

all: build

## build: compile every crate and test once (the one profile CI uses)
build:
	cargo build --workspace --all-targets --locked

## controlplane: build the pinned kube-apiserver + etcd from the Go module proxy (cached)
controlplane:
	@e2e/controlplane/build.sh >/dev/null

## schedulers: build the pinned Kueue manager and the Kueue/Volcano CRDs (cached)
schedulers:
	@e2e/schedulers/build.sh >/dev/null

## tools: build the pinned Helm from the Go module proxy (cached)
tools:
	@e2e/tools/build.sh >/dev/null

## demo: control plane + mock EC2 + the controller, a sample fleet labelled and printed
demo: build controlplane
	$(BIN)/e2e-cluster demo

## test: unit + integration tests, then e2e against a real kube-apiserver (README command 2)
test: build controlplane schedulers check-manifests
	cargo test --workspace --locked

## e2e: only the end-to-end suite
e2e: build controlplane schedulers
	cargo test -p e2e --locked --test e2e

SHELL_SCRIPTS := .ci/run e2e/controlplane/build.sh e2e/tools/build.sh e2e/kind/run.sh e2e/schedulers/build.sh e2e/bench/tools.sh e2e/bench/chart.sh

## lint: formatting, clippy (warnings are errors), helm lint, shellcheck (when installed)
lint: tools
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets --locked -- -D warnings
	$$(e2e/tools/build.sh)/helm lint --strict $(CHART)
	@if command -v shellcheck >/dev/null; then shellcheck $(SHELL_SCRIPTS); else echo "shellcheck not installed (apt-get install shellcheck): skipped"; fi

## schema: regenerate the chart's values.schema.json from the binary's flags
schema:
	UPDATE_CHART_SCHEMA=1 cargo test --lib --locked chart

## kind: the e2e suite on a kind cluster (needs Docker and kind; not run in CI)
kind:
	e2e/kind/run.sh

fmt:
	cargo fmt --all

## manifests: render the chart into deploy/ (plain manifests for kubectl apply -f deploy/)
manifests: tools
	$$(e2e/tools/build.sh)/helm template $(NAMESPACE) $(CHART) --namespace $(NAMESPACE) > deploy/ec2-topology-labeler.yaml

## check-manifests: fail when deploy/ differs from what the chart renders
check-manifests: tools
	@$$(e2e/tools/build.sh)/helm template $(NAMESPACE) $(CHART) --namespace $(NAMESPACE) | diff -u deploy/ec2-topology-labeler.yaml - \
	  || { echo "deploy/ is stale: run make manifests"; exit 1; }

## ci: what .ci/run does
ci: lint test

clean-cache:
	rm -rf $(EC2TL_CACHE)

## bench: labelling performance vs the article's script; regenerates docs/benchmarks.{md,png,csv}
bench: build controlplane
	e2e/bench/tools.sh >/dev/null
	$(BIN)/bench --out docs
