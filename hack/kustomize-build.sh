#!/usr/bin/env bash
# Usage: hack/kustomize-build.sh KUSTOMIZE IMG
#
# Prints `kustomize build config/default` with every egressip container
# image set to IMG (repository:tag or repository@digest). The image is set in
# a temporary copy of config/, so no tracked file changes: with the default
# IMG the output is what config/ says as committed (dist/install.yaml).
set -euo pipefail
cd "$(dirname "$0")/.."
kustomize=$1 img=$2
case $kustomize in /*) ;; *) kustomize=$PWD/$kustomize ;; esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -R config "$tmp/config"
for dir in manager agent; do
	(cd "$tmp/config/$dir" && "$kustomize" edit set image "controller=$img")
done
"$kustomize" build "$tmp/config/default"
