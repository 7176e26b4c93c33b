package packaging

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// agentArgs renders the chart with sets and returns the agent container's
// args.
func agentArgs(t *testing.T, sets ...string) []string {
	t.Helper()
	var args []string
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	ds := find(helmTemplate(t, args...), "DaemonSet", "egressip-agent")
	if ds == nil {
		t.Fatal("no agent DaemonSet rendered")
	}
	cs, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
	a, _, _ := unstructured.NestedStringSlice(cs[0].(map[string]any), "args")
	return a
}

// TestChartVLANAndPoolRoutingValues: agent.createVLANs and
// agent.vlanParent become --create-vlans and --vlan-parent, and
// agent.datapath.poolRouting=false becomes --datapath-pool-routing=false;
// by default none of the three flags is passed (the agent's defaults:
// no VLAN creation, pool routing on), so the chart still matches
// dist/install.yaml. A vlanParent without createVLANs is refused.
func TestChartVLANAndPoolRoutingValues(t *testing.T) {
	has := func(args []string, prefix string) bool {
		return slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, prefix) })
	}
	def := agentArgs(t)
	for _, f := range []string{"--create-vlans", "--vlan-parent", "--datapath-pool-routing"} {
		if has(def, f) {
			t.Errorf("default render passes %s: %v", f, def)
		}
	}
	a := agentArgs(t, "agent.createVLANs=true")
	if !slices.Contains(a, "--create-vlans=true") || has(a, "--vlan-parent") {
		t.Errorf("createVLANs alone: %v", a)
	}
	a = agentArgs(t, "agent.createVLANs=true", "agent.vlanParent=bond0")
	if !slices.Contains(a, "--create-vlans=true") || !slices.Contains(a, "--vlan-parent=bond0") {
		t.Errorf("createVLANs with vlanParent: %v", a)
	}
	a = agentArgs(t, "agent.datapath.poolRouting=false")
	if !slices.Contains(a, "--datapath-pool-routing=false") {
		t.Errorf("poolRouting=false: %v", a)
	}
	if a := agentArgs(t, "agent.datapath.poolRouting=false", "agent.datapath.enabled=false"); has(a, "--datapath-pool-routing") {
		t.Errorf("poolRouting passed with the datapath off: %v", a)
	}

	helm := tool(t, "helm")
	out, err := runErr(helm, "template", release, "charts/chart", "--namespace", namespace, "--set", "agent.vlanParent=bond0")
	if want := "agent.vlanParent needs agent.createVLANs=true"; err == nil || !strings.Contains(out, want) {
		t.Errorf("vlanParent without createVLANs: want failure containing %q, got %v\n%s", want, err, out)
	}
	out, err = runErr(helm, "template", release, "charts/chart", "--namespace", namespace,
		"--set", "agent.createVLANs=true", "--set", "agent.vlanParent=a-name-of-16-byte")
	if err == nil || !strings.Contains(out, "vlanParent") {
		t.Errorf("16-byte vlanParent: want a schema error, got %v\n%s", err, out)
	}
}
