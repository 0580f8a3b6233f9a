SHELL := /bin/bash
# ec2-topology-labeler: one profile (dev, tuned in Cargo.toml) serves tests, e2e and the demo.
# Caches live outside the checkout so CI runs on a fresh clone reuse them.
EC2TL_CACHE ?= $(HOME)/.cache/ec2-topology-labeler
export EC2TL_CACHE
export CARGO_TARGET_DIR ?= $(EC2TL_CACHE)/target
BIN := $(CARGO_TARGET_DIR)/debug
CHART := charts/ec2-topology-labeler
# rust-toolchain.toml's version by name, before any cargo call (hack/toolchain.sh: links this
# machine's stable toolchain when it is that version and rustup cannot download it).
TOOLCHAIN_LINKED := $(shell hack/toolchain.sh)
NAMESPACE := ec2-topology-labeler

.PHONY: release kind-down image all build build-release bench-scale controlplane controlplane-oldest schedulers slurm pictures tools demo test test-faults test-faults-build fuzz e2e bench lint deny fmt schema chart-docs docs kind kind-eks-credentials kind-prepare manifests check-manifests ci clean-cache

all: build

## build: compile every crate and test once (the one profile CI uses)
build:
	cargo build --workspace --all-targets --locked

## controlplane: build the pinned kube-apiserver + etcd from the Go module proxy (cached)
controlplane:
	@e2e/controlplane/build.sh >/dev/null

## controlplane-oldest: the same at the oldest Kubernetes minor the chart accepts (the e2e
## suite runs at both: docs/compatibility.md)
controlplane-oldest:
	@e2e/controlplane/build.sh --oldest >/dev/null

## schedulers: build the pinned Kueue manager, Volcano's scheduler and controller-manager, and
## KAI's scheduler, binder and pod grouper (KAI at a pinned commit: e2e/schedulers/kai/source.sh),
## with their CRDs (cached)
schedulers:
	@e2e/schedulers/build.sh >/dev/null
	@e2e/schedulers/volcano/build.sh >/dev/null
	@e2e/schedulers/kai/build.sh >/dev/null
	@e2e/schedulers/karpenter/crds.sh >/dev/null

## slurm: the real slurmctld our Slurm files are judged by: Debian's 22.05 (apt) and Debian
## sid's (25.05+, topology.yaml) in a root of its own (debootstrap, cached); needs root
slurm:
	@e2e/slurm/install.sh

## pictures: what judges `tree -o dot|mermaid`: Graphviz (apt) and the real Mermaid parser (npm, cached)
pictures:
	@e2e/tools/graphviz.sh
	@e2e/tools/mermaid.sh >/dev/null

# cargo-deny, pinned, from crates.io (--locked: its own Cargo.lock), cached by version; its own
# build directory (not CARGO_TARGET_DIR: nothing of it is shared with the project's builds).
# (Defined before `deny`, whose prerequisite it is.)
CARGO_DENY_VERSION := 0.20.2
CARGO_DENY_ROOT := $(EC2TL_CACHE)/cargo-deny-$(CARGO_DENY_VERSION)
CARGO_DENY := $(CARGO_DENY_ROOT)/bin/cargo-deny

## tools: build the pinned Helm and promtool from the Go module proxy (cached); cargo-deny, which
## only lint needs, is installed by `make deny`
tools:
	@e2e/tools/build.sh >/dev/null
	@e2e/tools/promtool/build.sh >/dev/null

$(CARGO_DENY):
	@echo "installing cargo-deny $(CARGO_DENY_VERSION) (crates.io; cold: ~3 min)" >&2
	@rm -rf $(CARGO_DENY_ROOT).partial
	env -u CARGO_TARGET_DIR cargo install --quiet --locked cargo-deny --version $(CARGO_DENY_VERSION) --root $(CARGO_DENY_ROOT).partial
	@rm -rf $(CARGO_DENY_ROOT) && mv $(CARGO_DENY_ROOT).partial $(CARGO_DENY_ROOT)

