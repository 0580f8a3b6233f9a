#!/usr/bin/env bash
# The real Mermaid parser, which judges `tree -o mermaid` (crates/core/tests/pictures.rs):
# the npm packages pinned in e2e/tools/mermaid/package-lock.json, installed into the cache by
# a hash of it. Prints the directory holding check.mjs and node_modules.
#   e2e/tools/mermaid.sh    ->  ${EC2TL_CACHE:-$HOME/.cache/ec2-topology-labeler}/mermaid/<stamp>
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/mermaid" && pwd)
cache=${EC2TL_CACHE:-$HOME/.cache/ec2-topology-labeler}
out="$cache/mermaid/$(cat "$here/package.json" "$here/package-lock.json" "$here/check.mjs" | sha256sum | cut -c1-12)"
if [[ -f "$out/node_modules/mermaid/package.json" ]]; then
  echo "$out"
  exit 0
fi
command -v npm >/dev/null || { echo "[mermaid] npm is required (Node 20)" >&2; exit 1; }
rm -rf "$out.partial"
mkdir -p "$out.partial"
cp "$here/package.json" "$here/package-lock.json" "$here/check.mjs" "$out.partial/"
echo "[mermaid] npm ci (mermaid, jsdom)" >&2
(cd "$out.partial" && npm ci --no-audit --no-fund --loglevel=error >&2)
rm -rf "$out"
mv "$out.partial" "$out"
echo "$out"
