#!/usr/bin/env bash
# The one release path: `make release` runs this, and so do the release workflow and the kind
# suite (against a registry on this machine).
#
#   REGISTRY=ghcr.io/ec2-topology-labeler make release        # the published release
#   REGISTRY=localhost:5001 make release                      # a local registry (plain HTTP)
#
# 1. The controller for linux/amd64 and linux/arm64, cross-compiled from this machine: rustup's
#    musl targets with zig as the C compiler and linker (cargo-zigbuild and ziglang from PyPI,
#    pinned below), the release profile (RELEASE_PROFILE=ci-dist: the kind suite's quicker
#    build, refused for anything but a local registry); no emulation. Each binary's ELF machine
#    is checked.
# 2. One image per platform (FROM scratch: e2e/image/Containerfile), an OCI index of the two,
#    pushed by buildah to $REGISTRY/ec2-topology-labeler:$VERSION; its digest is what the
#    chart pins. Timestamps are fixed: the same binaries give the same digest.
# 3. An SBOM of what the binary links and what built it (CycloneDX JSON, cargo-cyclonedx): the
#    build dependencies (build scripts' crates: cc, autocfg, ...) are listed with scope
#    "excluded" (used to build, not in the binary), the linked crates with scope "required".
#    The same static binaries in dist/ for workstations (ec2-topology-labeler-linux-amd64,
#    -linux-arm64) with SHA256SUMS; the release workflow attaches them to the GitHub release.
# 4. The chart with image.repository/tag/digest set to what was pushed, packaged and pushed to
#    oci://$REGISTRY/charts (helm push).
# 5. With COSIGN_KEY (a cosign key file; COSIGN_PASSWORD its password): the image index, the
#    chart, an SBOM attestation on the image and SHA256SUMS (a bundle beside it) signed with it
#    (no transparency log: a private key, verified with its public key, `cosign verify --key`).
#    With COSIGN_KEYLESS=1 (the release workflow, GitHub's OIDC token): keyless, recorded in
#    Sigstore's public log.
#
# Writes dist/: release.json (what was pushed, by digest, and the image sizes), the SBOM, the
# chart package, the workstation binaries with SHA256SUMS (and SHA256SUMS.sigstore.json when
# signed). Environment: REGISTRY (required), VERSION (default: the crate's, which must equal the
# chart's version and appVersion), REGISTRY_PLAIN_HTTP=1 for a registry without TLS (the default
# for localhost and 127.0.0.1), DIST (default: dist), RELEASE_PROFILE (release; ci-dist only into
# a local registry, never signed keyless).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
cache=${EC2TL_CACHE:-$HOME/.cache/ec2-topology-labeler}
start=$(date +%s)
step() { echo "[release] $1 at +$(( $(date +%s) - start ))s" >&2; }
die() { echo "[release] $*" >&2; exit 1; }

# Pinned tools (bump deliberately; each is cached by its version); zig's are in hack/zigbuild.sh.
# How each is checked: cargo-cyclonedx from crates.io with --locked (every crate's checksum in its
# Cargo.lock); cargo-zigbuild and zig from PyPI by SHA-256 (hack/zigbuild.sh); Helm and cosign
# built from the Go module proxy against their go.sum (e2e/tools); buildah from apt (signed
# archive); the Rust toolchain (rust-toolchain.toml) and the musl targets by rustup (SHA-256
# from the channel manifest).
# shellcheck source=hack/zigbuild.sh
source "$root/hack/zigbuild.sh"
CYCLONEDX_VERSION=0.5.7

: "${REGISTRY:?REGISTRY=host[:port][/path] is required, e.g. ghcr.io/ec2-topology-labeler}"
REGISTRY=${REGISTRY%/}
dist=${DIST:-$root/dist}
crate_version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
VERSION=${VERSION:-$crate_version}
chart_dir=charts/ec2-topology-labeler
chart_version=$(sed -n 's/^version: *//p' "$chart_dir/Chart.yaml")
app_version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}/\1/p' "$chart_dir/Chart.yaml")
for v in "$crate_version" "$chart_version" "$app_version"; do
  [[ $v == "$VERSION" ]] ||
    die "version $VERSION, but Cargo.toml says $crate_version, Chart.yaml $chart_version (appVersion $app_version)"
