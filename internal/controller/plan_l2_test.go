package controller

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/report"
	"github.com/egressip/egressip/internal/scheduler"
)

// Pure table tests of plan for pools on a shared L2 segment: no API
// server, no agent. The envtest suite (pass_test.go) covers the same
// paths through the reconciler.

// l2PoolOf is an ExternalIPPool "l2" of the given CIDR, created at second sec.
func l2PoolOf(cidr string, sec int) v1.ExternalIPPool {
	return v1.ExternalIPPool{ObjectMeta: metav1.ObjectMeta{Name: "l2", Generation: 1, CreationTimestamp: metav1.NewTime(time.Unix(int64(900+sec), 0))},
		Spec: v1.ExternalIPPoolSpec{IPRanges: []v1.IPRange{{CIDR: cidr}}}}
}

// l2Egress is an Egress of pool "l2" created at second sec, with the
// given status address and Node.
func l2Egress(name string, sec int, statusIP, statusNode string) v1.Egress {
	return v1.Egress{ObjectMeta: metav1.ObjectMeta{Name: name, Generation: 1, CreationTimestamp: metav1.NewTime(time.Unix(int64(1000+sec), 0))},
		Spec:   v1.EgressSpec{ExternalIPPool: "l2"},
		Status: v1.EgressStatus{EgressIP: statusIP, EgressNode: statusNode}}
}

// nodeAt is planNode with an InternalIP.
func nodeAt(name, ip string) corev1.Node {
	n := planNode(name)
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}
	return n
}

// agents answers for each Node as known and alive, reporting bound (and
// announced) the addresses listed for it; dead Nodes are dead.
func agents(bound map[string][]string, dead ...string) func(string) AgentState {
	return func(node string) AgentState {
		if slices.Contains(dead, node) {
			return AgentState{Known: true, Dead: true}
		}
		st := AgentState{Known: true, Report: report.Report{Node: node}}
		for _, ip := range bound[node] {
			st.Report.Bound = append(st.Report.Bound, report.BoundIP{IP: netip.MustParseAddr(ip), Interface: "eth0", Announced: true})
		}
		return st
	}
}

// want is what a case expects of one Egress: ip and node must match ("":
// none); a condition reason or message substring left "" is not checked.
type want struct {
	ip, node                        string
	allocated, assigned, ready      string // condition reasons
	event                           string // Event reason ("" = none)
	moveReason                      string
	allocMsg, assignedMsg, readyMsg string // substrings of the messages
}

