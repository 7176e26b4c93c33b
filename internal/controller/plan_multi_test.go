package controller

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/cloud"
)

// Pure table tests of plan for Egresses with spec.ips (issue 20): no API
// server, no agent. multi_test.go runs the same paths through the
// reconciler against envtest.

// multiEgress is an Egress created at second sec asking for srcs.
func multiEgress(name string, sec int, srcs ...v1.EgressIPSource) v1.Egress {
	return v1.Egress{ObjectMeta: metav1.ObjectMeta{Name: name, Generation: 1, CreationTimestamp: metav1.NewTime(time.Unix(int64(1000+sec), 0))},
		Spec: v1.EgressSpec{IPs: srcs}}
}

// ipsEntry is a spec.ips entry of pool asking for n IPs.
func ipsEntry(pool string, n int32, zone string, named ...string) v1.EgressIPSource {
	s := v1.EgressIPSource{Pool: pool, Count: &n, Zone: zone}
	for _, a := range named {
		s.Addresses = append(s.Addresses, v1.EgressIPAddress(a))
	}
	return s
}

// zonedNodes are planNodes n1..nN, each labelled with the zone zones
// gives it (cycled; none when zones is empty).
func zonedNodes(n int, zones ...string) []corev1.Node {
	out := make([]corev1.Node, n)
	for i := range out {
		out[i] = planNode(fmt.Sprintf("n%d", i+1))
		if len(zones) > 0 {
			out[i].Labels[corev1.LabelTopologyZone] = zones[i%len(zones)]
		}
	}
	return out
}

// multiRun is a sequence of passes over one cluster, each pass's statuses
// applied before the next (what the reconciler writes).
type multiRun struct {
	pools  []v1.ExternalIPPool
	egs    []v1.Egress
	nodes  []corev1.Node
	agents func(string) AgentState
}

func (r *multiRun) pass(t *testing.T) passOutput {
	t.Helper()
	out := plan(passInput{Pools: r.pools, Egresses: r.egs, Nodes: r.nodes, Agents: r.agents, Config: PassConfig{DefaultCapacity: 10}})
	for i := range r.egs {
		r.egs[i].Status = out.Egresses[r.egs[i].Name].Status
	}
	for i := range r.pools {
		r.pools[i].Status = out.Pools[r.pools[i].Name]
	}
	return out
}

// boundAsAssigned reports every IP bound on the Node status.ips names.
func (r *multiRun) boundAsAssigned(except ...string) {
	bound := map[string][]string{}
	for _, e := range r.egs {
		for _, s := range e.Status.IPs {
			if s.Node != "" && !slices.Contains(except, s.IP) {
				bound[s.Node] = append(bound[s.Node], s.IP)
			}
		}
		if len(e.Status.IPs) == 0 && e.Status.EgressNode != "" {
			bound[e.Status.EgressNode] = append(bound[e.Status.EgressNode], e.Status.EgressIP)
		}
	}
	for _, ips := range bound {
		// report.Report.Lookup wants them in address order.
		slices.SortFunc(ips, func(a, b string) int { return netip.MustParseAddr(a).Compare(netip.MustParseAddr(b)) })
	}
	r.agents = agents(bound)
}

func (r *multiRun) status(name string) v1.EgressStatus {
	for _, e := range r.egs {
		if e.Name == name {
			return *e.Status.DeepCopy()
		}
	}
	return v1.EgressStatus{}
}

// cond is e's condition typ, or an empty one.
func cond(st v1.EgressStatus, typ string) metav1.Condition {
	if c := meta.FindStatusCondition(st.Conditions, typ); c != nil {
		return *c
	}
	return metav1.Condition{}
}

// ipsOf is "ip@node" for each status.ips entry.
func ipsOf(st v1.EgressStatus) []string {
	var out []string
	for _, s := range st.IPs {
		out = append(out, s.IP+"@"+s.Node)
	}
	return out
}

