package controller

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// bareNode creates a Node with the given status addresses and no agent:
// it is not eligible, it only owns its addresses.
func (cl *cluster) bareNode(name string, addrs ...corev1.NodeAddress) {
	cl.t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := cl.c.Create(cl.ctx, n); err != nil {
		cl.t.Fatal(err)
	}
	cl.t.Cleanup(func() { _ = env.Client.Delete(context.Background(), n) })
	n.Status.Addresses = addrs
	if err := cl.c.Status().Update(cl.ctx, n); err != nil {
		cl.t.Fatal(err)
	}
}

func internalIP(ip string) corev1.NodeAddress {
	return corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip}
}

func externalIP(ip string) corev1.NodeAddress {
	return corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: ip}
}

// setAddresses replaces a Node's status.addresses.
func (cl *cluster) setAddresses(name string, addrs ...corev1.NodeAddress) {
	cl.t.Helper()
	cl.updateNode(name, func(n *corev1.Node) { n.Status.Addresses = addrs }, true)
}

// warningEvent waits for a Warning Event of reason on the Egress (this
// object, by UID: Events of an earlier object of the same name do not
// count) whose note contains every string of want.
func (cl *cluster) warningEvent(egress, reason string, want ...string) {
	cl.t.Helper()
	uid := cl.get(egress).UID
	cl.eventually(reason+" Event on "+egress, func() (bool, string) {
		var evs eventsv1.EventList
		if err := cl.c.List(cl.ctx, &evs); err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, ev := range evs.Items {
			if ev.Regarding.UID != uid || ev.Reason != reason || ev.Type != corev1.EventTypeWarning {
				continue
			}
			if !slices.ContainsFunc(want, func(w string) bool { return !strings.Contains(ev.Note, w) }) {
				return true, ""
			}
			seen = append(seen, ev.Note)
		}
		return false, fmt.Sprintf("Warning %s Events on %s: %q", reason, egress, seen)
	})
}

// TestNodeAddressNeverAllocated: no InternalIP or ExternalIP of any Node is
// allocated from a pool, and the pool's status counts and names them
// (issue 14, build item 3, rules 1 and 3).
func TestNodeAddressNeverAllocated(t *testing.T) {
	cl := newCluster(t, "naalloc", 2, 10)
	// Node n1 (with an agent) lists 192.0.2.1 as its ExternalIP; a Node
	// without an agent lists 192.0.2.2 as InternalIP and 192.0.2.3 as
	// ExternalIP. Node addresses outside the pool change nothing.
	cl.setAddresses("naalloc-n1", internalIP(cl.agents["naalloc-n1"].addr.String()), externalIP("192.0.2.1"))
	cl.bareNode("naalloc-x", internalIP("192.0.2.2"), externalIP("192.0.2.3"), externalIP("198.51.100.77"))
	cl.pool("naalloc", nil)
	cl.eventually("pool status excludes the 3 Node addresses", func() (bool, string) {
		var p v1.ExternalIPPool
		if err := cl.c.Get(cl.ctx, client.ObjectKey{Name: "naalloc"}, &p); err != nil {
			return false, err.Error()
		}
		ready := meta.FindStatusCondition(p.Status.Conditions, v1.ConditionReady)
		want := []v1.ExcludedAddresses{
			{Reason: v1.ExcludedNodeAddress, Count: 3, Message: "addresses of Nodes, never egress IPs: 192.0.2.1 (ExternalIP of Node naalloc-n1), 192.0.2.2 (InternalIP of Node naalloc-x), 192.0.2.3 (ExternalIP of Node naalloc-x)"},
			{Reason: v1.ExcludedReserved, Count: 2, Message: "the gateway and the network, broadcast or Subnet-Router anycast addresses of the ranges and subnet"},
		}
		ok := slices.Equal(p.Status.Excluded, want) && p.Status.Usage.Total == 11 && ready != nil &&
			ready.Status == metav1.ConditionTrue && strings.Contains(ready.Message, "never allocated: 3 Node addresses (see status.excluded)")
		return ok, fmt.Sprintf("excluded %+v usage %+v ready %+v", p.Status.Excluded, p.Status.Usage, ready)
	})
	for _, n := range []string{"naalloc-a", "naalloc-b", "naalloc-c"} {
		cl.egress(n, "naalloc", "")
	}
	got := cl.waitReady("naalloc-a", "naalloc-b", "naalloc-c")
	var ips []string
	for _, e := range got {
		ips = append(ips, e.Status.EgressIP)
	}
	slices.Sort(ips)
	if want := []string{"192.0.2.4", "192.0.2.5", "192.0.2.6"}; !slices.Equal(ips, want) {
		t.Errorf("allocated %v, want %v (the Node addresses 192.0.2.1-3 skipped)", ips, want)
	}
}

