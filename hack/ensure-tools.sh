#!/usr/bin/env bash
# Installs the system tools the tests and the demo call (ip from iproute2)
# when they are missing. Needs root, as the tests themselves do.
set -euo pipefail
if ! command -v ip >/dev/null 2>&1; then
	echo "ip (iproute2) not found: installing it with apt-get"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2
fi