// TestMultiIPPlanDistinctNodes: 3 IPs of one pool over 5 Nodes get the 3
// lowest addresses on 3 distinct Nodes, Binding until the agents report
// them, then Ready 3/3; a further pass changes nothing and records no
// Event.
func TestMultiIPPlanDistinctNodes(t *testing.T) {
	r := &multiRun{pools: []v1.ExternalIPPool{l2PoolOf("198.51.100.0/28", 0)}, egs: []v1.Egress{multiEgress("m", 1, ipsEntry("l2", 3, ""))},
		nodes: zonedNodes(5, "za"), agents: agents(nil)}
	out := r.pass(t)
	st := r.status("m")
	if len(st.IPs) != 3 {
		t.Fatalf("status.ips %v, want 3 entries", st.IPs)
	}
	nodes := map[string]bool{}
	for k, s := range st.IPs {
		if want := fmt.Sprintf("198.51.100.%d", k+1); s.IP != want || s.Pool != "l2" || s.Node == "" || s.Zone != "za" || s.Ready || s.Reason != v1.ReasonBinding {
			t.Errorf("status.ips[%d] %+v, want %s of l2 on a Node of zone za, Binding", k, s, want)
		}
		nodes[s.Node] = true
	}
	if len(nodes) != 3 {
		t.Errorf("IPs on %v, want 3 distinct Nodes", ipsOf(st))
	}
	if st.EgressIP != st.IPs[0].IP || st.EgressNode != st.IPs[0].Node || st.ReadyIPs != "0/3" {
		t.Errorf("egressIP %s egressNode %s readyIPs %s, want the first entry's and 0/3", st.EgressIP, st.EgressNode, st.ReadyIPs)
	}
	if c := cond(st, v1.ConditionAssigned); c.Reason != v1.ReasonScheduled || c.Status != metav1.ConditionTrue {
		t.Errorf("Assigned %+v", c)
	}
	if c := cond(st, v1.ConditionReady); c.Reason != v1.ReasonBinding || !strings.Contains(c.Message, "0 of 3 IPs Ready") {
		t.Errorf("Ready %+v", c)
	}
	if ch := out.Egresses["m"]; ch.EventReason != v1.EventAssigned || strings.Count(ch.EventNote, "assigned to Node") != 3 {
		t.Errorf("Event %s %q, want Assigned naming the 3 IPs", ch.EventReason, ch.EventNote)
	}
	if u := r.pools[0].Status.Usage.Used; u != 3 {
		t.Errorf("pool usage %d, want 3", u)
	}
	r.boundAsAssigned()
	r.pass(t)
	st = r.status("m")
	if c := cond(st, v1.ConditionReady); st.ReadyIPs != "3/3" || c.Reason != v1.ReasonAnnounced || c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, "3 of 3 IPs Ready") {
		t.Errorf("readyIPs %s, Ready %+v; want 3/3 Announced", st.ReadyIPs, c)
	}
	before := st
	out = r.pass(t)
	if st := r.status("m"); !egressStatusEqual(&before, &st) {
		t.Errorf("a pass over an unchanged cluster changes the status:\n%+v\n%+v", before, st)
	}
	if ch := out.Egresses["m"]; ch.EventReason != "" || ch.IPChangedNote != "" {
		t.Errorf("unchanged pass records Event %s %q / %q", ch.EventReason, ch.EventNote, ch.IPChangedNote)
	}
}

// TestMultiIPPlanNodeLossMovesOne: when the Node of one IP dies, exactly
// that IP moves (same address, another Node that holds no other IP of the
// Egress), the Event names it and both Nodes, and the Egress stays Ready
// 2 of 3 until the new Node reports it.
func TestMultiIPPlanNodeLossMovesOne(t *testing.T) {
	r := &multiRun{pools: []v1.ExternalIPPool{l2PoolOf("198.51.100.0/28", 0)}, egs: []v1.Egress{multiEgress("m", 1, ipsEntry("l2", 3, ""))},
		nodes: zonedNodes(5), agents: agents(nil)}
	r.pass(t)
	r.boundAsAssigned()
	r.pass(t)
	before := r.status("m")
	lost := before.IPs[1]
	bound := map[string][]string{}
	for _, s := range before.IPs {
		bound[s.Node] = append(bound[s.Node], s.IP)
	}
	r.agents = agents(bound, lost.Node)
	out := r.pass(t)
	st := r.status("m")
	for k, s := range st.IPs {
		if s.IP != before.IPs[k].IP {
			t.Errorf("status.ips[%d] address %s, was %s", k, s.IP, before.IPs[k].IP)
		}
		if k != 1 && s != before.IPs[k] {
			t.Errorf("status.ips[%d] %+v changed from %+v", k, s, before.IPs[k])
		}
		if k == 1 && (s.Node == "" || s.Node == lost.Node || s.Node == st.IPs[0].Node || s.Node == st.IPs[2].Node) {
			t.Errorf("lost IP now on %q, want a fourth Node (IPs %v)", s.Node, ipsOf(st))
		}
	}
	ch := out.Egresses["m"]
	if ch.EventReason != v1.EventMoved || !strings.Contains(ch.EventNote, fmt.Sprintf("%s moved from Node %s to Node %s", lost.IP, lost.Node, st.IPs[1].Node)) || strings.Count(ch.EventNote, "moved") != 1 {
		t.Errorf("Event %s %q, want Moved naming %s and both Nodes only", ch.EventReason, ch.EventNote, lost.IP)
	}
	if !strings.HasPrefix(ch.MoveReason, v1.MoveNodeIneligible) {
		t.Errorf("move reason %q", ch.MoveReason)
	}
	if c := cond(st, v1.ConditionReady); st.ReadyIPs != "2/3" || c.Reason != v1.ReasonPartlyReady || c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, "2 of 3 IPs Ready") {
		t.Errorf("readyIPs %s Ready %+v, want 2/3 PartlyReady", st.ReadyIPs, c)
	}
}

