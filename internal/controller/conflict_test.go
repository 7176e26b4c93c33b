package controller

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/report"
)

// TestDuplicateIPCondition: when the egress Node's agent reports that
// other hosts answer for the Egress's IP, the Egress gets Conflict=True
// (DuplicateIP) naming each MAC, and the Node behind a MAC another agent
// reports as its own, plus a Warning Event; it keeps its Node and stays
// Ready. When the report no longer lists the conflict the condition turns
// False (NoConflict), and the status is not written again while nothing
// changes.
func TestDuplicateIPCondition(t *testing.T) {
	cl := newCluster(t, "dupc", 2, 4)
	cl.pool("dupc", nil)
	cl.egress("dupc-a", "dupc", "")
	eg := cl.waitReady("dupc-a")["dupc-a"]
	holder, ip := eg.Status.EgressNode, netip.MustParseAddr(eg.Status.EgressIP)
	other := "dupc-n1"
	if holder == other {
		other = "dupc-n2"
	}
	const otherMAC, rogueMAC = "02:00:00:00:0a:02", "02:00:00:00:0b:99"
	cl.agents[other].setConflicts(nil, []string{otherMAC})
	since := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	cl.agents[holder].setConflicts([]report.ConflictIP{{IP: ip, Interface: "eth0", MACs: []string{otherMAC, rogueMAC}, Since: since}}, []string{"02:00:00:00:0a:01"})

	var msg string
	cl.eventually("Conflict=True", func() (bool, string) {
		e := cl.get("dupc-a")
		c := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionConflict)
		if c == nil {
			return false, describe(e)
		}
		msg = c.Message
		return c.Status == metav1.ConditionTrue && c.Reason == v1.ReasonDuplicateIP &&
			strings.Contains(c.Message, otherMAC+" (Node "+other+")") && strings.Contains(c.Message, rogueMAC+" (not a Node of this cluster)") &&
			strings.Contains(c.Message, "Node "+holder) && strings.Contains(c.Message, ip.String()), c.Message
	})
	t.Logf("Conflict message: %s", msg)
	cl.eventually("DuplicateIP Warning Event", func() (bool, string) {
		var evs eventsv1.EventList
		if err := cl.c.List(cl.ctx, &evs); err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, ev := range evs.Items {
			if ev.Regarding.Name == "dupc-a" {
				if ev.Reason == v1.ReasonDuplicateIP && ev.Type == corev1.EventTypeWarning && strings.Contains(ev.Note, rogueMAC) {
					return true, ""
				}
				seen = append(seen, ev.Reason)
			}
		}
		return false, fmt.Sprintf("Events of dupc-a: %v", seen)
	})
	e := cl.get("dupc-a")
	if e.Status.EgressNode != holder || !ready(e) {
		t.Fatalf("the Egress left its Node or is not Ready during the conflict: %s", describe(e))
	}
	// Unchanged report: no further status write.
	rv := e.ResourceVersion
	time.Sleep(3 * time.Second) // several polls (1 s) and passes; a write would change the resourceVersion
	if e2 := cl.get("dupc-a"); e2.ResourceVersion != rv {
		t.Fatalf("status rewritten without a change: resourceVersion %s -> %s (%s)", rv, e2.ResourceVersion, describe(e2))
	}

	cl.agents[holder].setConflicts(nil, []string{"02:00:00:00:0a:01"})
	cl.eventually("Conflict=False", func() (bool, string) {
		e := cl.get("dupc-a")
		c := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionConflict)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1.ReasonNoConflict, describe(e)
	})
	if e := cl.get("dupc-a"); e.Status.EgressNode != holder || !ready(e) {
		t.Fatalf("after the conflict: %s", describe(e))
	}
}

// TestDuplicateIPConditionTable checks conflictCondition's cases without
// an API server.
func TestDuplicateIPConditionTable(t *testing.T) {
	ip := netip.MustParseAddr("192.0.2.70")
	withConflict := AgentState{Known: true, Report: report.Report{Conflicts: []report.ConflictIP{{IP: ip, Interface: "eth0", MACs: []string{"02:00:00:00:00:99"}}}}}
	none := AgentState{Known: true}
	st := v1.EgressStatus{EgressNode: "n1", EgressIP: ip.String()}
	trueBefore := &v1.Egress{Status: v1.EgressStatus{Conditions: []metav1.Condition{{Type: v1.ConditionConflict, Status: metav1.ConditionTrue, Reason: v1.ReasonDuplicateIP}}}}
	for _, tc := range []struct {
		name   string
		e      *v1.Egress
		st     v1.EgressStatus
		agent  AgentState
		ok     bool
		status metav1.ConditionStatus
	}{
		{"conflict reported", &v1.Egress{}, st, withConflict, true, metav1.ConditionTrue},
		{"none reported, none before: no condition", &v1.Egress{}, st, none, false, ""},
		{"none reported, True before: False", trueBefore, st, none, true, metav1.ConditionFalse},
		{"agent dead: left as it is", trueBefore, st, AgentState{Known: true, Dead: true, Report: withConflict.Report}, false, ""},
		{"agent unknown: left as it is", trueBefore, st, AgentState{}, false, ""},
		{"no Node any more, True before: False", trueBefore, v1.EgressStatus{EgressIP: ip.String()}, withConflict, true, metav1.ConditionFalse},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, ok := conflictCondition(tc.e, tc.st, func(string) AgentState { return tc.agent }, nil)
			if ok != tc.ok || (ok && c.Status != tc.status) {
				t.Fatalf("conflictCondition = %+v, %v; want status %q, %v", c, ok, tc.status, tc.ok)
			}
		})
	}
}