done
case "$REGISTRY" in
  localhost:* | localhost/* | localhost | 127.0.0.1*) plain_http=${REGISTRY_PLAIN_HTTP:-1} ;;
  *) plain_http=${REGISTRY_PLAIN_HTTP:-0} ;;
esac
image_repo="$REGISTRY/ec2-topology-labeler"
chart_repo="oci://$REGISTRY/charts"
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
rm -rf "$dist"
mkdir -p "$dist"

# --- tools -------------------------------------------------------------------------------------
step "tools (rustup musl targets, cargo-zigbuild + zig, buildah, cargo-cyclonedx, helm)"
targets=(x86_64-unknown-linux-musl aarch64-unknown-linux-musl)
zigbuild_tools "${targets[@]}"
cyclonedx="$cache/release-tools/cargo-cyclonedx-$CYCLONEDX_VERSION"
if [[ ! -x "$cyclonedx/bin/cargo-cyclonedx" ]]; then
  # Its own build directory (not the project's CARGO_TARGET_DIR); --locked: its own Cargo.lock.
  env -u CARGO_TARGET_DIR cargo install --quiet --locked cargo-cyclonedx --version "$CYCLONEDX_VERSION" --root "$cyclonedx.partial" >&2
  rm -rf "$cyclonedx" && mv "$cyclonedx.partial" "$cyclonedx"
fi
if ! command -v buildah >/dev/null; then
  echo "installing buildah (apt)" >&2
  # One apt at a time across this project's scripts (CI runs some side by side).
  flock /var/lock/ec2tl-apt.lock apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
  DEBIAN_FRONTEND=noninteractive flock /var/lock/ec2tl-apt.lock apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends buildah >&2
fi
helm="$(e2e/tools/build.sh)/helm"
cosign=""
if [[ -n ${COSIGN_KEY:-} || ${COSIGN_KEYLESS:-0} == 1 ]]; then
  cosign="$(e2e/tools/cosign/build.sh)/cosign"
fi

# --- 1. binaries -------------------------------------------------------------------------------
# RELEASE_PROFILE: `release` (what ships, the default) or `ci-dist` (Cargo.toml: the dev
# profile's optimisation, stripped; the kind suite's release, which proves the install path, not
# the optimiser, and costs a third of the CPU time on a cold machine).
profile=${RELEASE_PROFILE:-release}
[[ $profile == release || $profile == ci-dist ]] || die "RELEASE_PROFILE=$profile: release or ci-dist"
# What is published is always the release profile.
if [[ $profile != release ]] && { ((!plain_http)) || [[ ${COSIGN_KEYLESS:-0} == 1 ]]; }; then
  die "RELEASE_PROFILE=$profile is for a local registry (the kind suite); a published release is built with the release profile"
fi
step "cross-compiling the controller for ${targets[*]} ($profile profile)"
target_dir=$zigbuild_target_dir
zigbuild "$profile" "${targets[@]}"
declare -A platform=([x86_64-unknown-linux-musl]=linux/amd64 [aarch64-unknown-linux-musl]=linux/arm64)
declare -A machine=([x86_64-unknown-linux-musl]="Advanced Micro Devices X86-64" [aarch64-unknown-linux-musl]=AArch64)
for t in "${targets[@]}"; do
  bin="$target_dir/$t/$profile/ec2-topology-labeler"
  # Static, and for the architecture it claims to be (readelf reads the header; nothing runs).
  got=$(readelf -h "$bin" | sed -n 's/^ *Machine: *//p')
  [[ $got == "${machine[$t]}" ]] || die "$bin is built for '$got', not ${machine[$t]}"
  if (( $(readelf -l "$bin" | grep -c 'INTERP') > 0 )); then die "$bin is not static (it names an interpreter)"; fi
  # The same static binary for a workstation (explain, tree, plan, uninstall, retire with your own
  # kubeconfig and AWS credentials, exec plugins such as `aws eks get-token` included).
  cp "$bin" "$dist/ec2-topology-labeler-${platform[$t]/\//-}"