// TestMultiIPPlanFewerNodes: 3 IPs over 2 eligible Nodes: all 3 get an
// address, 2 a Node, the third says FewerNodesThanIPs, and Assigned is
// True PartlyAssigned saying how many and why.
func TestMultiIPPlanFewerNodes(t *testing.T) {
	r := &multiRun{pools: []v1.ExternalIPPool{l2PoolOf("198.51.100.0/28", 0)}, egs: []v1.Egress{multiEgress("m", 1, ipsEntry("l2", 3, ""))},
		nodes: zonedNodes(2), agents: agents(nil)}
	out := r.pass(t)
	st := r.status("m")
	if got := ipsOf(st); len(got) != 3 || st.IPs[2].Node != "" || st.IPs[2].Reason != v1.ReasonFewerNodesThanIPs || st.IPs[0].Node == st.IPs[1].Node || st.IPs[2].IP == "" {
		t.Errorf("status.ips %+v, want 3 addresses, 2 on distinct Nodes, the third FewerNodesThanIPs", st.IPs)
	}
	c := cond(st, v1.ConditionAssigned)
	if c.Status != metav1.ConditionTrue || c.Reason != v1.ReasonPartlyAssigned || !strings.Contains(c.Message, "2 of 3 IPs have a Node") || !strings.Contains(c.Message, v1.ReasonFewerNodesThanIPs) {
		t.Errorf("Assigned %+v", c)
	}
	if c := cond(st, v1.ConditionIPAllocated); c.Reason != v1.ReasonAllocated {
		t.Errorf("IPAllocated %+v", c)
	}
	if len(out.Unplaced) != 0 {
		t.Errorf("unplaced %v: a partly assigned Egress has a Node", out.Unplaced)
	}
}

// TestMultiIPPlanZones: an entry with a zone uses only its pool's Nodes
// of that zone, one IP per Node; a zone without Nodes leaves its IP
// NoEligibleNode with the others placed.
func TestMultiIPPlanZones(t *testing.T) {
	r := &multiRun{pools: []v1.ExternalIPPool{l2PoolOf("198.51.100.0/28", 0)},
		egs:   []v1.Egress{multiEgress("m", 1, ipsEntry("l2", 2, "za"), ipsEntry("l2", 1, "zb"), ipsEntry("l2", 1, "zc"))},
		nodes: zonedNodes(6, "za", "zb"), agents: agents(nil)}
	r.pass(t)
	st := r.status("m")
	zone := map[string]string{}
	for _, n := range r.nodes {
		zone[n.Name] = n.Labels[corev1.LabelTopologyZone]
	}
	want := []string{"za", "za", "zb", ""}
	for k, s := range st.IPs {
		if zone[s.Node] != want[k] || s.Zone != want[k] {
			t.Errorf("status.ips[%d] %+v: Node in zone %q, want %q", k, s, zone[s.Node], want[k])
		}
	}
	if st.IPs[0].Node == st.IPs[1].Node {
		t.Errorf("two IPs on Node %s", st.IPs[0].Node)
	}
	if s := st.IPs[3]; s.Reason != v1.ReasonNoEligibleNode || s.IP == "" {
		t.Errorf("zone zc IP %+v, want an address and NoEligibleNode", s)
	}
	if c := cond(st, v1.ConditionAssigned); c.Reason != v1.ReasonPartlyAssigned || !strings.Contains(c.Message, "zone zc") {
		t.Errorf("Assigned %+v, want PartlyAssigned naming zone zc", c)
	}
	// Zone za loses a Node: its IP stays in za, on the other za Node
	// that is free (n5), never in zb.
	r.boundAsAssigned()
	r.pass(t)
	prev := r.status("m")
	r.nodes = slices.DeleteFunc(r.nodes, func(n corev1.Node) bool { return n.Name == prev.IPs[0].Node })
	r.pass(t)
	st = r.status("m")
	for k := range 3 {
		if zone[st.IPs[k].Node] != want[k] {
			t.Errorf("after losing %s: status.ips[%d] on %s (zone %q), want zone %q", prev.IPs[0].Node, k, st.IPs[k].Node, zone[st.IPs[k].Node], want[k])
		}
	}
	if st.IPs[1] != prev.IPs[1] || st.IPs[2] != prev.IPs[2] {
		t.Errorf("IPs of kept Nodes changed: %v -> %v", ipsOf(prev), ipsOf(st))
	}
}