func TestPlanL2(t *testing.T) {
	notReady := planNode("n1")
	notReady.Status.Conditions[0].Status = corev1.ConditionFalse
	cordoned := planNode("n1")
	cordoned.Spec.Unschedulable = true
	oneSlot := planNode("n1")
	oneSlot.Annotations = map[string]string{scheduler.CapacityAnnotation: "1"}
	named := func(e v1.Egress, ip string) v1.Egress { e.Spec.EgressIP = ip; return e }

	cases := []struct {
		name     string
		pools    []v1.ExternalIPPool
		egresses []v1.Egress
		nodes    []corev1.Node
		agents   func(string) AgentState
		want     map[string]want
		unplaced map[string]int
		// awaited are the Nodes the pass awaits, sorted.
		awaited []string
		// spread: the Nodes' loads differ by at most one, and the pass
		// awaits each Egress's Node (awaited is not checked).
		spread bool
	}{{
		name:  "fresh Egresses get the lowest free addresses, oldest first, and spread over the Nodes",
		pools: []v1.ExternalIPPool{l2PoolOf("198.51.100.0/29", 0)},
		// b is older than a: it gets .1.
		egresses: []v1.Egress{l2Egress("a", 2, "", ""), l2Egress("b", 1, "", ""), l2Egress("c", 3, "", "")},
		nodes:    []corev1.Node{planNode("n1"), planNode("n2")},
		agents:   agents(nil),
		want: map[string]want{
			"b": {ip: "198.51.100.1", node: anyNode, allocated: v1.ReasonAllocated, assigned: v1.ReasonScheduled, ready: v1.ReasonBinding, event: "Assigned"},
			"a": {ip: "198.51.100.2", node: anyNode, allocated: v1.ReasonAllocated, assigned: v1.ReasonScheduled, ready: v1.ReasonBinding, event: "Assigned"},
			"c": {ip: "198.51.100.3", node: anyNode, allocated: v1.ReasonAllocated, assigned: v1.ReasonScheduled, ready: v1.ReasonBinding, event: "Assigned"},
		},
		unplaced: map[string]int{},
		spread:   true,
	}, {
		name:     "an Egress bound and announced on its Node stays there and is Ready, though another Node is empty",
		pools:    []v1.ExternalIPPool{l2PoolOf("198.51.100.0/29", 0)},
		egresses: []v1.Egress{l2Egress("a", 1, "198.51.100.5", "n2"), l2Egress("b", 2, "198.51.100.6", "n2")},
		nodes:    []corev1.Node{planNode("n1"), planNode("n2"), planNode("n3")},
		agents:   agents(map[string][]string{"n2": {"198.51.100.5", "198.51.100.6"}}),
		want: map[string]want{
			"a": {ip: "198.51.100.5", node: "n2", allocated: v1.ReasonAllocated, assigned: v1.ReasonScheduled, ready: v1.ReasonAnnounced},
			"b": {ip: "198.51.100.6", node: "n2", allocated: v1.ReasonAllocated, assigned: v1.ReasonScheduled, ready: v1.ReasonAnnounced},
		},
		unplaced: map[string]int{},
	}, {
		name:     "a Node whose agent died loses its Egress to another Node at once",
		pools:    []v1.ExternalIPPool{l2PoolOf("198.51.100.0/29", 0)},
		egresses: []v1.Egress{l2Egress("a", 1, "198.51.100.1", "n1")},
		nodes:    []corev1.Node{planNode("n1"), planNode("n2")},
		agents:   agents(nil, "n1"),
		want: map[string]want{
			"a": {ip: "198.51.100.1", node: "n2", allocated: v1.ReasonAllocated, assigned: v1.ReasonScheduled, ready: v1.ReasonBinding, event: "Moved", moveReason: "NodeIneligible/" + v1.IneligibleAgentDead},
		},
		unplaced: map[string]int{},
		awaited:  []string{"n2"},
	}, {
		name:     "a Node that went NotReady with its agent alive must release the address before it moves",
		pools:    []v1.ExternalIPPool{l2PoolOf("198.51.100.0/29", 0)},
		egresses: []v1.Egress{l2Egress("a", 1, "198.51.100.1", "n1")},
		nodes:    []corev1.Node{notReady, planNode("n2")},
		agents:   agents(map[string][]string{"n1": {"198.51.100.1"}}),
		want: map[string]want{
			"a": {ip: "198.51.100.1", node: "", assigned: v1.ReasonWaitingForRelease, ready: v1.ReasonNoEgressNode, event: "Releasing",
				assignedMsg: "waiting for Node n1 to release 198.51.100.1"},
		},
		unplaced: map[string]int{},
		awaited:  []string{"n1"},
	}, {
		name:     "a cordoned Node that no longer reports the address hands it over in the same pass",
		pools:    []v1.ExternalIPPool{l2PoolOf("198.51.100.0/29", 0)},
		egresses: []v1.Egress{l2Egress("a", 1, "198.51.100.1", "n1")},
		nodes:    []corev1.Node{cordoned, planNode("n2")},
		agents:   agents(nil),
		want: map[string]want{
			"a": {ip: "198.51.100.1", node: "n2", assigned: v1.ReasonScheduled, ready: v1.ReasonBinding, event: "Moved", moveReason: "NodeIneligible/" + v1.IneligibleCordoned},
		},
		unplaced: map[string]int{},
		awaited:  []string{"n2"},
	}, {
		name:     "a Node that left the cluster: its Egress moves (its agent is gone)",
		pools:    []v1.ExternalIPPool{l2PoolOf("198.51.100.0/29", 0)},
		egresses: []v1.Egress{l2Egress("a", 1, "198.51.100.1", "gone")},
		nodes:    []corev1.Node{planNode("n2")},
		agents:   agents(nil, "gone"),
		want: map[string]want{
			"a": {ip: "198.51.100.1", node: "n2", assigned: v1.ReasonScheduled, event: "Moved"},
		},
		unplaced: map[string]int{},
		awaited:  []string{"n2"},
	}, {
		// A /30 gives .1 and .2 (network and broadcast are never allocated).
		name:     "pool exhausted: the youngest Egress waits with PoolExhausted, the others keep their addresses",
		pools:    []v1.ExternalIPPool{l2PoolOf("198.51.100.0/30", 0)},
		egresses: []v1.Egress{l2Egress("old", 1, "", ""), l2Egress("mid", 2, "", ""), l2Egress("young", 3, "", "")},
		nodes:    []corev1.Node{planNode("n1")},
		agents:   agents(nil),
		want: map[string]want{
			"old": {ip: "198.51.100.1", node: "n1", allocated: v1.ReasonAllocated},
			"mid": {ip: "198.51.100.2", node: "n1", allocated: v1.ReasonAllocated},
			"young": {ip: "", node: "", allocated: v1.ReasonPoolExhausted, assigned: v1.ReasonNotAssigned, ready: v1.ReasonNoEgressNode, event: v1.ReasonNoEgressNode, allocMsg: "(2 of 2 used)",
				readyMsg: `no egress IP is allocated (IPAllocated PoolExhausted: ExternalIPPool "l2" has no free IP (2 of 2 used)`},
		},
		unplaced: map[string]int{v1.ReasonPoolExhausted: 1},
		awaited:  []string{"n1", "n1"},
	}, {
		name:  "named addresses: in the pool it is reserved, outside it is refused, a Node's address conflicts",
		pools: []v1.ExternalIPPool{l2PoolOf("198.51.100.0/29", 0)},
		egresses: []v1.Egress{
			// "free" is older than "named" but named keeps .1.
			l2Egress("free", 0, "", ""),
			named(l2Egress("named", 1, "", ""), "198.51.100.1"),
			named(l2Egress("outside", 2, "", ""), "203.0.113.9"),
			named(l2Egress("nodeip", 3, "", ""), "198.51.100.6"),
		},
		nodes:  []corev1.Node{nodeAt("n1", "198.51.100.6")},
		agents: agents(nil),
		want: map[string]want{
			"named":   {ip: "198.51.100.1", node: "n1", allocated: v1.ReasonAllocated, allocMsg: "named in spec"},
			"free":    {ip: "198.51.100.2", node: "n1", allocated: v1.ReasonAllocated},
			"outside": {ip: "", node: "", allocated: v1.ReasonIPOutsidePool, assigned: v1.ReasonNotAssigned, ready: v1.ReasonNoEgressNode, allocMsg: "203.0.113.9", readyMsg: "IPAllocated IPOutsidePool"},
			"nodeip": {ip: "198.51.100.6", node: "", allocated: v1.ReasonAllocated, assigned: v1.ReasonNodeAddressConflict, ready: v1.ReasonNoEgressNode,
				event: v1.ReasonNodeAddressConflict, assignedMsg: "n1"},
		},
		unplaced: map[string]int{v1.ReasonIPOutsidePool: 1, v1.ReasonNodeAddressConflict: 1},
		awaited:  []string{"n1", "n1"},
	}, {
		name:     "a status address outside the pool is replaced by the lowest free one",
		pools:    []v1.ExternalIPPool{l2PoolOf("198.51.100.0/29", 0)},
		egresses: []v1.Egress{l2Egress("a", 1, "203.0.113.7", "")},
		nodes:    []corev1.Node{planNode("n1")},
		agents:   agents(nil),
		want: map[string]want{
			"a": {ip: "198.51.100.1", node: "n1", allocated: v1.ReasonAllocated, assigned: v1.ReasonScheduled, event: "Assigned"},
		},
		unplaced: map[string]int{},
		awaited:  []string{"n1"},
	}, {
		name:     "a missing pool and an overlapping newer pool give no address",
		pools:    []v1.ExternalIPPool{l2PoolOf("198.51.100.0/29", 0), func() v1.ExternalIPPool { p := l2PoolOf("198.51.100.0/28", 5); p.Name = "newer"; return p }()},
		egresses: []v1.Egress{other(l2Egress("nopool", 1, "", ""), "absent"), other(l2Egress("overlap", 2, "", ""), "newer")},
		nodes:    []corev1.Node{planNode("n1")},
		agents:   agents(nil),
		want: map[string]want{
			"nopool":  {allocated: v1.ReasonPoolNotFound, assigned: v1.ReasonNotAssigned, ready: v1.ReasonNoEgressNode, allocMsg: `"absent" does not exist`},
			"overlap": {allocated: v1.ReasonPoolInvalid, assigned: v1.ReasonNotAssigned, ready: v1.ReasonNoEgressNode, allocMsg: `overlaps ExternalIPPool "l2"`},
		},
		unplaced: map[string]int{v1.ReasonPoolNotFound: 1, v1.ReasonPoolInvalid: 1},
	}, {
		name:     "a full Node: the younger Egress is CapacityExhausted",
		pools:    []v1.ExternalIPPool{l2PoolOf("198.51.100.0/29", 0)},
		egresses: []v1.Egress{l2Egress("a", 1, "", ""), l2Egress("b", 2, "", "")},
		nodes:    []corev1.Node{oneSlot},
		agents:   agents(nil),
		want: map[string]want{
			"a": {ip: "198.51.100.1", node: "n1", assigned: v1.ReasonScheduled},
			"b": {ip: "198.51.100.2", node: "", assigned: v1.ReasonCapacityExhausted, ready: v1.ReasonNoEgressNode, assignedMsg: "max-egress-ips"},
		},
		unplaced: map[string]int{v1.ReasonCapacityExhausted: 1},
		awaited:  []string{"n1"},
	}, {
		name:     "no eligible Node: the message counts why each matching Node cannot hold it",
		pools:    []v1.ExternalIPPool{l2PoolOf("198.51.100.0/29", 0)},
		egresses: []v1.Egress{l2Egress("a", 1, "", "")},
		nodes:    []corev1.Node{notReady, func() corev1.Node { n := planNode("n2"); n.Spec.Unschedulable = true; return n }()},
		agents:   agents(nil),
		want: map[string]want{
			"a": {ip: "198.51.100.1", node: "", assigned: v1.ReasonNoEligibleNode, ready: v1.ReasonNoEgressNode,
				assignedMsg: "2 of 2 Nodes match the nodeSelector of pool \"l2\", none can hold an IP: 1 Cordoned, 1 NotReady"},
		},
		unplaced: map[string]int{v1.ReasonNoEligibleNode: 1},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := plan(passInput{Pools: tc.pools, Egresses: tc.egresses, Nodes: tc.nodes, Agents: tc.agents, Config: PassConfig{DefaultCapacity: 10}})
			if len(out.Egresses) != len(tc.egresses) {
				t.Fatalf("%d Egress changes for %d Egresses", len(out.Egresses), len(tc.egresses))
			}
			for name, w := range tc.want {
				ch, ok := out.Egresses[name]
				if !ok {
					t.Fatalf("no outcome for %s", name)
				}
				checkL2(t, name, ch, w)
			}
			if fmt.Sprint(out.Unplaced) != fmt.Sprint(tc.unplaced) {
				t.Errorf("unplaced %v, want %v", out.Unplaced, tc.unplaced)
			}
			if tc.spread {
				load := map[string]int{}
				for _, n := range tc.nodes {
					load[n.Name] = 0
				}
				for _, ch := range out.Egresses {
					load[ch.Status.EgressNode]++
				}
				lo, hi := len(tc.egresses), 0
				for _, l := range load {
					lo, hi = min(lo, l), max(hi, l)
				}
				if hi-lo > 1 {
					t.Errorf("loads %v are not spread", load)
				}
				tc.awaited = nil
				for _, ch := range out.Egresses {
					tc.awaited = append(tc.awaited, ch.Status.EgressNode)
				}
				slices.Sort(tc.awaited)
			}
			if slices.Sort(out.Awaited); fmt.Sprint(out.Awaited) != fmt.Sprint(tc.awaited) {
				t.Errorf("awaited %v, want %v", out.Awaited, tc.awaited)
			}
		})
	}
}