## deny: cargo-deny (deny.toml): licenses (an allow-list), bans (duplicate versions warned,
## wildcard requirements refused, no OpenSSL/aws-lc), sources (crates.io only), for the workspace
## and for fuzz/ (its own workspace). DENY_ADVISORIES=1 adds the RustSec advisories (it clones
## github.com/rustsec/advisory-db, so only where that is reachable; CI here cannot).
## `cargo deny check` (no --hide-inclusion-graph) shows how a duplicate is pulled in.
DENY_CHECKS = licenses bans sources $(if $(filter 1,$(DENY_ADVISORIES)),advisories)
deny: $(CARGO_DENY)
	$(CARGO_DENY) --locked check --hide-inclusion-graph -A license-exception-not-encountered $(DENY_CHECKS)
	$(CARGO_DENY) --locked --manifest-path fuzz/Cargo.toml --config deny.toml check --hide-inclusion-graph -A license-not-encountered $(DENY_CHECKS)

## demo: control plane + mock EC2 + the controller, a sample fleet labelled and printed
demo: build controlplane
	$(BIN)/e2e-cluster demo

## test: unit + integration tests, then e2e against a real kube-apiserver (README command 2)
# Beside it, at the oldest Kubernetes the chart accepts, the e2e scenarios that rest on what the
# API server does (AT_THE_OLDEST in e2e/suite/tests/e2e.rs; docs/compatibility.md lists them, a
# test holds the two together), on an environment of its own; its output follows the suite's.
# The scenarios mostly wait on timers and other processes, so the passes (and the suite's own
# lanes, LANE_STARTS) share the CPU without crowding it.
test: build controlplane controlplane-oldest schedulers slurm pictures check-manifests
	cargo test --workspace --locked --no-run
	@oldest_log=$$(mktemp -t ec2tl-e2e-oldest.XXXXXX); \
	echo "e2e at the oldest Kubernetes the chart accepts (docs/compatibility.md) runs beside the suite, log: $$oldest_log"; \
	E2E_AT_THE_OLDEST=1 E2E_CONTROLPLANE_BIN=$$(e2e/controlplane/build.sh --oldest) cargo test --workspace --locked --test e2e </dev/null >"$$oldest_log" 2>&1 & oldest=$$!; \
	rc=0; cargo test --workspace --locked || rc=$$?; \
	orc=0; wait $$oldest || orc=$$?; \
	if [ $$orc -eq 0 ]; then echo "---- e2e at the oldest Kubernetes: passed ----"; else echo "---- e2e at the oldest Kubernetes: FAILED ----"; fi; \
	cat "$$oldest_log"; \
	if [ $$orc -eq 0 ]; then rm -f "$$oldest_log"; fi; \
	[ $$rc -eq 0 ] && [ $$orc -eq 0 ]

# Single targets are selected with --workspace, not -p: -p resolves features for one package
# alone and rebuilds the shared dependencies a second time (5 min cold).
## test-faults: the fault suite (EC2 throttled/down/slow/lying, API server restarted, label
## fights, kills, hostile input); writes docs/reliability.md. FAULT_SECONDS shortens the 60 s faults.
test-faults: build controlplane schedulers
	RELIABILITY_REPORT=$(CURDIR)/docs/reliability.md cargo test --workspace --locked --test faults

# The fault suite built, not run (.ci/run builds it before the fuzzing pass starts beside it).
test-faults-build:
	cargo test --workspace --locked --test faults --no-run

## fuzz: cargo-fuzz (stable toolchain, no sanitizer: the code is memory-safe Rust; looking for
## panics and broken invariants) where input enters: the providerID parser, the sanitiser, label
## derivation, the verification record (parse/open: round trip, a wrong key refused) and label
## maps into trees and Slurm's files. Each starts from its committed seeds (fuzz/seeds/TARGET);
## what it finds goes to a corpus in the cache, never into the checkout.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := provider_id sanitize derive record consistent
fuzz:
	@test -x $(EC2TL_CACHE)/cargo-fuzz/bin/cargo-fuzz || cargo install cargo-fuzz --locked --version 0.13.2 --root $(EC2TL_CACHE)/cargo-fuzz
	cd fuzz && for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(EC2TL_CACHE)/fuzz-corpus/$$t; \
	  PATH=$(EC2TL_CACHE)/cargo-fuzz/bin:$$PATH CARGO_TARGET_DIR=$(EC2TL_CACHE)/fuzz-target \
	    cargo fuzz run $$t -s none $(EC2TL_CACHE)/fuzz-corpus/$$t seeds/$$t -- -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 2>&1 | grep -E "Done|stat::number_of_executed_units|panicked|SUMMARY|INFO: seed corpus" ; \
	  test $${PIPESTATUS[0]} -eq 0 || exit 1; done

