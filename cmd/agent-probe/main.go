// Command egressip-agent-probe is the egressip-agent DaemonSet's exec
// probe: it asks the agent process of its own Pod, over the unix socket the
// agent serves (--health-probe-socket), whether it is alive (healthz) or
// ready (readyz), and exits 0 when it is. It is a separate small binary so
// that each probe costs a few megabytes, not the agent's start-up. See
// package healthprobe.
package main

import (
	"os"

	"github.com/egressip/egressip/internal/healthprobe"
)

func main() {
	os.Exit(healthprobe.Main("egressip-agent-probe", os.Args[1:], os.Stderr))
}
