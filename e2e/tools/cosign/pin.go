//go:build tools

// Package tools pins cosign (github.com/sigstore/cosign), which signs what `make release`
// pushes and verifies it in the kind suite; build.sh builds it.
package tools

import _ "github.com/sigstore/cosign/v3/cmd/cosign"