// TestMultiIPPlanReadyMessage: one agent stops reporting its IP: Ready
// stays True, PartlyReady, "2 of 3 IPs Ready", and that IP says Binding.
func TestMultiIPPlanReadyMessage(t *testing.T) {
	r := &multiRun{pools: []v1.ExternalIPPool{l2PoolOf("198.51.100.0/28", 0)}, egs: []v1.Egress{multiEgress("m", 1, ipsEntry("l2", 3, ""))},
		nodes: zonedNodes(5), agents: agents(nil)}
	r.pass(t)
	r.boundAsAssigned()
	r.pass(t)
	gone := r.status("m").IPs[2].IP
	r.boundAsAssigned(gone)
	r.pass(t)
	st := r.status("m")
	c := cond(st, v1.ConditionReady)
	if c.Status != metav1.ConditionTrue || c.Reason != v1.ReasonPartlyReady || !strings.HasPrefix(c.Message, "2 of 3 IPs Ready") || st.ReadyIPs != "2/3" {
		t.Errorf("Ready %+v readyIPs %s, want PartlyReady 2 of 3", c, st.ReadyIPs)
	}
	if s := st.IPs[2]; s.Ready || s.Reason != v1.ReasonBinding || s.Node == "" {
		t.Errorf("status.ips[2] %+v, want Binding on its Node", s)
	}
	// None reported: Ready False, Binding (the IPs have Nodes); no Node at
	// all: NoEgressNode, with the failure policy.
	r.agents = agents(nil)
	r.pass(t)
	if c := cond(r.status("m"), v1.ConditionReady); c.Status != metav1.ConditionFalse || c.Reason != v1.ReasonBinding {
		t.Errorf("Ready %+v with no IP reported, want False Binding", c)
	}
	r.nodes = nil
	out := r.pass(t)
	st = r.status("m")
	if c := cond(st, v1.ConditionReady); c.Reason != v1.ReasonNoEgressNode || !strings.Contains(c.Message, "failurePolicy Fail") || st.EgressNode != "" {
		t.Errorf("Ready %+v egressNode %q without Nodes, want NoEgressNode", c, st.EgressNode)
	}
	if ch := out.Egresses["m"]; ch.EventReason != v1.EventUnassigned || strings.Count(ch.EventNote, "removed from Node") != 3 {
		t.Errorf("Event %s %q, want Unassigned naming the 3 IPs", ch.EventReason, ch.EventNote)
	}
	if out.Unplaced[v1.ReasonNoEligibleNode] != 1 {
		t.Errorf("unplaced %v", out.Unplaced)
	}
}

// TestMultiIPPlanNamed: named addresses come first and are kept; a
// younger Egress naming one of them gets no address for that IP
// (NamedIPConflict, a Warning Event) and its other IPs as usual; a
// single-IP Egress cannot share one either; the status addresses of the
// allocated IPs stay across passes, lowest free first.
func TestMultiIPPlanNamed(t *testing.T) {
	single := l2Egress("single", 3, "", "")
	single.Spec.EgressIP = "198.51.100.9"
	r := &multiRun{pools: []v1.ExternalIPPool{l2PoolOf("198.51.100.0/28", 0)},
		egs: []v1.Egress{
			multiEgress("old", 1, ipsEntry("l2", 2, "", "198.51.100.9")),
			multiEgress("young", 2, ipsEntry("l2", 2, "", "198.51.100.9")),
			single,
		},
		nodes: zonedNodes(4), agents: agents(nil)}
	out := r.pass(t)
	old, young := r.status("old"), r.status("young")
	if old.IPs[0].IP != "198.51.100.9" || old.IPs[1].IP != "198.51.100.1" {
		t.Errorf("old: %v, want the named 198.51.100.9 then 198.51.100.1", ipsOf(old))
	}
	if young.IPs[0].IP != "" || young.IPs[0].Reason != v1.ReasonNamedIPConflict || young.IPs[1].IP != "198.51.100.2" || young.IPs[1].Node == "" {
		t.Errorf("young: %+v, want IP 1 NamedIPConflict, IP 2 198.51.100.2 placed", young.IPs)
	}
	if c := cond(young, v1.ConditionIPAllocated); c.Reason != v1.ReasonPartlyAllocated || c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, "Egress old") {
		t.Errorf("young IPAllocated %+v", c)
	}
	if ch := out.Egresses["young"]; ch.EventReason != v1.ReasonNamedIPConflict || ch.EventType != corev1.EventTypeWarning ||
		!strings.Contains(ch.EventNote, "already used by Egress old") || !strings.Contains(ch.EventNote, "198.51.100.2 assigned to Node") {
		t.Errorf("young's first Event %s %s %q, want the Warning NamedIPConflict naming the placed IP too", ch.EventType, ch.EventReason, ch.EventNote)
	}
	if c := cond(r.status("single"), v1.ConditionIPAllocated); c.Reason != v1.ReasonNamedIPConflict || r.status("single").EgressIP != "" {
		t.Errorf("single IPAllocated %+v ip %q, want NamedIPConflict and no address", c, r.status("single").EgressIP)
	}
	r.boundAsAssigned()
	out = r.pass(t)
	if ch := out.Egresses["young"]; ch.EventReason != "" {
		t.Errorf("young's second Event %s %q, want none (nothing changed)", ch.EventReason, ch.EventNote)
	}
	// A new, older-looking allocation must not take a kept address: add
	// an Egress and check the statuses keep theirs.
	r.egs = append(r.egs, multiEgress("newest", 9, ipsEntry("l2", 1, "")))
	r.pass(t)
	if got := ipsOf(r.status("old")); got[0] != ipsOf(old)[0] || got[1] != ipsOf(old)[1] {
		t.Errorf("old moved: %v -> %v", ipsOf(old), got)
	}
	if ip := r.status("newest").IPs[0].IP; ip != "198.51.100.3" {
		t.Errorf("newest got %s, want the lowest free 198.51.100.3", ip)
	}
	// The conflict goes (old is deleted): young takes its named address
	// with an Event saying its sources changed.
	r.egs = slices.DeleteFunc(r.egs, func(e v1.Egress) bool { return e.Name == "old" })
	r.boundAsAssigned() // old's agent released its IPs
	out = r.pass(t)
	if s := r.status("young").IPs[0]; s.IP != "198.51.100.9" || s.Node == "" {
		t.Errorf("young IP 1 %+v after old is gone, want 198.51.100.9 placed", s)
	}
	if ch := out.Egresses["young"]; !strings.Contains(ch.IPChangedNote, "198.51.100.9") {
		t.Errorf("young IPChangedNote %q", ch.IPChangedNote)
	}
}

