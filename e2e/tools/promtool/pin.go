//go:build tools

// Package tools pins promtool (github.com/prometheus/prometheus), which tests the chart's alert
// rules (`promtool test rules`); e2e/tools/promtool/build.sh builds it.
package tools

import _ "github.com/prometheus/prometheus/cmd/promtool"
