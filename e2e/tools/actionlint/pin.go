//go:build pin

// Package actionlint pins github.com/rhysd/actionlint.
package actionlint

import _ "github.com/rhysd/actionlint"
