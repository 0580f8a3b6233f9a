#!/usr/bin/env bash
# Build the KAI Scheduler for the scheduler tests from the source snapshot in
# ../shared/upstream/kai/ (KAI's Go module is not served here; its dependencies come from the Go
# module proxy), cached by a hash of the snapshot and this script:
#   <out>/kai-scheduler   the scheduler (cmd/scheduler)
#   <out>/kai-binder      the binder: binds the pods the scheduler placed (cmd/binder)
#   <out>/kai-podgrouper  the pod grouper: one PodGroup per workload (cmd/podgrouper)
#   <out>/crds/*.yaml     the snapshot's CRDs of queues, pod groups and bind requests (the Topology
#                         CRD the tests take from ../shared/upstream/kai/);
#                         and the PyTorchJob CRD of the Kubeflow training operator KAI pins (the
#                         gang workload of the tests)
#   <out>/priorityclasses/*.yaml  the PriorityClasses KAI's chart installs (its pod groups name them)
# Prints <out>. EC2TL_UPSTREAM overrides the directory of the snapshot (default: ../shared/upstream
# beside the checkout).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)
cache=${EC2TL_CACHE:-$HOME/.cache/ec2-topology-labeler}
upstream=${EC2TL_UPSTREAM:-$repo/../shared/upstream}
tarball="$upstream/kai/kai-scheduler-src.tar.xz"
[[ -f "$tarball" ]] || { echo "missing $tarball (see ../shared/upstream/README.md)" >&2; exit 1; }
stamp=$(cat "$tarball" "$here/build.sh" | sha256sum | cut -c1-12)
out="$cache/schedulers/kai/$stamp"
if [[ -x "$out/kai-scheduler" && -x "$out/kai-binder" && -x "$out/kai-podgrouper" && -d "$out/crds" && -d "$out/priorityclasses" ]]; then
  echo "$out"
  exit 0
fi
rm -rf "$out.partial"
mkdir -p "$out.partial/crds" "$out.partial/src"
start=$(date +%s)
tar -xJf "$tarball" -C "$out.partial/src"
src="$out.partial/src/kai-scheduler"
cd "$src"
for cmd in scheduler binder podgrouper; do
  t=$(date +%s)
  echo "building kai ${cmd} from the snapshot (cold: several minutes)..." >&2
  GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$out.partial/kai-${cmd}" "./cmd/${cmd}"
  echo "kai-${cmd} built in $(( $(date +%s) - t ))s" >&2
done
mkdir -p "$out.partial/priorityclasses"
cp deployments/kai-scheduler/templates/priorityclasses/*.yaml "$out.partial/priorityclasses/"
# Queues, pod groups and bind requests: what the three components use (the kai.scheduler Config and
# SchedulingShard CRDs are the operator's).
cp deployments/kai-scheduler/crds/scheduling.run.ai_*.yaml "$out.partial/crds/"
training=$(GOFLAGS=-mod=mod go list -m -f '{{.Dir}}' github.com/kubeflow/training-operator)
cp "$training/manifests/base/crds/kubeflow.org_pytorchjobs.yaml" "$out.partial/crds/"
chmod -R u+w "$out.partial/crds" "$out.partial/priorityclasses"
rm -rf "$out.partial/src"

rm -rf "$out"
mv "$out.partial" "$out"
echo "kai built in $(( $(date +%s) - start ))s" >&2
echo "$out"