// anyNode in want.node accepts any Node, not none.
const anyNode = "*"

// checkL2 compares one Egress's outcome with w.
func checkL2(t *testing.T, name string, ch egressChange, w want) {
	t.Helper()
	st := ch.Status
	if st.EgressIP != w.ip {
		t.Errorf("%s: egressIP %q, want %q", name, st.EgressIP, w.ip)
	}
	if w.node == anyNode && st.EgressNode == "" || w.node != anyNode && st.EgressNode != w.node {
		t.Errorf("%s: egressNode %q, want %q", name, st.EgressNode, w.node)
	}
	for _, c := range []struct{ typ, reason, msg string }{
		{v1.ConditionIPAllocated, w.allocated, w.allocMsg}, {v1.ConditionAssigned, w.assigned, w.assignedMsg}, {v1.ConditionReady, w.ready, w.readyMsg},
	} {
		if c.reason == "" && c.msg == "" {
			continue
		}
		got := meta.FindStatusCondition(st.Conditions, c.typ)
		if got == nil {
			t.Errorf("%s: no condition %s", name, c.typ)
			continue
		}
		if c.reason != "" && got.Reason != c.reason {
			t.Errorf("%s: %s reason %s (%s), want %s", name, c.typ, got.Reason, got.Message, c.reason)
		}
		if !strings.Contains(got.Message, c.msg) {
			t.Errorf("%s: %s message %q lacks %q", name, c.typ, got.Message, c.msg)
		}
		if got.ObservedGeneration != 1 {
			t.Errorf("%s: %s observedGeneration %d, want 1", name, c.typ, got.ObservedGeneration)
		}
	}
	if w.event != "" && ch.EventReason != w.event {
		t.Errorf("%s: Event %s (%s), want %s", name, ch.EventReason, ch.EventNote, w.event)
	}
	if w.moveReason != "" && ch.MoveReason != w.moveReason {
		t.Errorf("%s: move reason %q, want %q", name, ch.MoveReason, w.moveReason)
	}
}

