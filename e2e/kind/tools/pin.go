//go:build pin

// Package tools pins sigs.k8s.io/kind: the CLI is built from it, and node-image.sh copies its
// base-image files.
package tools

import _ "sigs.k8s.io/kind"
