package controller

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// Egresses with spec.ips (issue 20) through the reconciler, against a real
// kube-apiserver, with the fake agents of suite_test.go binding what
// status.ips assigns to their Node. plan_multi_test.go has the pure
// tables.

// multiEgress creates an Egress asking for srcs and makes the agents
// read status.ips.
func (cl *cluster) multiEgress(name string, srcs ...v1.EgressIPSource) {
	cl.t.Helper()
	for _, a := range cl.agents {
		a.mu.Lock()
		a.multi = true
		a.mu.Unlock()
	}
	e := &v1.Egress{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.EgressSpec{
		AppliedTo: v1.AppliedTo{PodSelector: &metav1.LabelSelector{}}, IPs: srcs}}
	if err := cl.c.Create(cl.ctx, e); err != nil {
		cl.t.Fatal(err)
	}
	cl.t.Cleanup(func() { _ = cl.c.Delete(cl.ctx, e) })
}

// describeIPs is describe with status.ips and readyIPs.
func describeIPs(e *v1.Egress) string {
	s := describe(e) + " readyIPs=" + e.Status.ReadyIPs
	for _, ip := range e.Status.IPs {
		s += fmt.Sprintf(" [%s@%s zone=%q ready=%v %s]", ip.IP, ip.Node, ip.Zone, ip.Ready, ip.Reason)
	}
	return s
}

// waitReadyIPs waits until name's status reads readyIPs (n/N) with every
// Ready IP bound by its Node's agent, and returns it.
func (cl *cluster) waitReadyIPs(name, readyIPs string) *v1.Egress {
	cl.t.Helper()
	var e *v1.Egress
	cl.eventually(name+" readyIPs "+readyIPs, func() (bool, string) {
		e = cl.get(name)
		if e.Status.ReadyIPs != readyIPs {
			return false, describeIPs(e)
		}
		for _, s := range e.Status.IPs {
			if s.Ready && !cl.agents[s.Node].Bound(s.IP) {
				return false, "agent of " + s.Node + " does not hold " + s.IP
			}
		}
		return true, ""
	})
	return e
}

// events lists the notes of name's Events of the given reason.
func (cl *cluster) events(name, reason string) []string {
	var evs eventsv1.EventList
	if err := cl.c.List(cl.ctx, &evs); err != nil {
		cl.t.Fatal(err)
	}
	var out []string
	for _, ev := range evs.Items {
		if ev.Regarding.Name == name && ev.Reason == reason {
			out = append(out, ev.Note)
		}
	}
	return out
}

// TestMultiIPDistinctNodesReady: 3 IPs over 5 Nodes land on 3 distinct
// Nodes with status.ips filled (lowest addresses, pool, zone), are Ready
// 3/3 once the agents report them bound, and the pool counts them.
func TestMultiIPDistinctNodesReady(t *testing.T) {
	cl := newCluster(t, "mipd", 5, 10)
	for i := 1; i <= 5; i++ {
		cl.updateNode(fmt.Sprintf("mipd-n%d", i), func(n *corev1.Node) { n.Labels[corev1.LabelTopologyZone] = "zz" }, false)
	}
	cl.pool("mipd", nil)
	cl.multiEgress("mipd-a", ipsEntry("mipd", 3, ""))
	e := cl.waitReadyIPs("mipd-a", "3/3")
	nodes := map[string]bool{}
	for k, s := range e.Status.IPs {
		if want := fmt.Sprintf("192.0.2.%d", k+1); s.IP != want || s.Pool != "mipd" || !s.Ready || s.Zone != "zz" {
			t.Errorf("status.ips[%d] = %+v, want %s of mipd, Ready, zone zz", k, s, want)
		}
		nodes[s.Node] = true
	}
	if len(nodes) != 3 {
		t.Errorf("IPs on %d Nodes, want 3: %s", len(nodes), describeIPs(e))
	}
	if e.Status.EgressIP != "192.0.2.1" || e.Status.EgressNode != e.Status.IPs[0].Node {
		t.Errorf("egressIP/egressNode %s/%s, want the first IP's", e.Status.EgressIP, e.Status.EgressNode)
	}
	for _, ct := range []struct{ typ, reason string }{{v1.ConditionIPAllocated, v1.ReasonAllocated}, {v1.ConditionAssigned, v1.ReasonScheduled}, {v1.ConditionReady, v1.ReasonAnnounced}} {
		if c := meta.FindStatusCondition(e.Status.Conditions, ct.typ); c == nil || c.Status != metav1.ConditionTrue || c.Reason != ct.reason {
			t.Errorf("%s = %+v, want True %s", ct.typ, c, ct.reason)
		}
	}
	cl.eventually("pool counts the 3 IPs", func() (bool, string) {
		st := cl.poolStatus("mipd")
		return st.Usage.Used == 3, fmt.Sprintf("%+v", st.Usage)
	})
}

