#!/usr/bin/env bash
# Prints the packages of one test tier, one per line:
#   unit     no root, no kube-apiserver, no network namespaces
#   envtest  a real kube-apiserver and etcd (envtest), no root
#   netns    network namespaces and netlink: root (some also use envtest)
# A package's tier follows from what it and its tests import, so a new
# package lands in the right tier without editing a list: anything that
# imports a network-namespace helper is netns, else anything that imports
# envtest is envtest, else unit.
set -euo pipefail
tier=${1:?usage: test-tier.sh unit|envtest|netns}
cd "$(dirname "$0")/.."
go list -f '{{.ImportPath}}|{{join .Imports " "}} {{join .TestImports " "}} {{join .XTestImports " "}}' ./... |
	awk -F'|' -v want="$tier" '
		{
			t = "unit"
			if ($2 ~ /netnstest|vishvananda\/netns|test\/e2e\/harness/) t = "netns"
			else if ($2 ~ /controller-runtime\/pkg\/envtest|internal\/testenv/) t = "envtest"
			if (t == want) print $1
		}'
