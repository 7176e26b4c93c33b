package controller

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/report"
)

// TestNodeVLANCondition: an agent started with --create-vlans reports its
// VLAN sub-interfaces; the controller mirrors them in the Node condition
// EgressVLANLinksReady. A missing parent turns it False with reason
// VLANParentMissing naming the IP, the VLAN ID and the parent, with a
// Warning Event on the Node, while the Egress of that IP is
// Ready=False BindRefused (the Egress condition is kept); a foreign link
// then changes the reason and the message to name that link; once the
// sub-interface is in place the condition is True naming it, with a
// Normal Event, and the Egress is Ready. A Node whose agent reports no
// VLAN status gets no condition.
func TestNodeVLANCondition(t *testing.T) {
	cl := newCluster(t, "vlc", 2, 4)
	node, other := "vlc-n1", "vlc-n2"
	cond := func() (corev1.NodeCondition, bool) { return nodeCondition(t, cl, node, v1.NodeConditionVLANs) }
	cl.pool("vlc", nil)
	cl.egress("vlc-a", "vlc", "")
	var ip netip.Addr
	cl.eventually("egress IP assigned", func() (bool, string) {
		e := cl.get("vlc-a")
		if e.Status.EgressIP == "" {
			return false, describe(e)
		}
		ip = netip.MustParseAddr(e.Status.EgressIP)
		return true, ""
	})
	holder := cl.get("vlc-a").Status.EgressNode
	if holder != node {
		node, other = other, node
	}
	a := cl.agents[node]

	missing := "sync: bind " + ip.String() + `: pool of egress IP ` + ip.String() + `: VLAN 100: parent "bond7": ` +
		"VLAN parent interface does not exist on this Node"
	a.setRefused(ip, missing)
	a.setVLANs(&report.VLANStatus{Problems: []report.VLANProblem{{IP: ip, VLAN: 100, Parent: "bond7",
		Reason: v1.ReasonVLANParentMissing, Message: missing}}})
	cl.eventually("condition False naming the parent", func() (bool, string) {
		c, ok := cond()
		return ok && c.Status == corev1.ConditionFalse && c.Reason == v1.ReasonVLANParentMissing &&
			strings.Contains(c.Message, "egress IP "+ip.String()+", VLAN 100, parent bond7") &&
			strings.Contains(c.Message, "does not exist on this Node"), fmt.Sprintf("%+v", c)
	})
	cl.eventually("Warning Event on the Node", func() (bool, string) {
		for _, ev := range nodeWarnings(t, cl, node, v1.ReasonVLANParentMissing) {
			return ev.Regarding.Kind == "Node" && strings.Contains(ev.Note, "bond7"), ev.Note
		}
		return false, "no event"
	})
	cl.eventually("the Egress keeps its own condition", func() (bool, string) {
		e := cl.get("vlc-a")
		c := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionReady)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1.ReasonBindRefused &&
			strings.Contains(c.Message, node) && strings.Contains(c.Message, "bond7"), describe(e)
	})
	first, _ := cond()

	foreign := "sync: bind " + ip.String() + ": pool of egress IP " + ip.String() + ": VLAN 100 on eth0: " +
		`a VLAN sub-interface egressip did not create already carries this VLAN ID: eth0.100 (alias "") is left alone`
	a.setRefused(ip, foreign)
	a.setVLANs(&report.VLANStatus{Problems: []report.VLANProblem{{IP: ip, VLAN: 100, Parent: "eth0", Link: "eth0.100",
		Reason: v1.ReasonVLANForeignLink, Message: foreign}}})
	cl.eventually("condition False naming the foreign link", func() (bool, string) {
		c, ok := cond()
		return ok && c.Status == corev1.ConditionFalse && c.Reason == v1.ReasonVLANForeignLink &&
			strings.Contains(c.Message, "parent eth0, held by link eth0.100"), fmt.Sprintf("%+v", c)
	})
	if c, _ := cond(); !c.LastTransitionTime.Equal(&first.LastTransitionTime) {
		t.Errorf("transition time moved on a False -> False change: %v then %v", first.LastTransitionTime, c.LastTransitionTime)
	}
	if n := len(nodeWarnings(t, cl, node, v1.ReasonVLANForeignLink)); n != 0 {
		t.Errorf("%d Warning Events for a change of reason within False; want one per turn to False", n)
	}

	a.setRefused(ip, "")
	a.setVLANs(&report.VLANStatus{Links: []string{"egv2.100"}})
	cl.eventually("condition True naming the link", func() (bool, string) {
		c, ok := cond()
		return ok && c.Status == corev1.ConditionTrue && c.Reason == v1.ReasonVLANLinksReady && strings.Contains(c.Message, "egv2.100"),
			fmt.Sprintf("%+v", c)
	})
	cl.eventually("Normal Event", func() (bool, string) {
		for _, ev := range nodeEvents(t, cl, node, v1.ReasonVLANLinksReady) {
			return ev.Type == corev1.EventTypeNormal && strings.Contains(ev.Note, "egv2.100"), ev.Note
		}
		return false, "no event"
	})
	cl.waitReady("vlc-a")
	if c, ok := nodeCondition(t, cl, other, v1.NodeConditionVLANs); ok {
		t.Errorf("Node whose agent reports no VLAN status got the condition: %+v", c)
	}
}