// TestPlanL2WritesOnlyOnChange: a second pass over the statuses the first
// one decided (what the reconciler writes) decides the same statuses, so
// the reconciler writes nothing (equality.Semantic.DeepEqual, as in
// PassReconciler.Reconcile), records no Event, and keeps every
// condition's lastTransitionTime.
func TestPlanL2WritesOnlyOnChange(t *testing.T) {
	pools := []v1.ExternalIPPool{l2PoolOf("198.51.100.0/30", 0)}
	egs := []v1.Egress{l2Egress("a", 1, "", ""), l2Egress("b", 2, "", ""), l2Egress("full", 3, "", ""), other(l2Egress("lost", 4, "", ""), "absent")}
	nodes := []corev1.Node{planNode("n1"), planNode("n2")}
	run := func(ag func(string) AgentState) passOutput {
		return plan(passInput{Pools: pools, Egresses: egs, Nodes: nodes, Agents: ag, Config: PassConfig{DefaultCapacity: 10}})
	}
	apply := func(out passOutput) {
		for i := range egs {
			egs[i].Status = out.Egresses[egs[i].Name].Status
		}
		pools[0].Status = out.Pools["l2"]
	}
	first := run(agents(nil))
	apply(first)
	// The agents now report what was assigned: one more change (Ready).
	bound := map[string][]string{}
	for _, e := range egs {
		if e.Status.EgressNode != "" {
			bound[e.Status.EgressNode] = append(bound[e.Status.EgressNode], e.Status.EgressIP)
		}
	}
	ag := agents(bound)
	second := run(ag)
	for _, e := range egs {
		ch := second.Egresses[e.Name]
		wantReady := e.Status.EgressNode != ""
		if got := meta.IsStatusConditionTrue(ch.Status.Conditions, v1.ConditionReady); got != wantReady {
			t.Errorf("%s Ready=%v, want %v", e.Name, got, wantReady)
		}
	}
	apply(second)
	before := map[string]v1.EgressStatus{}
	for _, e := range egs {
		before[e.Name] = *e.Status.DeepCopy()
	}
	third := run(ag)
	for _, e := range egs {
		ch := third.Egresses[e.Name]
		if !equality.Semantic.DeepEqual(before[e.Name], ch.Status) {
			t.Errorf("%s: status changed in a pass over an unchanged cluster:\n was %+v\n now %+v", e.Name, before[e.Name], ch.Status)
		}
		if ch.EventReason != "" || ch.MoveReason != "" || ch.IPChangedNote != "" {
			t.Errorf("%s: Event %s (%s), move %q in a pass that changed nothing", e.Name, ch.EventReason, ch.EventNote, ch.MoveReason)
		}
	}
	if !equality.Semantic.DeepEqual(pools[0].Status, third.Pools["l2"]) {
		t.Errorf("pool status changed:\n was %+v\n now %+v", pools[0].Status, third.Pools["l2"])
	}
	if u := third.Pools["l2"].Usage; u.Used != 2 || u.Total != 2 {
		t.Errorf("usage %+v, want 2 of 2", u)
	}
	if len(third.Awaited) != 0 {
		t.Errorf("awaited %v after every agent reported", third.Awaited)
	}
}