// TestMultiIPNodeLossMovesOnlyItsIP: crashing the Node of one IP moves
// exactly that IP, same address, to a fourth Node; the other two keep
// their Nodes throughout, and a Normal Moved Event names the IP and both
// Nodes.
func TestMultiIPNodeLossMovesOnlyItsIP(t *testing.T) {
	cl := newCluster(t, "mipl", 5, 10)
	cl.pool("mipl", nil)
	cl.multiEgress("mipl-a", ipsEntry("mipl", 3, ""))
	before := cl.waitReadyIPs("mipl-a", "3/3")
	lost := before.Status.IPs[1]
	cl.crash(lost.Node)
	var after *v1.Egress
	cl.eventually("the lost IP is Ready on a fourth Node", func() (bool, string) {
		after = cl.get("mipl-a")
		for k, s := range after.Status.IPs {
			if k != 1 && (s.Node != before.Status.IPs[k].Node || s.IP != before.Status.IPs[k].IP) {
				t.Fatalf("status.ips[%d] changed from %+v to %+v", k, before.Status.IPs[k], s)
			}
		}
		s := after.Status.IPs[1]
		return s.IP == lost.IP && s.Node != "" && s.Node != lost.Node && s.Ready && after.Status.ReadyIPs == "3/3", describeIPs(after)
	})
	to := after.Status.IPs[1].Node
	if to == after.Status.IPs[0].Node || to == after.Status.IPs[2].Node {
		t.Errorf("two IPs on Node %s: %s", to, describeIPs(after))
	}
	want := fmt.Sprintf("%s moved from Node %s to Node %s", lost.IP, lost.Node, to)
	cl.eventually("Moved Event", func() (bool, string) {
		notes := cl.events("mipl-a", v1.EventMoved)
		return slices.ContainsFunc(notes, func(n string) bool { return strings.Contains(n, want) && strings.Count(n, "moved from") == 1 }), fmt.Sprintf("%q", notes)
	})
}

// TestMultiIPFewerNodesThanIPs: 3 IPs over 2 Nodes: every IP has an
// address, 2 are placed and Ready, the third says FewerNodesThanIPs, and
// Assigned is PartlyAssigned saying so.
func TestMultiIPFewerNodesThanIPs(t *testing.T) {
	cl := newCluster(t, "mipf", 2, 10)
	cl.pool("mipf", nil)
	cl.multiEgress("mipf-a", ipsEntry("mipf", 3, ""))
	e := cl.waitReadyIPs("mipf-a", "2/3")
	if s := e.Status.IPs[2]; s.IP == "" || s.Node != "" || s.Reason != v1.ReasonFewerNodesThanIPs {
		t.Errorf("third IP %+v, want an address, no Node, FewerNodesThanIPs", s)
	}
	c := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionAssigned)
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != v1.ReasonPartlyAssigned || !strings.Contains(c.Message, "2 of 3 IPs have a Node") || !strings.Contains(c.Message, v1.ReasonFewerNodesThanIPs) {
		t.Errorf("Assigned %+v", c)
	}
	if r := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionReady); r == nil || r.Reason != v1.ReasonPartlyReady || !strings.HasPrefix(r.Message, "2 of 3 IPs Ready") {
		t.Errorf("Ready %+v", r)
	}
}

// TestMultiIPZones: entries with a zone stay on that zone's Nodes, also
// after one of them is cordoned (its IP moves to the zone's other Node).
func TestMultiIPZones(t *testing.T) {
	cl := newCluster(t, "mipz", 5, 10)
	zone := map[string]string{"mipz-n1": "za", "mipz-n2": "za", "mipz-n3": "za", "mipz-n4": "zb", "mipz-n5": "zb"}
	for n, z := range zone {
		cl.updateNode(n, func(n *corev1.Node) { n.Labels[corev1.LabelTopologyZone] = z }, false)
	}
	cl.pool("mipz", nil)
	cl.multiEgress("mipz-a", ipsEntry("mipz", 2, "za"), ipsEntry("mipz", 1, "zb"))
	want := []string{"za", "za", "zb"}
	e := cl.waitReadyIPs("mipz-a", "3/3")
	for k, s := range e.Status.IPs {
		if zone[s.Node] != want[k] || s.Zone != want[k] {
			t.Errorf("status.ips[%d] %+v: Node of zone %q, want %q", k, s, zone[s.Node], want[k])
		}
	}
	from := e.Status.IPs[0].Node
	cl.updateNode(from, func(n *corev1.Node) { n.Spec.Unschedulable = true }, false)
	cl.eventually("the IP leaves the cordoned Node for its zone's free Node", func() (bool, string) {
		e = cl.get("mipz-a")
		s := e.Status.IPs[0]
		return s.Node != "" && s.Node != from && s.Ready && e.Status.ReadyIPs == "3/3", describeIPs(e)
	})
	for k, s := range e.Status.IPs {
		if zone[s.Node] != want[k] {
			t.Errorf("after the cordon: status.ips[%d] on %s (zone %q), want zone %q", k, s.Node, zone[s.Node], want[k])
		}
	}
}

