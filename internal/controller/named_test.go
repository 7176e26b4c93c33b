package controller

import (
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/cloud"
)

// TestNamedAddressHeldPlan: the pure decisions of issue 17 item 4.
func TestNamedAddressHeldPlan(t *testing.T) {
	lb := heldAddr{Holder: cloud.Holder{InterfaceID: "eni-lb", Type: "network_load_balancer", RequesterID: "amazon-elb"}, Subnet: "subnet-01234567"}
	a := netip.MustParseAddr
	run := func(egs []v1.Egress, p v1.ExternalIPPool, ci *cloudInput) passOutput {
		return plan(passInput{Pools: []v1.ExternalIPPool{p}, Egresses: egs, Nodes: []corev1.Node{planNode("a"), planNode("b")},
			Agents: alive, Config: PassConfig{DefaultCapacity: 10}, Cloud: ci})
	}
	t.Run("a held spec.egressIP is refused with the holder named", func(t *testing.T) {
		e := planEgress("e", "", "", 0)
		e.Spec.EgressIP = "10.0.0.52"
		ci := cloudIn(iface("a", 1, 10), iface("b", 2, 10))
		ci.Held = map[netip.Addr]heldAddr{a("10.0.0.52"): lb}
		p := planPool()
		p.Spec.Cloud.WarmIPTarget = 0
		out := run([]v1.Egress{e}, p, ci)
		ch := out.Egresses["e"]
		c := meta.FindStatusCondition(ch.Status.Conditions, v1.ConditionIPAllocated)
		if c == nil || c.Reason != v1.ReasonAddressHeld || !strings.Contains(c.Message, "eni-lb") || !strings.Contains(c.Message, "amazon-elb") {
			t.Fatalf("IPAllocated %+v", c)
		}
		if ch.EventReason != v1.ReasonAddressHeld || ch.Status.EgressIP != "" || len(out.Cloud.Attach) != 0 || !out.Cloud.HeldWanted[a("10.0.0.52")] {
			t.Fatalf("event %s, status %+v, attaches %+v, wanted %v", ch.EventReason, ch.Status, out.Cloud.Attach, out.Cloud.HeldWanted)
		}
		// Unchanged condition next pass: no new Event.
		e.Status = ch.Status
		if again := run([]v1.Egress{e}, p, ci).Egresses["e"]; again.EventReason == v1.ReasonAddressHeld {
			t.Fatalf("Event repeated: %s", again.EventNote)
		}
	})
	t.Run("an address on the target's interface that is not ours is attached (and looked up), not taken as done", func(t *testing.T) {
		// 10.0.0.50 is a Pod IP on a's interface; the Egress names it.
		e := planEgress("e", "", "", 0)
		e.Spec.EgressIP = "10.0.0.50"
		p := planPool()
		p.Spec.Cloud.WarmIPTarget = 0
		out := run([]v1.Egress{e}, p, cloudIn(iface("a", 1, 10, "10.0.0.50")))
		st := out.Egresses["e"].Status
		if st.EgressNode != "" || len(out.Cloud.Attach) != 1 || len(out.Cloud.Attach[0].From) != 0 {
			t.Fatalf("status %+v attaches %+v: want an attach with no address counted as ours", st, out.Cloud.Attach)
		}
	})
	t.Run("a failover moves only addresses known to be ours", func(t *testing.T) {
		dead := func(n string) AgentState { return AgentState{Known: true, Dead: n == "a"} }
		p := planPool()
		p.Spec.Cloud.WarmIPTarget = 0
		out := plan(passInput{Pools: []v1.ExternalIPPool{p}, Egresses: []v1.Egress{planEgress("e", "10.0.0.5", "a", 0)},
			Nodes: []corev1.Node{planNode("a"), planNode("b")}, Agents: dead, Config: PassConfig{DefaultCapacity: 10},
			Cloud: cloudIn(iface("a", 1, 10, "10.0.0.5"), iface("b", 2, 10))})
		if len(out.Cloud.Attach) != 1 || out.Cloud.Attach[0].Node != "b" || out.Cloud.Attach[0].From[a("10.0.0.5")] != "eni-a" {
			t.Fatalf("attaches %+v: want a move of 10.0.0.5 from eni-a to b", out.Cloud.Attach)
		}
	})
	t.Run("held addresses of ipRanges are skipped and named in the pool", func(t *testing.T) {
		p := planPool()
		p.Spec.IPRanges = []v1.IPRange{{Start: "10.0.0.50", End: "10.0.0.53"}}
		p.Spec.Cloud.WarmIPTarget = 2
		ci := cloudIn(iface("a", 1, 10), iface("b", 2, 10))
		ci.Held = map[netip.Addr]heldAddr{a("10.0.0.50"): lb}
		out := run(nil, p, ci)
		var named []netip.Addr
		for _, op := range out.Cloud.Pools["c"].Plan.Attach {
			named = append(named, op.IPs...)
		}
		if len(named) != 2 || named[0] == a("10.0.0.50") || named[1] == a("10.0.0.50") {
			t.Fatalf("warm attaches %v: want two addresses, not the held 10.0.0.50", named)
		}
		c := meta.FindStatusCondition(out.Pools["c"].Conditions, v1.ConditionReady)
		if c == nil || !strings.Contains(c.Message, "10.0.0.50 by eni-lb") || !out.Cloud.HeldWanted[a("10.0.0.50")] {
			t.Fatalf("pool Ready %+v", c)
		}
	})
}