// TestPlanL2ReleaseTimeout: a Node that keeps reporting an address it
// should release is waited for until PassConfig.ReleaseTimeout, then the
// address is assigned elsewhere with a ReleaseTimedOut Event naming it.
func TestPlanL2ReleaseTimeout(t *testing.T) {
	notReady := planNode("n1")
	notReady.Status.Conditions[0].Status = corev1.ConditionFalse
	egs := []v1.Egress{l2Egress("a", 1, "198.51.100.1", "n1")}
	now := time.Unix(10_000, 0)
	run := func(since time.Time) passOutput {
		return plan(passInput{Pools: []v1.ExternalIPPool{l2PoolOf("198.51.100.0/29", 0)}, Egresses: egs, Nodes: []corev1.Node{notReady, planNode("n2")},
			Agents: agents(map[string][]string{"n1": {"198.51.100.1"}}), Config: PassConfig{DefaultCapacity: 10, ReleaseTimeout: 3 * time.Second},
			Now: now, ReleaseSince: func(k releaseKey) time.Time {
				if k == (releaseKey{"n1", netip.MustParseAddr("198.51.100.1")}) {
					return since
				}
				return time.Time{}
			}})
	}
	for _, tc := range []struct {
		waited time.Duration
		node   string
		event  string
		waits  int
	}{{0, "", "Releasing", 1}, {2999 * time.Millisecond, "", "Releasing", 1}, {3 * time.Second, "n2", v1.ReasonReleaseTimedOut, 0}} {
		out := run(now.Add(-tc.waited))
		ch := out.Egresses["a"]
		if ch.Status.EgressNode != tc.node || ch.EventReason != tc.event || len(out.Waits) != tc.waits {
			t.Errorf("after %v: node %q event %s (%s) waits %v; want node %q event %s, %d waits", tc.waited, ch.Status.EgressNode, ch.EventReason, ch.EventNote, out.Waits, tc.node, tc.event, tc.waits)
		}
		if tc.node != "" && !strings.Contains(meta.FindStatusCondition(ch.Status.Conditions, v1.ConditionAssigned).Message, "Node n1 still reports it bound") {
			t.Errorf("after %v: Assigned does not name n1: %+v", tc.waited, ch.Status.Conditions)
		}
	}
}