done
(cd "$dist" && sha256sum ec2-topology-labeler-linux-* >SHA256SUMS)

# --- 2. image ----------------------------------------------------------------------------------
step "image: one per platform, an OCI index of both, pushed to $image_repo:$VERSION"
bah() { buildah --storage-driver vfs "$@"; }
tls=(); ((plain_http)) && tls=(--tls-verify=false)
list="ec2tl-release:$VERSION"
bah manifest rm "$list" >/dev/null 2>&1 || true
bah manifest create "$list" >/dev/null
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
for t in "${targets[@]}"; do
  p=${platform[$t]}
  mkdir -p "$ctx/$t"
  cp /etc/ssl/certs/ca-certificates.crt "$ctx/$t/"
  cp "$target_dir/$t/$profile/ec2-topology-labeler" "$ctx/$t/app"
  # FROM scratch and COPY only: nothing runs, so the foreign platform needs no emulation.
  bah bud --quiet --isolation chroot --platform "$p" --manifest "$list" --timestamp 0 \
    --label "org.opencontainers.image.source=https://github.com/ec2-topology-labeler/ec2-topology-labeler" \
    --label "org.opencontainers.image.version=$VERSION" \
    --label "org.opencontainers.image.revision=$revision" \
    --label "org.opencontainers.image.licenses=Apache-2.0" \
    -f e2e/image/Containerfile "$ctx/$t" >/dev/null
done
bah manifest push --quiet --all --format oci "${tls[@]}" --digestfile "$dist/image.digest" \
  "$list" "docker://$image_repo:$VERSION" >&2
image_digest=$(cat "$dist/image.digest")
[[ $image_digest =~ ^sha256:[0-9a-f]{64}$ ]] || die "buildah gave no digest ($image_digest)"
# The index as pushed, and each platform's binary size (the kind suite reports the pushed,
# compressed image sizes from the registry).
bah manifest inspect "$list" >"$dist/index.json"
sizes=$(for t in "${targets[@]}"; do
  bin="$target_dir/$t/$profile/ec2-topology-labeler"
  printf '"%s": {"binary_bytes": %s}\n' "${platform[$t]}" "$(stat -c %s "$bin")"
done | paste -sd, -)

# --- 3. SBOM -----------------------------------------------------------------------------------
step "SBOM (CycloneDX, what the controller binary links and its build dependencies)"
# One file per binary of the workspace, next to each package's manifest: the controller's is the
# root package's; the others (the test harness's) are removed again. Build dependencies are in
# (cargo-cyclonedx's default, scope "excluded"); the supply chain includes what ran at build time.
PATH="$cyclonedx/bin:$PATH" cargo cyclonedx --quiet --format json --spec-version 1.5 \
  --describe binaries --target x86_64-unknown-linux-musl >&2
[[ -s ec2-topology-labeler_bin.cdx.json ]] || die "cargo-cyclonedx wrote no SBOM for the controller"
grep -q '"scope": *"excluded"' ec2-topology-labeler_bin.cdx.json ||
  die "the SBOM lists no build dependencies (scope excluded): has cargo-cyclonedx's default changed?"
mv ec2-topology-labeler_bin.cdx.json "$dist/sbom.cdx.json"
find . -name '*_bin.cdx.json' -not -path './dist/*' -delete

