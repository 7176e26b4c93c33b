#!/usr/bin/env bash
# Fails when `make generate manifests build-installer` changes any generated
# file (dist/install.yaml included: a stale one otherwise fails only the
# packaging tests, late in `make test`), or when gofmt would reformat a Go
# file. Generated files are regenerated in place,
# so after a failure the working tree holds the up-to-date versions to commit.
set -euo pipefail
cd "$(dirname "$0")/.."

snapshot() {
	git ls-files --cached --others --exclude-standard -- api config charts/chart/templates/crd dist/install.yaml | sort | while read -r f; do
		[ -f "$f" ] && sha256sum "$f"
	done
}

before=$(snapshot)
make --no-print-directory generate manifests build-installer >/dev/null
after=$(snapshot)
if [ "$before" != "$after" ]; then
	echo "Generated files were out of date (now regenerated; review and commit them):" >&2
	diff <(echo "$before") <(echo "$after") | grep '^[<>]' | awk '{print "  " $3}' | sort -u >&2
	exit 1
fi

unformatted=$(gofmt -l $(git ls-files --cached --others --exclude-standard -- '*.go' | grep -v '^hack/envtest/'))
if [ -n "$unformatted" ]; then
	echo "gofmt would change these files (run 'make fmt'):" >&2
	echo "$unformatted" >&2
	exit 1
fi
echo "generated files and formatting are up to date"