// TestNodeAddressJoinsTakesEgressIP: a Node that joins, or changes its
// address, to an address an Egress holds wins. The Egress is bound nowhere,
// reports Assigned=False NodeAddressConflict naming the Node, gets a
// Warning Event, keeps its address and recovers by itself when the
// conflict goes away (issue 14, build item 3, rule 4).
func TestNodeAddressJoinsTakesEgressIP(t *testing.T) {
	cl := newCluster(t, "najoin", 2, 10)
	cl.pool("najoin", nil)
	cl.egress("najoin-alloc", "najoin", "")
	cl.egress("najoin-named", "najoin", "192.0.2.9")
	got := cl.waitReady("najoin-alloc", "najoin-named")
	allocIP := got["najoin-alloc"].Status.EgressIP
	holder := got["najoin-alloc"].Status.EgressNode

	waitConflict := func(name, ip, node, fix string) {
		t.Helper()
		cl.eventually(name+" Assigned=False NodeAddressConflict", func() (bool, string) {
			e := cl.get(name)
			c := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionAssigned)
			ok := c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1.ReasonNodeAddressConflict &&
				strings.Contains(c.Message, ip+" is the InternalIP of Node "+node) && strings.Contains(c.Message, fix) &&
				e.Status.EgressNode == "" && e.Status.EgressIP == ip && !ready(e)
			return ok, describe(e)
		})
	}

	// A Node joins with the allocated address as its InternalIP.
	cl.bareNode("najoin-new", internalIP(allocIP))
	waitConflict("najoin-alloc", allocIP, "najoin-new", "it keeps the address")
	cl.eventually("the former holder's agent releases "+allocIP, func() (bool, string) {
		return !cl.agents[holder].Bound(allocIP), "still bound on " + holder
	})
	cl.warningEvent("najoin-alloc", v1.ReasonNodeAddressConflict, allocIP+" removed from Node "+holder, "InternalIP of Node najoin-new")
	if e := cl.get("najoin-named"); !ready(e) {
		t.Errorf("the other Egress was disturbed: %s", describe(e))
	}

	// The Node changes its address to the named one: the conflict moves.
	cl.setAddresses("najoin-new", internalIP("192.0.2.9"))
	waitConflict("najoin-named", "192.0.2.9", "najoin-new", "change spec.egressIP")
	cl.warningEvent("najoin-named", v1.ReasonNodeAddressConflict, "InternalIP of Node najoin-new")
	e := cl.waitReady("najoin-alloc")["najoin-alloc"]
	if e.Status.EgressIP != allocIP {
		t.Errorf("after the conflict went away najoin-alloc holds %s, want its address %s back", e.Status.EgressIP, allocIP)
	}

	// The Node leaves the pool's range: everything recovers by itself.
	cl.setAddresses("najoin-new", internalIP("198.51.100.9"))
	e = cl.waitReady("najoin-named")["najoin-named"]
	if c := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionAssigned); c == nil || c.Reason != v1.ReasonScheduled {
		t.Errorf("najoin-named Assigned = %+v, want Scheduled", c)
	}
}

// TestNodeAddressOwnEgressIPIsNoConflict: a Node that lists an egress IP it
// holds itself (cloud providers list every address of the interface as an
// InternalIP) keeps it: that is not a conflict.
func TestNodeAddressOwnEgressIPIsNoConflict(t *testing.T) {
	cl := newCluster(t, "naown", 1, 10)
	cl.pool("naown", nil)
	cl.egress("naown-a", "naown", "")
	e := cl.waitReady("naown-a")["naown-a"]
	cl.setAddresses(e.Status.EgressNode, internalIP(cl.agents[e.Status.EgressNode].addr.String()), internalIP(e.Status.EgressIP))
	cl.egress("naown-b", "naown", "")
	b := cl.waitReady("naown-b")["naown-b"]
	if a := cl.get("naown-a"); !ready(a) || a.Status.EgressIP != e.Status.EgressIP {
		t.Errorf("the holder listing its own egress IP disturbed it: %s", describe(a))
	}
	if b.Status.EgressIP == e.Status.EgressIP {
		t.Errorf("naown-b got %s, the address naown-a holds", b.Status.EgressIP)
	}
}

// TestReservedAddressBindingSaysWhy: an Egress whose IP the agent refuses
// does not sit in Ready=False Binding without a reason: Ready says
// BindRefused with the agent's explanation and the Node, with a Warning
// Event, and it turns Ready when the agent binds (issue 15 fault 2).
func TestReservedAddressBindingSaysWhy(t *testing.T) {
	cl := newCluster(t, "nabind", 1, 10)
	cl.pool("nabind", nil)
	ip := netip.MustParseAddr("192.0.2.1")
	const why = "192.0.2.1 is already on the Node and egressip did not add it; it is left alone"
	cl.agents["nabind-n1"].setRefused(ip, why)
	cl.egress("nabind-a", "nabind", "")
	cl.eventually("Ready=False BindRefused", func() (bool, string) {
		e := cl.get("nabind-a")
		c := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionReady)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1.ReasonBindRefused &&
			c.Message == "the agent on Node nabind-n1 does not bind 192.0.2.1: "+why, describe(e)
	})
	cl.warningEvent("nabind-a", v1.ReasonBindRefused, "the agent on Node nabind-n1 does not bind 192.0.2.1")
	cl.agents["nabind-n1"].setRefused(ip, "")
	cl.waitReady("nabind-a")
}