# --- 4. chart ----------------------------------------------------------------------------------
step "chart: the image pinned by digest, packaged and pushed to $chart_repo"
cp -r "$chart_dir" "$ctx/chart"
values="$ctx/chart/values.yaml"
# Only the three keys of the top-level image: block change; everything else is the chart as it is.
awk -v repo="$image_repo" -v tag="$VERSION" -v digest="$image_digest" '
  /^[^ #]/ { in_image = ($0 ~ /^image:/) }
  in_image && /^  repository:/ { print "  repository: " repo; next }
  in_image && /^  tag:/ { print "  tag: \"" tag "\""; next }
  in_image && /^  digest:/ { print "  digest: \"" digest "\""; next }
  { print }' "$values" >"$values.new"
mv "$values.new" "$values"
rendered=$("$helm" template ec2-topology-labeler "$ctx/chart" --show-only templates/deployment.yaml)
grep -q "image: \"\{0,1\}$image_repo@$image_digest\"\{0,1\}$" <<<"$rendered" ||
  die "the packaged chart does not render the pushed image by digest"
"$helm" lint --strict "$ctx/chart" >/dev/null
"$helm" package "$ctx/chart" --destination "$dist" >/dev/null
chart_tgz="$dist/ec2-topology-labeler-$VERSION.tgz"
[[ -s $chart_tgz ]] || die "helm package wrote no $chart_tgz"
push_flags=(); ((plain_http)) && push_flags=(--plain-http)
pushed=$("$helm" push "$chart_tgz" "$chart_repo" "${push_flags[@]}" 2>&1) || die "helm push: $pushed"
chart_digest=$(sed -n 's/^Digest: *//p' <<<"$pushed")
[[ $chart_digest =~ ^sha256:[0-9a-f]{64}$ ]] || die "helm push gave no digest: $pushed"

# --- 5. signatures -----------------------------------------------------------------------------
signed=false
if [[ -n $cosign ]]; then
  step "signing the image, the chart and the SBOM attestation (cosign)"
  sign_flags=(--yes)
  # A private key: no transparency log (cosign 3 then needs its signing config turned off).
  if [[ -n ${COSIGN_KEY:-} ]]; then sign_flags+=(--key "$COSIGN_KEY" --use-signing-config=false --tlog-upload=false); fi
  ((plain_http)) && sign_flags+=(--allow-http-registry --allow-insecure-registry)
  chart_ref="${chart_repo#oci://}/ec2-topology-labeler@$chart_digest"
  "$cosign" sign "${sign_flags[@]}" "$image_repo@$image_digest" >&2
  "$cosign" sign "${sign_flags[@]}" "$chart_ref" >&2
  "$cosign" attest "${sign_flags[@]}" --type cyclonedx --predicate "$dist/sbom.cdx.json" \
    "$image_repo@$image_digest" >&2
  # The workstation binaries: their checksums, signed (verify-blob with the bundle, then
  # sha256sum -c; docs/install-eks.md "A workstation").
  blob_flags=(--yes)
  if [[ -n ${COSIGN_KEY:-} ]]; then blob_flags+=(--key "$COSIGN_KEY" --use-signing-config=false --tlog-upload=false); fi
  "$cosign" sign-blob "${blob_flags[@]}" --bundle "$dist/SHA256SUMS.sigstore.json" "$dist/SHA256SUMS" >&2
  signed=true
fi

binaries=$(for t in "${targets[@]}"; do
  printf '"%s": "ec2-topology-labeler-%s"\n' "${platform[$t]}" "${platform[$t]/\//-}"
done | paste -sd, -)
cat >"$dist/release.json" <<EOF
{
  "version": "$VERSION",
  "revision": "$revision",
  "image": "$image_repo@$image_digest",
  "image_tag": "$image_repo:$VERSION",
  "chart": "$chart_repo/ec2-topology-labeler",
  "chart_digest": "$chart_digest",
  "plain_http": $( ((plain_http)) && echo true || echo false ),
  "signed": $signed,
  "profile": "$profile",
  "binaries": {$binaries},
  "checksums": "SHA256SUMS",
  "platforms": {$sizes}
}
EOF
step "released $VERSION: $image_repo@$image_digest, $chart_repo/ec2-topology-labeler $VERSION ($chart_digest)"
cat "$dist/release.json"
