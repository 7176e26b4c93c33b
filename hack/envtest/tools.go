//go:build tools

// Package envtest pins the control-plane commands that `make envtest-assets`
// builds, so that `go mod tidy` keeps their dependencies in go.sum.
package envtest

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