// TestVLANConditionMessage: the condition's message names every problem
// (IP, VLAN ID, parent, foreign link, reason, the agent's error) and the
// count of those the report left out; the reason is the first problem's.
func TestVLANConditionMessage(t *testing.T) {
	st := &report.VLANStatus{More: 3, Problems: []report.VLANProblem{
		{IP: netip.MustParseAddr("198.51.100.50"), VLAN: 100, Parent: "eth0", Link: "eth0.100", Reason: v1.ReasonVLANForeignLink, Message: "m1"},
		{IP: netip.MustParseAddr("198.51.100.51"), VLAN: 200, Parent: "eth1", Reason: v1.ReasonVLANConflict, Message: "m2"},
	}}
	c := vlanCondition(st)
	want := "5 egress IP(s) of this Node are not bound because their VLAN sub-interface cannot be had: " +
		"egress IP 198.51.100.50, VLAN 100, parent eth0, held by link eth0.100 (VLANForeignLink): m1; " +
		"egress IP 198.51.100.51, VLAN 200, parent eth1 (VLANConflict): m2; and 3 more"
	if c.Status != corev1.ConditionFalse || c.Reason != v1.ReasonVLANForeignLink || c.Message != want {
		t.Errorf("got %s %s %q\nwant False VLANForeignLink %q", c.Status, c.Reason, c.Message, want)
	}
	if c := vlanCondition(&report.VLANStatus{}); c.Status != corev1.ConditionTrue || !strings.Contains(c.Message, "needs a VLAN") {
		t.Errorf("no VLAN needed: %+v", c)
	}
	long := &report.VLANStatus{Problems: []report.VLANProblem{{IP: netip.MustParseAddr("198.51.100.50"), VLAN: 1,
		Reason: v1.ReasonVLANLinkFailed, Message: strings.Repeat("x", 2*maxNodeConditionMessage)}}}
	if c := vlanCondition(long); len(c.Message) != maxNodeConditionMessage {
		t.Errorf("message of %d bytes, want it cut to %d", len(c.Message), maxNodeConditionMessage)
	}
}

// nodeEvents returns the Events of any type with reason recorded on Node
// node, failing the test when they cannot be listed.
func nodeEvents(t *testing.T, cl *cluster, node, reason string) []eventsv1.Event {
	t.Helper()
	var evs eventsv1.EventList
	if err := cl.c.List(cl.ctx, &evs); err != nil {
		t.Fatal(err)
	}
	var out []eventsv1.Event
	for _, ev := range evs.Items {
		if ev.Regarding.Name == node && ev.Reason == reason {
			out = append(out, ev)
		}
	}
	return out
}
