package controller

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/cloud"
)

// Pure table tests of the cloud side of plan: no API server, no cloud.

func planNode(name string) corev1.Node {
	return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelOSStable: "linux"}},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
}

// planEgress is an Egress of the pool planPool makes ("c").
func planEgress(name, statusIP, statusNode string, sec int) v1.Egress {
	return v1.Egress{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(time.Unix(int64(1000+sec), 0))},
		Spec:   v1.EgressSpec{ExternalIPPool: "c"},
		Status: v1.EgressStatus{EgressIP: statusIP, EgressNode: statusNode}}
}

func planPool(warmIPs ...v1.WarmIP) v1.ExternalIPPool {
	p := v1.ExternalIPPool{ObjectMeta: metav1.ObjectMeta{Name: "c"}, Spec: v1.ExternalIPPoolSpec{
		Cloud: &v1.CloudPool{Provider: v1.CloudProviderAWS, AWS: &v1.AWSPool{SubnetID: "subnet-01234567", InterfaceMode: v1.AWSPrimaryInterface}, WarmIPTarget: 2}}}
	if len(warmIPs) > 0 {
		p.Status.Cloud = &v1.CloudPoolStatus{WarmIPs: warmIPs}
	}
	return p
}

func iface(node string, n int, limit int, secondary ...string) cloud.Interface {
	ifc := cloud.Interface{Node: node, ID: "eni-" + node, MAC: "0a:00:00:00:00:0" + string(rune('0'+n)), SubnetID: "subnet-01234567", Limit: limit}
	for _, s := range secondary {
		ifc.Secondary = append(ifc.Secondary, netip.MustParseAddr(s))
	}
	return ifc
}

func cloudIn(ifaces ...cloud.Interface) *cloudInput {
	ci := &cloudInput{Now: time.Unix(5000, 0), Ifaces: map[string]cloud.Interface{}}
	for _, i := range ifaces {
		ci.Ifaces[i.Node] = i
	}
	return ci
}

func alive(string) AgentState { return AgentState{} }