// TestStatusOutsidePoolIsReplaced: a status.egressIP written by hand
// outside the pool is replaced by an address of the pool, with a Warning
// Event that names the bad address (issue 15 fault 3, controller side; the
// agent side is internal/agent TestStatusOutsidePool...).
func TestStatusOutsidePoolIsReplaced(t *testing.T) {
	cl := newCluster(t, "nastatus", 1, 10)
	cl.pool("nastatus", nil)
	cl.egress("nastatus-a", "nastatus", "")
	cl.waitReady("nastatus-a")
	e := cl.get("nastatus-a")
	patch := client.MergeFrom(e.DeepCopy())
	e.Status.EgressIP = "198.51.100.8"
	if err := cl.c.Status().Patch(cl.ctx, e, patch); err != nil {
		t.Fatal(err)
	}
	cl.warningEvent("nastatus-a", v1.ReasonStatusIPRejected, `status.egressIP 198.51.100.8 cannot come from ExternalIPPool "nastatus": IP 198.51.100.8 is in none of the pool's ipRanges`)
	cl.eventually("nastatus-a Ready on 192.0.2.1 again", func() (bool, string) {
		e := cl.get("nastatus-a")
		return ready(e) && e.Status.EgressIP == "192.0.2.1" && cl.agents["nastatus-n1"].Bound("192.0.2.1"), describe(e)
	})
}

// TestReservedAddressInsideRangeNeverAllocated: a pool whose range ends are
// unicast but which spans loopback (admitted before the webhook refused
// such ranges; this suite runs without the webhook) never hands out
// 127.0.0.0/8, says so in status.excluded, and an Egress whose status holds
// a loopback address gets another one with a Warning Event, never staying
// in Binding (issue 15 fault 2).
func TestReservedAddressInsideRangeNeverAllocated(t *testing.T) {
	cl := newCluster(t, "rsvin", 1, 10)
	cl.pool("rsvin", func(p *v1.ExternalIPPool) {
		p.Spec.IPRanges = []v1.IPRange{{Start: "126.255.255.254", End: "128.0.0.1"}}
	})
	for _, n := range []string{"rsvin-a", "rsvin-b", "rsvin-c"} {
		cl.egress(n, "rsvin", "")
	}
	got := cl.waitReady("rsvin-a", "rsvin-b", "rsvin-c")
	var ips []string
	for _, e := range got {
		ips = append(ips, e.Status.EgressIP)
	}
	slices.Sort(ips)
	if want := []string{"126.255.255.254", "126.255.255.255", "128.0.0.0"}; !slices.Equal(ips, want) {
		t.Errorf("allocated %v, want %v (127.0.0.0/8 skipped)", ips, want)
	}
	cl.eventually("pool status counts the loopback block", func() (bool, string) {
		var p v1.ExternalIPPool
		if err := cl.c.Get(cl.ctx, client.ObjectKey{Name: "rsvin"}, &p); err != nil {
			return false, err.Error()
		}
		want := []v1.ExcludedAddresses{{Reason: v1.ExcludedSpecialPurpose, Count: 1 << 24,
			Message: "special-purpose addresses inside the ranges, never egress IPs: loopback 127.0.0.0/8; split the ranges around them"}}
		return slices.Equal(p.Status.Excluded, want) && p.Status.Usage.Total == 4, fmt.Sprintf("excluded %+v usage %+v", p.Status.Excluded, p.Status.Usage)
	})

	e := cl.get("rsvin-c")
	patch := client.MergeFrom(e.DeepCopy())
	e.Status.EgressIP = "127.0.0.0"
	if err := cl.c.Status().Patch(cl.ctx, e, patch); err != nil {
		t.Fatal(err)
	}
	cl.warningEvent("rsvin-c", v1.ReasonStatusIPRejected,
		`status.egressIP 127.0.0.0 cannot come from ExternalIPPool "rsvin": IP 127.0.0.0 is a loopback address (127.0.0.0/8, RFC 1122), which is never allocated`)
	cl.eventually("rsvin-c Ready on an address of the pool", func() (bool, string) {
		e := cl.get("rsvin-c")
		return ready(e) && e.Status.EgressIP != "127.0.0.0" && strings.HasPrefix(e.Status.EgressIP, "12") && cl.agents["rsvin-n1"].Bound(e.Status.EgressIP), describe(e)
	})
}
