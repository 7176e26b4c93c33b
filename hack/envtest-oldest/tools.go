//go:build tools

// Package envtestoldest pins the kube-apiserver that `make envtest-assets-oldest`
// builds, so that `go mod tidy` keeps its dependencies in go.sum.
package envtestoldest

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
