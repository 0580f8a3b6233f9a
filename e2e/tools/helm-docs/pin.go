//go:build pin

// Package helmdocs pins github.com/norwoodj/helm-docs (the chart README, generated from
// values.yaml and README.md.gotmpl).
package helmdocs

import _ "github.com/norwoodj/helm-docs/cmd/helm-docs"
