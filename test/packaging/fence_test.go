package packaging

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// containerArgs returns the args of the first container of the workload
// kind/name in objs.
func containerArgs(t *testing.T, objs []*unstructured.Unstructured, kind, name string) []string {
	t.Helper()
	o := find(objs, kind, name)
	if o == nil {
		t.Fatalf("no %s %s", kind, name)
	}
	cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
	a, _, _ := unstructured.NestedStringSlice(cs[0].(map[string]any), "args")
	return a
}

// flagValue returns the value of --name=value in args ("" when absent).
func flagValue(args []string, name string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
	}
	return ""
}

// TestFenceTimingsFollowTheController: the agent's copies of the
// controller's liveness timings (--controller-poll-interval,
// --controller-dead-after), against which it validates its fencing flags,
// are the controller's own (--agent-poll-interval, --agent-dead-after), by
// default and when the values change; the peer selector is the
// DaemonSet's nodeSelector; the kustomize install has the same defaults.
func TestFenceTimingsFollowTheController(t *testing.T) {
	for _, set := range [][]string{nil, {"--set", "controller.agentDeadAfter=5s,controller.agentPollInterval=2s,agent.fence.timeout=4500ms"}} {
		for name, objs := range map[string][]*unstructured.Unstructured{"chart " + strings.Join(set, " "): helmTemplate(t, set...), "dist": installYAML(t)} {
			if name == "dist" && set != nil {
				continue
			}
			ctl := containerArgs(t, objs, "Deployment", "egressip-controller-manager")
			ag := containerArgs(t, objs, "DaemonSet", "egressip-agent")
			for agentFlag, ctlFlag := range map[string]string{"controller-dead-after": "agent-dead-after", "controller-poll-interval": "agent-poll-interval"} {
				if a, c := flagValue(ag, agentFlag), flagValue(ctl, ctlFlag); a == "" || a != c {
					t.Errorf("%s: agent --%s=%q, controller --%s=%q", name, agentFlag, a, ctlFlag, c)
				}
			}
			for _, f := range []string{"fence-timeout", "peer-probe-interval", "peers"} {
				if flagValue(ag, f) == "" {
					t.Errorf("%s: agent has no --%s", name, f)
				}
			}
			if got := flagValue(ag, "peer-node-selector"); got != "kubernetes.io/os=linux" {
				t.Errorf("%s: agent --peer-node-selector=%q, want the DaemonSet's nodeSelector kubernetes.io/os=linux", name, got)
			}
			if set != nil && flagValue(ag, "fence-timeout") != "4500ms" {
				t.Errorf("%s: agent.fence.timeout not passed: %v", name, ag)
			}
			if !slices.Contains(ag, "--fence-timeout=1400ms") && set == nil {
				t.Errorf("%s: default fence timeout is not 1400ms (fence.DefaultTimeout): %v", name, ag)
			}
		}
	}
}
