package packaging

import (
	"slices"
	"strings"
	"testing"
)

// TestChartDrainTimeoutValue: agent.datapath.drainTimeout becomes
// --datapath-drain-timeout, passed only when set and only with the
// datapath on (by default the agent's own 1h applies and the chart still
// matches dist/install.yaml); a value that is not a Go duration is refused
// by the values schema, naming the value.
func TestChartDrainTimeoutValue(t *testing.T) {
	has := func(args []string) bool {
		return slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--datapath-drain-timeout") })
	}
	if a := agentArgs(t); has(a) {
		t.Errorf("default render passes --datapath-drain-timeout: %v", a)
	}
	for _, v := range []string{"30m", "1h30m", "0", "90s"} {
		a := agentArgs(t, "agent.datapath.drainTimeout="+v)
		if !slices.Contains(a, "--datapath-drain-timeout="+v) {
			t.Errorf("drainTimeout=%s: want --datapath-drain-timeout=%s in %v", v, v, a)
		}
	}
	if a := agentArgs(t, "agent.datapath.drainTimeout=30m", "agent.datapath.enabled=false"); has(a) {
		t.Errorf("drainTimeout passed with the datapath off: %v", a)
	}

	helm := tool(t, "helm")
	for _, bad := range []string{"30 minutes", "1d", "m"} {
		out, err := runErr(helm, "template", release, "charts/chart", "--namespace", namespace, "--set", "agent.datapath.drainTimeout="+bad)
		if err == nil || !strings.Contains(out, "drainTimeout") {
			t.Errorf("drainTimeout=%q: want a schema error naming drainTimeout, got %v\n%s", bad, err, out)
		}
	}
}