// TestMultiIPReadyMessage: when one agent stops reporting its IP bound
// (it reports it refused), Ready stays True with PartlyReady and the
// message "2 of 3 IPs Ready", and that IP is not Ready.
func TestMultiIPReadyMessage(t *testing.T) {
	cl := newCluster(t, "mipr", 4, 10)
	cl.pool("mipr", nil)
	cl.multiEgress("mipr-a", ipsEntry("mipr", 3, ""))
	e := cl.waitReadyIPs("mipr-a", "3/3")
	s := e.Status.IPs[2]
	cl.agents[s.Node].setRefused(netip.MustParseAddr(s.IP), "address already in use")
	e = cl.waitReadyIPs("mipr-a", "2/3")
	r := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionReady)
	if r == nil || r.Status != metav1.ConditionTrue || r.Reason != v1.ReasonPartlyReady || !strings.HasPrefix(r.Message, "2 of 3 IPs Ready") {
		t.Errorf("Ready %+v, want True PartlyReady \"2 of 3 IPs Ready\"", r)
	}
	if got := e.Status.IPs[2]; got.Ready || got.Node != s.Node || got.Reason != v1.ReasonBindRefused {
		t.Errorf("refused IP %+v, want not Ready on %s, BindRefused", got, s.Node)
	}
}

// TestMultiIPNamedAddressesKept: named addresses are used first and kept
// with the allocated ones across passes; a younger Egress naming one of
// them gets no address for that IP (NamedIPConflict, Warning Event) while
// its other IP is placed.
func TestMultiIPNamedAddressesKept(t *testing.T) {
	cl := newCluster(t, "mipn", 4, 10)
	cl.pool("mipn", nil)
	cl.multiEgress("mipn-a", ipsEntry("mipn", 3, "", "192.0.2.9", "192.0.2.10"))
	e := cl.waitReadyIPs("mipn-a", "3/3")
	var got []string
	for _, s := range e.Status.IPs {
		got = append(got, s.IP)
	}
	if diff := cmp.Diff([]string{"192.0.2.9", "192.0.2.10", "192.0.2.1"}, got); diff != "" {
		t.Errorf("addresses (-want +got):\n%s", diff)
	}
	time.Sleep(200 * time.Millisecond) // let the other Egress be younger
	cl.multiEgress("mipn-b", ipsEntry("mipn", 2, "", "192.0.2.9"))
	b := cl.waitReadyIPs("mipn-b", "1/2")
	if s := b.Status.IPs[0]; s.IP != "" || s.Reason != v1.ReasonNamedIPConflict {
		t.Errorf("mipn-b IP 1 %+v, want no address, NamedIPConflict", s)
	}
	if c := meta.FindStatusCondition(b.Status.Conditions, v1.ConditionIPAllocated); c == nil || c.Reason != v1.ReasonPartlyAllocated || !strings.Contains(c.Message, "Egress mipn-a") {
		t.Errorf("mipn-b IPAllocated %+v", c)
	}
	cl.eventually("NamedIPConflict Event", func() (bool, string) {
		notes := cl.events("mipn-b", v1.ReasonNamedIPConflict)
		return len(notes) > 0 && strings.Contains(notes[0], "192.0.2.9"), fmt.Sprintf("%q", notes)
	})
	if diff := cmp.Diff(e.Status.IPs, cl.get("mipn-a").Status.IPs); diff != "" {
		t.Errorf("mipn-a changed (-before +after):\n%s", diff)
	}
}

// TestMultiIPControllerRestartMovesNothing: a new controller over the
// statuses the previous one wrote moves no IP and changes no status.
func TestMultiIPControllerRestartMovesNothing(t *testing.T) {
	cl := newCluster(t, "mips", 5, 10)
	cl.pool("mips", nil)
	cl.multiEgress("mips-a", ipsEntry("mips", 3, ""))
	cl.multiEgress("mips-b", ipsEntry("mips", 2, "", "192.0.2.12"))
	before := map[string]v1.EgressStatus{"mips-a": cl.waitReadyIPs("mips-a", "3/3").Status, "mips-b": cl.waitReadyIPs("mips-b", "2/2").Status}
	cl.waitCounted("mips-a", "mips-b") // the selected-Pods count settles
	for name := range before {
		before[name] = cl.get(name).Status
	}
	cl.stopController()
	cl.startController()
	time.Sleep(3 * time.Second) // several polls and passes
	for name, b := range before {
		if diff := cmp.Diff(b, cl.get(name).Status); diff != "" {
			t.Errorf("%s status changed across a controller restart (-before +after):\n%s", name, diff)
		}
	}
	var p v1.ExternalIPPool
	if err := cl.c.Get(cl.ctx, client.ObjectKey{Name: "mips"}, &p); err != nil {
		t.Fatal(err)
	}
	if p.Status.Usage.Used != 5 {
		t.Errorf("pool usage %+v, want 5 used", p.Status.Usage)
	}
}