// TestMultiIPPlanBadEntry: an entry of a missing pool and one of an
// exhausted pool leave their IPs without an address, the other entry's IPs
// are allocated and placed, and IPAllocated says what is missing.
func TestMultiIPPlanBadEntry(t *testing.T) {
	small := l2PoolOf("198.51.100.16/31", 1) // one usable address? /31: both
	small.Name = "small"
	r := &multiRun{pools: []v1.ExternalIPPool{l2PoolOf("198.51.100.0/28", 0), small},
		egs:   []v1.Egress{multiEgress("m", 1, ipsEntry("absent", 1, ""), ipsEntry("small", 3, ""), ipsEntry("l2", 2, ""))},
		nodes: zonedNodes(8), agents: agents(nil)}
	r.pass(t)
	st := r.status("m")
	if len(st.IPs) != 6 {
		t.Fatalf("status.ips %v, want 6", ipsOf(st))
	}
	if s := st.IPs[0]; s.IP != "" || s.Reason != v1.ReasonPoolNotFound || s.Pool != "absent" {
		t.Errorf("IP 1 %+v, want PoolNotFound", s)
	}
	exhausted := 0
	for _, s := range st.IPs[1:4] {
		if s.Reason == v1.ReasonPoolExhausted && s.IP == "" {
			exhausted++
		}
	}
	total := r.pools[1].Status.Usage.Total
	if exhausted != 3-int(total) {
		t.Errorf("small pool (%d addresses): %d of its 3 IPs exhausted: %+v", total, exhausted, st.IPs[1:4])
	}
	for _, s := range st.IPs[4:] {
		if s.IP == "" || s.Node == "" {
			t.Errorf("l2 IP %+v, want an address and a Node", s)
		}
	}
	c := cond(st, v1.ConditionIPAllocated)
	if c.Reason != v1.ReasonPartlyAllocated || !strings.Contains(c.Message, v1.ReasonPoolNotFound) || !strings.Contains(c.Message, v1.ReasonPoolExhausted) {
		t.Errorf("IPAllocated %+v", c)
	}
	if c := cond(st, v1.ConditionAssigned); c.Reason != v1.ReasonPartlyAssigned {
		t.Errorf("Assigned %+v", c)
	}
}

// TestMultiIPPlanRestartMovesNothing: a new controller (agents not heard
// from yet) over the statuses a previous one wrote changes nothing, and
// once the agents answer, nothing moves either, even with a younger
// Egress competing for the same Nodes.
func TestMultiIPPlanRestartMovesNothing(t *testing.T) {
	r := &multiRun{pools: []v1.ExternalIPPool{l2PoolOf("198.51.100.0/28", 0)},
		egs:   []v1.Egress{multiEgress("m", 1, ipsEntry("l2", 3, "")), multiEgress("k", 2, ipsEntry("l2", 2, ""))},
		nodes: zonedNodes(5), agents: agents(nil)}
	r.pass(t)
	r.boundAsAssigned()
	r.pass(t)
	before := map[string]v1.EgressStatus{"m": r.status("m"), "k": r.status("k")}
	r.agents = func(string) AgentState { return AgentState{} } // a new leader: nothing heard yet
	// The new leader lists the Egresses in another order.
	slices.Reverse(r.egs)
	out := r.pass(t)
	for name, b := range before {
		if st := r.status(name); !egressStatusEqual(&b, &st) {
			t.Errorf("%s after restart:\n%+v\nwas\n%+v", name, st, b)
		}
		if ch := out.Egresses[name]; ch.EventReason != "" {
			t.Errorf("%s Event %s %q after restart", name, ch.EventReason, ch.EventNote)
		}
	}
	r.boundAsAssigned()
	r.pass(t)
	for name, b := range before {
		if st := r.status(name); !egressStatusEqual(&b, &st) {
			t.Errorf("%s once agents answer:\n%+v\nwas\n%+v", name, st, b)
		}
	}
}