func other(e v1.Egress, pool string) v1.Egress { e.Spec.ExternalIPPool = pool; return e }

// TestPlanPoolDeletionWaitsForMultiIPEgresses: a pool being deleted keeps
// its finalizer, and says which Egresses wait on it, while a multi-IP
// Egress names it in spec.ips, as it does for one naming it in
// externalIPPool; each Egress is named once however many entries name the
// pool.
func TestPlanPoolDeletionWaitsForMultiIPEgresses(t *testing.T) {
	pool := l2PoolOf("198.51.100.0/29", 0)
	pool.DeletionTimestamp = &metav1.Time{Time: time.Unix(1000, 0)}
	multi := l2Egress("multi", 1, "", "")
	multi.Spec.ExternalIPPool = ""
	multi.Spec.IPs = []v1.EgressIPSource{{Pool: pool.Name, Count: new(int32(1)), Zone: "a"}, {Pool: pool.Name, Count: new(int32(1)), Zone: "b"}}
	out := plan(passInput{Pools: []v1.ExternalIPPool{pool}, Egresses: []v1.Egress{multi}, Nodes: []corev1.Node{planNode("n1")}, Agents: agents(nil),
		Config: PassConfig{DefaultCapacity: 10}})
	if !out.Finalize[pool.Name] {
		t.Fatalf("pool %s may lose its finalizer while Egress multi names it in spec.ips", pool.Name)
	}
	c := meta.FindStatusCondition(out.Pools[pool.Name].Conditions, v1.ConditionReady)
	if c == nil || c.Reason != v1.ReasonInUse || !strings.Contains(c.Message, "Egresses multi still use this pool") {
		t.Fatalf("pool Ready condition %+v, want InUse naming multi once", c)
	}
}