func TestPlanCloud(t *testing.T) {
	t.Run("cloud pool without a provider is invalid", func(t *testing.T) {
		out := plan(passInput{Pools: []v1.ExternalIPPool{planPool()}, Egresses: []v1.Egress{planEgress("e", "", "", 0)},
			Nodes: []corev1.Node{planNode("a")}, Agents: alive, Config: PassConfig{DefaultCapacity: 10}})
		c := meta.FindStatusCondition(out.Egresses["e"].Status.Conditions, v1.ConditionIPAllocated)
		if c == nil || c.Reason != v1.ReasonPoolInvalid || !strings.Contains(c.Message, "--cloud-provider=aws") {
			t.Fatalf("IPAllocated = %+v", c)
		}
	})

	t.Run("a warm IP is taken on its Node: Assigned at once, MAC set, no call", func(t *testing.T) {
		p := planPool(v1.WarmIP{IP: "10.0.0.5", Node: "b"}, v1.WarmIP{IP: "10.0.0.6", Node: "b"})
		out := plan(passInput{Pools: []v1.ExternalIPPool{p}, Egresses: []v1.Egress{planEgress("e", "", "", 0)},
			Nodes: []corev1.Node{planNode("a"), planNode("b")}, Agents: alive, Config: PassConfig{DefaultCapacity: 10},
			Cloud: cloudIn(iface("a", 1, 10), iface("b", 2, 10, "10.0.0.5", "10.0.0.6"))})
		st := out.Egresses["e"].Status
		if st.EgressIP != "10.0.0.5" || st.EgressNode != "b" || st.InterfaceMAC != "0a:00:00:00:00:02" {
			t.Fatalf("status %+v", st)
		}
		if len(out.Cloud.Attach) != 0 {
			t.Fatalf("named attaches for a warm allocation: %+v", out.Cloud.Attach)
		}
		// One warm left of 2: the refill asks for one, on the emptier Node a.
		pl := out.Cloud.Pools["c"].Plan
		if pl.Short != 1 || len(pl.Attach) != 1 || pl.Attach[0].Node != "a" || pl.Attach[0].Count != 1 {
			t.Fatalf("refill plan %+v", pl)
		}
		if cs := out.Pools["c"].Cloud; cs == nil || cs.Allocated != 1 || cs.Warm != 1 || cs.Attached != 2 || len(cs.WarmIPs) != 1 {
			t.Fatalf("pool cloud status %+v", cs)
		}
	})

	t.Run("no warm IP: waiting, and the shortfall counts the pending Egress", func(t *testing.T) {
		p := planPool()
		p.Spec.Cloud.WarmIPTarget = 0
		out := plan(passInput{Pools: []v1.ExternalIPPool{p}, Egresses: []v1.Egress{planEgress("e", "", "", 0)},
			Nodes: []corev1.Node{planNode("a")}, Agents: alive, Config: PassConfig{DefaultCapacity: 10},
			Cloud: cloudIn(iface("a", 1, 10))})
		c := meta.FindStatusCondition(out.Egresses["e"].Status.Conditions, v1.ConditionIPAllocated)
		if c == nil || c.Reason != v1.ReasonWaitingForWarmIP {
			t.Fatalf("IPAllocated = %+v", c)
		}
		if pl := out.Cloud.Pools["c"].Plan; pl.Short != 1 || len(pl.Attach) != 1 {
			t.Fatalf("plan %+v", pl)
		}
	})

	t.Run("failover: addresses of a dead Node attach in one call per destination", func(t *testing.T) {
		p := planPool()
		p.Spec.Cloud.WarmIPTarget = 0
		var egs []v1.Egress
		var onA []string
		for i := range 6 {
			ip := netip.AddrFrom4([4]byte{10, 0, 0, byte(10 + i)}).String()
			egs = append(egs, planEgress("e"+ip, ip, "a", i))
			onA = append(onA, ip)
		}
		dead := func(n string) AgentState { return AgentState{Known: true, Dead: n == "a"} }
		out := plan(passInput{Pools: []v1.ExternalIPPool{p}, Egresses: egs,
			Nodes: []corev1.Node{planNode("a"), planNode("b"), planNode("c")}, Agents: dead, Config: PassConfig{DefaultCapacity: 10},
			Cloud: cloudIn(iface("a", 1, 10, onA...), iface("b", 2, 10), iface("c", 3, 10))})
		moved := 0
		for _, op := range out.Cloud.Attach {
			if op.Node == "a" {
				t.Fatalf("attach to the dead Node: %+v", op)
			}
			moved += len(op.IPs)
		}
		if len(out.Cloud.Attach) > 2 || moved != 6 {
			t.Fatalf("want at most one attach per destination moving 6, got %+v", out.Cloud.Attach)
		}
		for _, e := range egs {
			st := out.Egresses[e.Name].Status
			c := meta.FindStatusCondition(st.Conditions, v1.ConditionAssigned)
			if st.EgressNode != "" || c == nil || c.Reason != v1.ReasonAttaching {
				t.Fatalf("%s before the attach: node %q, Assigned %+v", e.Name, st.EgressNode, c)
			}
		}
	})

	t.Run("capacity: ENI limit minus others' addresses and our warm ones", func(t *testing.T) {
		p := planPool(v1.WarmIP{IP: "10.0.0.5", Node: "a"})
		p.Spec.Cloud.WarmIPTarget = 0
		// Limit 6: 5 secondary slots; the CNI has 3, our warm 1: 1 left
		// for an address moved here, plus the warm one if taken here.
		var egs []v1.Egress
		for i := range 3 {
			egs = append(egs, planEgress("n"+string(rune('0'+i)), "", "", i))
		}
		egs[0].Spec.EgressIP = "10.0.0.50"
		egs[1].Spec.EgressIP = "10.0.0.51"
		egs[2].Spec.EgressIP = "10.0.0.52"
		out := plan(passInput{Pools: []v1.ExternalIPPool{p}, Egresses: egs,
			Nodes: []corev1.Node{planNode("a")}, Agents: alive, Config: PassConfig{DefaultCapacity: 10},
			Cloud: cloudIn(iface("a", 1, 6, "10.0.0.5", "10.0.0.100", "10.0.0.101", "10.0.0.102"))})
		placed := 0
		for _, op := range out.Cloud.Attach {
			placed += len(op.IPs)
		}
		if placed != 1 || out.Unplaced["CapacityExhausted"] != 2 {
			t.Fatalf("want 1 named IP attached and 2 unplaced, got attaches %+v unplaced %v", out.Cloud.Attach, out.Unplaced)
		}
	})

	t.Run("a stale cache gets the address the previous pass gave", func(t *testing.T) {
		// The previous pass gave e 10.0.0.9; the cache still shows e
		// without an address, and a lower warm address appeared since.
		p := planPool(v1.WarmIP{IP: "10.0.0.5", Node: "a"})
		ci := cloudIn(iface("a", 1, 10, "10.0.0.5", "10.0.0.9"))
		ci.Recent = map[string]netip.Addr{"e": netip.MustParseAddr("10.0.0.9")}
		ci.Owned = map[string]map[netip.Addr]bool{"c": {netip.MustParseAddr("10.0.0.9"): true}}
		out := plan(passInput{Pools: []v1.ExternalIPPool{p}, Egresses: []v1.Egress{planEgress("e", "", "", 0), planEgress("f", "", "", 1)},
			Nodes: []corev1.Node{planNode("a")}, Agents: alive, Config: PassConfig{DefaultCapacity: 10}, Cloud: ci})
		if got := out.Egresses["e"].Status.EgressIP; got != "10.0.0.9" {
			t.Fatalf("e got %s, want the address of the previous pass 10.0.0.9", got)
		}
		if got := out.Egresses["f"].Status.EgressIP; got != "10.0.0.5" {
			t.Fatalf("f got %s, want the remaining warm 10.0.0.5", got)
		}
	})

	t.Run("a released address cools down before it is available", func(t *testing.T) {
		p := planPool()
		p.Spec.Cloud.WarmIPTarget = 1
		ci := cloudIn(iface("a", 1, 10, "10.0.0.5"))
		ci.Owned = map[string]map[netip.Addr]bool{"c": {netip.MustParseAddr("10.0.0.5"): true}}
		ci.PrevAllocated = map[string]map[netip.Addr]bool{"c": {netip.MustParseAddr("10.0.0.5"): true}}
		out := plan(passInput{Pools: []v1.ExternalIPPool{p}, Nodes: []corev1.Node{planNode("a")}, Agents: alive, Config: PassConfig{DefaultCapacity: 10}, Cloud: ci})
		po := out.Cloud.Pools["c"]
		if len(po.Released) != 1 || po.Plan.Available != 0 || po.Plan.Short != 1 || po.Status.Warm != 1 {
			t.Fatalf("released %v plan %+v status %+v", po.Released, po.Plan, po.Status)
		}
	})
}