// TestMultiIPReleaseInstructions: the polls tell a Node to release an IP
// of a multi-IP Egress that status.ips no longer gives it, and never one
// that status.ips gives it, whichever entry it is.
func TestMultiIPReleaseInstructions(t *testing.T) {
	e := &v1.Egress{ObjectMeta: metav1.ObjectMeta{Name: "m", UID: "u-m", ResourceVersion: "7"}, Status: v1.EgressStatus{
		EgressIP: "192.0.2.1", EgressNode: "a",
		IPs: []v1.EgressIPStatus{{IP: "192.0.2.1", Node: "a"}, {IP: "192.0.2.2", Node: "b"}, {IP: "192.0.2.3"}}}}
	nodes := []corev1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "a"}}, {ObjectMeta: metav1.ObjectMeta{Name: "b"}}, {ObjectMeta: metav1.ObjectMeta{Name: "c"}}}
	bound := map[string][]string{"a": {"192.0.2.1", "192.0.2.2"}, "b": {"192.0.2.2"}, "c": {"192.0.2.3"}}
	got := releaseInstructions([]*v1.Egress{e}, nodes, agents(bound), nil)
	want := map[string]string{"a": "192.0.2.2,u-m,7,m", "c": "192.0.2.3,u-m,7,m"}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for n, w := range want {
		if len(got[n]) != 1 || got[n][0].String() != w {
			t.Errorf("Node %s: got %v, want [%s]", n, got[n], w)
		}
	}
}

// zonedCloud is a cloud pool of subnet (warm target 0) and the Node
// name's interface in that subnet (n numbers its MAC), with secondary
// addresses, the Node labelled with zone.
func zonedCloud(pool, subnet string) v1.ExternalIPPool {
	p := planPool()
	p.Name, p.Spec.Cloud.AWS.SubnetID, p.Spec.Cloud.WarmIPTarget = pool, subnet, 0
	return p
}

func zonedIface(node, subnet string, n int, secondary ...string) cloud.Interface {
	ifc := iface(node, n, 10, secondary...)
	ifc.SubnetID = subnet
	return ifc
}

func zonedNode(name, zone string) corev1.Node {
	n := planNode(name)
	n.Labels[corev1.LabelTopologyZone] = zone
	return n
}

