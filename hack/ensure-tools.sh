#!/usr/bin/env bash
# Checks that the system tools the tests and the demo call are installed,
# and names the Debian package of any that is missing. It installs nothing:
# `make test` never runs apt-get.
set -euo pipefail
missing=()
command -v ip >/dev/null 2>&1 || missing+=("ip: apt-get install iproute2")
command -v git >/dev/null 2>&1 || missing+=("git: apt-get install git")
if ((${#missing[@]})); then
	echo "missing system tools (the agent tests, the e2e suite and the demo call them):" >&2
	printf '  %s\n' "${missing[@]}" >&2
	exit 1
fi
