#!/usr/bin/env bash
# Build the KAI Scheduler for the scheduler tests from its source at the pinned commit (source.sh:
# the Go module proxy, or a snapshot tarball for offline machines; its dependencies come from the
# Go module proxy), cached by a hash of the two scripts (the commit is pinned in source.sh):
#   <out>/kai-scheduler   the scheduler (cmd/scheduler)
#   <out>/kai-binder      the binder: binds the pods the scheduler placed (cmd/binder)
#   <out>/kai-podgrouper  the pod grouper: one PodGroup per workload (cmd/podgrouper)
#   <out>/crds/*.yaml     KAI's CRDs of queues, pod groups and bind requests;
#                         and the PyTorchJob CRD of the Kubeflow training operator KAI pins (the
#                         gang workload of the tests)
#   <out>/priorityclasses/*.yaml  the PriorityClasses KAI's chart installs (its pod groups name them)
#   <out>/topology/kai.scheduler_topologies.yaml  KAI's own Topology CRD (what the controller writes)
# Prints <out>. EC2TL_UPSTREAM names a directory holding kai/kai-scheduler-src.tar.xz (see
# source.sh).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${EC2TL_CACHE:-$HOME/.cache/ec2-topology-labeler}
stamp=$(cat "$here/source.sh" "$here/build.sh" | sha256sum | cut -c1-12)
out="$cache/schedulers/kai/$stamp"
if [[ -x "$out/kai-scheduler" && -x "$out/kai-binder" && -x "$out/kai-podgrouper" && -d "$out/crds" && -d "$out/priorityclasses" && -f "$out/topology/kai.scheduler_topologies.yaml" ]]; then
  echo "$out"
  exit 0
fi
rm -rf "$out.partial"
mkdir -p "$out.partial/crds" "$out.partial/src" "$out.partial/topology"
start=$(date +%s)
"$here/source.sh" "$out.partial/src"
src="$out.partial/src/kai-scheduler"
cd "$src"
for cmd in scheduler binder podgrouper; do
  t=$(date +%s)
  echo "building kai ${cmd} (cold: several minutes)..." >&2
  # -N -l: no optimiser or inliner for a test tool whose speed no test measures (a cold
  # build takes less CPU: docs/development.md, "Building").
  GOFLAGS=-mod=mod go build -trimpath -gcflags="all=-N -l" -ldflags "-s -w" -o "$out.partial/kai-${cmd}" "./cmd/${cmd}"
  echo "kai-${cmd} built in $(( $(date +%s) - t ))s" >&2
done
mkdir -p "$out.partial/priorityclasses"
cp deployments/kai-scheduler/templates/priorityclasses/*.yaml "$out.partial/priorityclasses/"
# Queues, pod groups and bind requests: what the three components use (the kai.scheduler Config and
# SchedulingShard CRDs are the operator's).
cp deployments/kai-scheduler/crds/scheduling.run.ai_*.yaml "$out.partial/crds/"
cp deployments/kai-scheduler/crds/kai.scheduler_topologies.yaml "$out.partial/topology/"
training=$(GOFLAGS=-mod=mod go list -m -f '{{.Dir}}' github.com/kubeflow/training-operator)
cp "$training/manifests/base/crds/kubeflow.org_pytorchjobs.yaml" "$out.partial/crds/"
chmod -R u+w "$out.partial/crds" "$out.partial/priorityclasses" "$out.partial/topology"
rm -rf "$out.partial/src"

rm -rf "$out"
mv "$out.partial" "$out"
echo "kai built in $(( $(date +%s) - start ))s" >&2
echo "$out"