// TestMultiIPPlanCloud: IPs of cloud-backed pools (one per subnet, hence
// per zone) in spec.ips take what a single-IP Egress of such a pool takes:
// a warm address on its own Node's interface (no call, interfaceMAC set),
// a reassigning attach to the new Node's interface when its Node dies
// (only that IP: the other IP and its interface stay untouched), named
// once the cloud has it there; a pool with Elastic IPs is refused.
func TestMultiIPPlanCloud(t *testing.T) {
	pools := []v1.ExternalIPPool{zonedCloud("ca", "subnet-aaaaaaaa"), zonedCloud("cb", "subnet-bbbbbbbb")}
	pools[0].Status.Cloud = &v1.CloudPoolStatus{WarmIPs: []v1.WarmIP{{IP: "10.0.0.5", Node: "a1"}}}
	pools[1].Status.Cloud = &v1.CloudPoolStatus{WarmIPs: []v1.WarmIP{{IP: "10.1.0.5", Node: "b"}}}
	nodes := []corev1.Node{zonedNode("a1", "za"), zonedNode("a2", "za"), zonedNode("b", "zb")}
	m := multiEgress("m", 1, ipsEntry("ca", 1, "za"), ipsEntry("cb", 1, "zb"))
	ci := cloudIn(zonedIface("a1", "subnet-aaaaaaaa", 1, "10.0.0.5"), zonedIface("a2", "subnet-aaaaaaaa", 2), zonedIface("b", "subnet-bbbbbbbb", 3, "10.1.0.5"))
	in := passInput{Pools: pools, Egresses: []v1.Egress{m}, Nodes: nodes, Agents: alive, Config: PassConfig{DefaultCapacity: 10}, Cloud: ci}
	out := plan(in)
	st := out.Egresses["m"].Status
	want := []v1.EgressIPStatus{
		{IP: "10.0.0.5", Pool: "ca", Node: "a1", Zone: "za", InterfaceMAC: "0a:00:00:00:00:01", Reason: v1.ReasonBinding},
		{IP: "10.1.0.5", Pool: "cb", Node: "b", Zone: "zb", InterfaceMAC: "0a:00:00:00:00:03", Reason: v1.ReasonBinding},
	}
	if d := gocmp.Diff(want, st.IPs); d != "" {
		t.Fatalf("status.ips of warm addresses (-want +got):\n%s", d)
	}
	if len(out.Cloud.Attach) != 0 {
		t.Errorf("cloud calls for warm addresses already on their Nodes: %+v", out.Cloud.Attach)
	}
	for _, pl := range []string{"ca", "cb"} {
		if cs := out.Pools[pl].Cloud; cs == nil || cs.Allocated != 1 || cs.Warm != 0 {
			t.Errorf("pool %s cloud status %+v, want 1 allocated, none warm", pl, cs)
		}
	}
	if c := cond(st, v1.ConditionAssigned); c.Reason != v1.ReasonScheduled {
		t.Errorf("Assigned %+v", c)
	}

	// Node a1 dies: only 10.0.0.5 moves, reassigned from a1's interface to
	// a2's (zone za); b keeps 10.1.0.5 and no call touches its interface.
	m.Status = st
	in.Egresses = []v1.Egress{m}
	in.Pools[0].Status, in.Pools[1].Status = out.Pools["ca"], out.Pools["cb"]
	in.Agents = func(n string) AgentState { return AgentState{Known: true, Dead: n == "a1"} }
	out = plan(in)
	st = out.Egresses["m"].Status
	if s := st.IPs[0]; s.IP != "10.0.0.5" || s.Node != "" || s.Reason != v1.ReasonAttaching {
		t.Errorf("moving IP %+v, want 10.0.0.5 without a Node, Attaching", s)
	}
	if s := st.IPs[1]; s.IP != "10.1.0.5" || s.Node != "b" || s.InterfaceMAC != "0a:00:00:00:00:03" {
		t.Errorf("other IP %+v, want it kept on b", s)
	}
	wantOp := []cloudOp{{Node: "a2", InterfaceID: "eni-a2", IPs: []netip.Addr{netip.MustParseAddr("10.0.0.5")}, From: map[netip.Addr]string{netip.MustParseAddr("10.0.0.5"): "eni-a1"}}}
	if d := gocmp.Diff(wantOp, out.Cloud.Attach, gocmp.Comparer(func(a, b netip.Addr) bool { return a == b })); d != "" {
		t.Errorf("attach ops (-want +got):\n%s", d)
	}
	if c := cond(st, v1.ConditionAssigned); c.Reason != v1.ReasonPartlyAssigned || !strings.Contains(c.Message, "attaching 10.0.0.5 to the network interface of Node a2") {
		t.Errorf("Assigned %+v", c)
	}

	// The reassign done (the cloud shows 10.0.0.5 on a2, our call put it
	// there): the IP is named on a2 with a2's MAC.
	m.Status = st
	in.Egresses = []v1.Egress{m}
	in.Pools[0].Status, in.Pools[1].Status = out.Pools["ca"], out.Pools["cb"]
	in.Cloud = cloudIn(zonedIface("a1", "subnet-aaaaaaaa", 1), zonedIface("a2", "subnet-aaaaaaaa", 2, "10.0.0.5"), zonedIface("b", "subnet-bbbbbbbb", 3, "10.1.0.5"))
	in.Cloud.Ours = map[netip.Addr]string{netip.MustParseAddr("10.0.0.5"): "eni-a2"}
	out = plan(in)
	st = out.Egresses["m"].Status
	if s := st.IPs[0]; s.IP != "10.0.0.5" || s.Node != "a2" || s.Zone != "za" || s.InterfaceMAC != "0a:00:00:00:00:02" {
		t.Errorf("moved IP %+v, want 10.0.0.5 on a2 with its MAC", s)
	}
	if len(out.Cloud.Attach) != 0 {
		t.Errorf("attach ops once attached: %+v", out.Cloud.Attach)
	}
	if ch := out.Egresses["m"]; ch.EventReason != v1.EventAssigned || !strings.Contains(ch.EventNote, "10.0.0.5 assigned to Node a2") {
		t.Errorf("Event %s %q", ch.EventReason, ch.EventNote)
	}

}

