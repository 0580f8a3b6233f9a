//go:build pin

// Package crdgen pins volcano.sh/apis: controller-gen reads the HyperNode types from it.
package crdgen

import _ "volcano.sh/apis/pkg/apis/topology/v1alpha1"