## e2e: only the end-to-end suite
e2e: build controlplane schedulers
	cargo test --workspace --locked --test e2e

SHELL_SCRIPTS := .ci/run hack/toolchain.sh e2e/schedulers/kai/source.sh hack/release.sh hack/shipped-binary.sh hack/zigbuild.sh e2e/kind/registry/registry.sh e2e/tools/cosign/build.sh e2e/slurm/install.sh e2e/image/build.sh e2e/controlplane/build.sh e2e/tools/build.sh e2e/kind/run.sh \
  e2e/kind/host.sh e2e/kind/node-image.sh e2e/kind/runc-wrapper.sh e2e/kind/images/kube-proxy/iptables-wrapper \
  e2e/schedulers/build.sh e2e/schedulers/volcano/build.sh e2e/schedulers/kai/build.sh \
  e2e/schedulers/karpenter/crds.sh e2e/tools/promtool/build.sh e2e/bench/tools.sh e2e/bench/chart.sh

## lint: formatting, clippy (warnings are errors), cargo-deny, helm lint, actionlint, shellcheck
lint: tools deny
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets --locked -- -D warnings
	cargo clippy --workspace --test faults --test kind --locked -- -D warnings  # test = false: not in --all-targets
	$$(e2e/tools/build.sh)/helm lint --strict $(CHART)
	$$(e2e/tools/build.sh)/actionlint .github/workflows/*.yaml
	@command -v shellcheck >/dev/null || { echo "installing shellcheck (apt)"; flock /var/lock/ec2tl-apt.lock apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive flock /var/lock/ec2tl-apt.lock apt-get -o DPkg::Lock::Timeout=600 install -y -qq shellcheck >/dev/null; }
	shellcheck $(SHELL_SCRIPTS)

## schema: regenerate the chart's values.schema.json from the binary's flags
schema:
	UPDATE_CHART_SCHEMA=1 cargo test --workspace --locked --test chart -- chart_values_schema_matches_the_flags

## image: the controller image without a Docker engine (static musl binary + buildah, offline)
image:
	e2e/image/build.sh

## release: the one release path (the release workflow runs only this): the controller image for
## linux/amd64 and linux/arm64, cross-compiled, as an OCI index; the chart pinning it by digest;
## an SBOM; signatures with COSIGN_KEY (or COSIGN_KEYLESS=1). Pushed to REGISTRY (hack/release.sh)
release: tools
	hack/release.sh

## kind: the e2e suite on kind clusters built here from nothing (Docker engine from Debian, an
## egress guard on the suite's own Docker networks, node image built locally, a local OCI
## registry that `make release` pushes to and the clusters pull from; IPv4, then IPv6;
## e2e/kind/run.sh). On a workstation: `make kind-down` undoes what it changed on the host.
kind: build pictures
	e2e/kind/run.sh

## kind-down: delete the kind clusters and the registry, and remove the egress guard, the suite's
## Docker networks and the guard check's network namespace (Docker itself stays installed)
kind-down:
	e2e/kind/run.sh --down

## kind-eks-credentials: a kind cluster with the stand-in STS, EKS Auth and Pod Identity agent;
## the chart installed with IRSA, then with Pod Identity, and checked (docs/install-eks.md); the
## cluster is kept (e2e/kind/run.sh --down removes it)
kind-eks-credentials: build
	E2E_KIND_ONLY=creds e2e/kind/run.sh --keep

## kind-prepare: everything `make kind` needs before a cluster starts (host, node image, images)
kind-prepare:
	e2e/kind/run.sh --prepare

fmt:
	cargo fmt --all

# deploy/: the Namespace, then the chart with its defaults for an API server that serves
# ValidatingAdmissionPolicy (the chart's kubeVersion, 1.30, does), without the helm test pod or
# the post-upgrade retire hook (no Helm runs it: after turning a feature off, run
# `ec2-topology-labeler retire`, docs/operations.md) or the record key (a random key on every
# render: docs/install-eks.md says how to add one to plain manifests).
RENDER_MANIFESTS = { printf 'apiVersion: v1\nkind: Namespace\nmetadata:\n  name: $(NAMESPACE)\n'; \
  $$(e2e/tools/build.sh)/helm template $(NAMESPACE) $(CHART) --namespace $(NAMESPACE) --skip-tests --set retireHook.enabled=false --set recordKey.enabled=false \
    --api-versions admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy; }

## manifests: render the chart into deploy/ (plain manifests for kubectl apply -f deploy/)
manifests: tools
	$(RENDER_MANIFESTS) > deploy/ec2-topology-labeler.yaml

## check-manifests: fail when deploy/ differs from what the chart renders
check-manifests: tools
	@$(RENDER_MANIFESTS) | diff -u deploy/ec2-topology-labeler.yaml - \
	  || { echo "deploy/ is stale: run make manifests"; exit 1; }

## docs: regenerate every generated file (docs tables from the code, chart schema, chart README, deploy/)
docs:
	UPDATE_DOCS=1 cargo test --workspace --locked --lib docs
	UPDATE_DOCS=1 cargo test --workspace --locked --test docs
	UPDATE_DOCS=1 cargo test --workspace --locked --test chart -- sizing
	$(MAKE) schema chart-docs manifests

## chart-docs: regenerate the chart's README.md from values.yaml and README.md.gotmpl (helm-docs)
chart-docs: tools
	cd $(CHART) && $$(cd $(CURDIR) && e2e/tools/build.sh)/helm-docs --chart-search-root . --skip-version-footer

## ci: what .ci/run does (it also prepares the kind images in the background meanwhile)
ci: lint test test-faults
	$(MAKE) fuzz FUZZ_SECONDS=20
	$(MAKE) kind

clean-cache:
	rm -rf $(EC2TL_CACHE)

## build-release: the controller as the image ships it (optimized); what the benchmarks measure
build-release:
	cargo build --release --locked --bin ec2-topology-labeler

# What the benchmarks measure: the binary the image ships (static musl, hack/shipped-binary.sh),
# then the release build for this machine's glibc; the targets are judged on the first.
BENCH_BUILDS = --build musl=$$(hack/shipped-binary.sh) --build glibc=$(CARGO_TARGET_DIR)/release/ec2-topology-labeler

## bench: labelling performance vs the article's script; regenerates docs/benchmarks.{md,png,csv}
## (the shipped musl build and the glibc release build, each in turn; the harness is the dev build)
bench: build build-release controlplane
	e2e/bench/tools.sh >/dev/null
	$(BIN)/bench $(BENCH_BUILDS) --out docs

## bench-scale: one size and one build per run (install, steady state, restart, one call per
## node), e.g. `make bench-scale SCALE_SIZES=20000 SCALE_BUILD=musl`: replaces that row of
## docs/benchmarks-scale.{md,png,csv} (which docs/benchmarks.md links) and keeps the others.
## SCALE_BUILD: musl (what the image ships) or glibc (the release build). SCALE_EVERYTHING=1: every
## feature on, as the chart turns them on (docs/benchmarks-scale-everything.csv). SCALE_EKS=1: the
## nodes already carry EKS's topology labels (rows of their own; writes should be 0). Not in CI.
SCALE_SIZES ?= 20000
SCALE_BUILD ?= musl
SCALE_LIGHT_FROM ?= 100000
SCALE_EVERYTHING ?=
SCALE_EKS ?=
SCALE_BIN_musl = $$(hack/shipped-binary.sh)
SCALE_BIN_glibc = $(CARGO_TARGET_DIR)/release/ec2-topology-labeler
bench-scale: build controlplane $(if $(filter glibc,$(SCALE_BUILD)),build-release) $(if $(SCALE_EVERYTHING),schedulers tools)
	@[[ -n "$(SCALE_BIN_$(SCALE_BUILD))" ]] || { echo "SCALE_BUILD=$(SCALE_BUILD): musl or glibc"; exit 1; }
	$(BIN)/bench --build $(SCALE_BUILD)=$(SCALE_BIN_$(SCALE_BUILD)) --scale $(SCALE_SIZES) --light-from $(SCALE_LIGHT_FROM) $(if $(SCALE_EVERYTHING),--everything) $(if $(SCALE_EKS),--eks-labelled) --out docs