// TestMultiIPPlanCloudAllocation: an IP of a cloud pool without a warm
// address waits (WaitingForWarmIP) and the warm plan attaches one for it;
// a named address is attached to a Node of its zone, one held by an
// interface not ours is refused (AddressHeld); a pool with Elastic IPs is
// refused (ElasticIPsNotSupported).
func TestMultiIPPlanCloudAllocation(t *testing.T) {
	nodes := []corev1.Node{zonedNode("a1", "za"), zonedNode("a2", "za"), zonedNode("b", "zb")}
	t.Run("no warm address: WaitingForWarmIP, counted in the warm plan's shortfall", func(t *testing.T) {
		m := multiEgress("m", 1, ipsEntry("ca", 1, "za"))
		out := plan(passInput{Pools: []v1.ExternalIPPool{zonedCloud("ca", "subnet-aaaaaaaa")}, Egresses: []v1.Egress{m}, Nodes: nodes, Agents: alive,
			Config: PassConfig{DefaultCapacity: 10}, Cloud: cloudIn(zonedIface("a1", "subnet-aaaaaaaa", 1), zonedIface("a2", "subnet-aaaaaaaa", 2))})
		if s := out.Egresses["m"].Status.IPs[0]; s.IP != "" || s.Reason != v1.ReasonWaitingForWarmIP {
			t.Errorf("IP %+v, want no address, WaitingForWarmIP", s)
		}
		if pl := out.Cloud.Pools["ca"].Plan; pl.Short != 1 || len(pl.Attach) != 1 {
			t.Errorf("warm plan %+v, want one address attached for the waiting IP", pl)
		}
	})

	t.Run("a named address is attached to its Node's interface; a held one is refused", func(t *testing.T) {
		m := multiEgress("m", 1, ipsEntry("ca", 1, "za", "10.0.0.9"), ipsEntry("cb", 1, "zb", "10.1.0.9"))
		ci := cloudIn(zonedIface("a1", "subnet-aaaaaaaa", 1), zonedIface("a2", "subnet-aaaaaaaa", 2), zonedIface("b", "subnet-bbbbbbbb", 3))
		ci.Held = map[netip.Addr]heldAddr{netip.MustParseAddr("10.1.0.9"): {}}
		out := plan(passInput{Pools: []v1.ExternalIPPool{zonedCloud("ca", "subnet-aaaaaaaa"), zonedCloud("cb", "subnet-bbbbbbbb")}, Egresses: []v1.Egress{m},
			Nodes: nodes, Agents: alive, Config: PassConfig{DefaultCapacity: 10}, Cloud: ci})
		st := out.Egresses["m"].Status
		if s := st.IPs[0]; s.IP != "10.0.0.9" || s.Node != "" || s.Reason != v1.ReasonAttaching {
			t.Errorf("named IP %+v, want 10.0.0.9 Attaching", s)
		}
		if len(out.Cloud.Attach) != 1 || out.Cloud.Attach[0].Node == "b" || len(out.Cloud.Attach[0].From) != 0 ||
			!slices.Equal(out.Cloud.Attach[0].IPs, []netip.Addr{netip.MustParseAddr("10.0.0.9")}) {
			t.Errorf("attach ops %+v, want 10.0.0.9 on a zone-a Node, taken from no interface", out.Cloud.Attach)
		}
		if s := st.IPs[1]; s.IP != "" || s.Reason != v1.ReasonAddressHeld {
			t.Errorf("held named IP %+v, want no address, AddressHeld", s)
		}
		if !out.Cloud.HeldWanted[netip.MustParseAddr("10.1.0.9")] {
			t.Errorf("the held address is not kept in the held list: %v", out.Cloud.HeldWanted)
		}
	})

	t.Run("a pool with Elastic IPs is refused, its own Egress served", func(t *testing.T) {
		p := planPool()
		p.Spec.Cloud.AWS.ElasticIPs = &v1.ElasticIPs{AllocationIDs: []string{"eipalloc-0123456789abcdef0"}}
		m := multiEgress("m", 1, ipsEntry("c", 1, ""), ipsEntry("l2", 1, ""))
		out := plan(passInput{Pools: []v1.ExternalIPPool{p, l2PoolOf("198.51.100.0/28", 0)}, Egresses: []v1.Egress{m, planEgress("single", "", "", 2)},
			Nodes: []corev1.Node{planNode("a"), planNode("b")}, Agents: alive, Config: PassConfig{DefaultCapacity: 10},
			Cloud: cloudIn(iface("a", 1, 10), iface("b", 2, 10))})
		st := out.Egresses["m"].Status
		if s := st.IPs[0]; s.IP != "" || s.Reason != v1.ReasonElasticIPsNotSupported || s.Pool != "c" {
			t.Errorf("cloud entry %+v, want no address, ElasticIPsNotSupported", s)
		}
		if s := st.IPs[1]; s.IP != "198.51.100.1" || s.Node == "" {
			t.Errorf("l2 entry %+v, want 198.51.100.1 on a Node", s)
		}
		if c := cond(st, v1.ConditionIPAllocated); c.Reason != v1.ReasonPartlyAllocated || !strings.Contains(c.Message, "elasticIPs") {
			t.Errorf("IPAllocated %+v", c)
		}
		if c := cond(out.Egresses["single"].Status, v1.ConditionIPAllocated); c.Reason == v1.ReasonElasticIPsNotSupported {
			t.Errorf("the single-IP Egress of the cloud pool got %+v", c)
		}
	})
}
