package controller

import (
	"context"
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// TestEgressWritePriority: the patches a failover needs (a move off a
// Node, a changed address) rank first, Ready changes next, new
// assignments (a cold start's bulk) after them, anything else last.
func TestEgressWritePriority(t *testing.T) {
	readyC := func(s metav1.ConditionStatus) []metav1.Condition {
		return []metav1.Condition{{Type: v1.ConditionReady, Status: s, Reason: "R"}}
	}
	cases := []struct {
		name string
		a, b v1.EgressStatus
		want writePriority
	}{
		{"failover", v1.EgressStatus{EgressNode: "n1", EgressIP: "10.0.0.1", Conditions: readyC("True")}, v1.EgressStatus{EgressNode: "n2", EgressIP: "10.0.0.1", Conditions: readyC("False")}, prioMove},
		{"unassigned", v1.EgressStatus{EgressNode: "n1", EgressIP: "10.0.0.1"}, v1.EgressStatus{EgressIP: "10.0.0.1"}, prioMove},
		{"address changed", v1.EgressStatus{EgressNode: "n1", EgressIP: "10.0.0.1"}, v1.EgressStatus{EgressNode: "n1", EgressIP: "10.0.0.2"}, prioMove},
		{"became Ready", v1.EgressStatus{EgressNode: "n1", EgressIP: "10.0.0.1", Conditions: readyC("False")}, v1.EgressStatus{EgressNode: "n1", EgressIP: "10.0.0.1", Conditions: readyC("True")}, prioReady},
		{"stopped being Ready", v1.EgressStatus{EgressNode: "n1", EgressIP: "10.0.0.1", Conditions: readyC("True")}, v1.EgressStatus{EgressNode: "n1", EgressIP: "10.0.0.1", Conditions: readyC("False")}, prioReady},
		{"first assignment", v1.EgressStatus{}, v1.EgressStatus{EgressNode: "n1", EgressIP: "10.0.0.1", Conditions: readyC("False")}, prioAssign},
		{"first address, no Node", v1.EgressStatus{}, v1.EgressStatus{EgressIP: "10.0.0.1", Conditions: readyC("False")}, prioOther},
		{"message only", v1.EgressStatus{EgressNode: "n1", PublicIP: ""}, v1.EgressStatus{EgressNode: "n1", PublicIP: "203.0.113.1"}, prioOther},
	}
	for _, tc := range cases {
		if got := egressWritePriority(&tc.a, &tc.b); got != tc.want {
			t.Errorf("%s: priority %d, want %d", tc.name, got, tc.want)
		}
	}
}

// TestPrioritizeDefersOnlyDeferrable: the writes come out by priority,
// every move and Ready change is kept however many there are, and only
// the deferrable ones beyond DeferrableWrites are left for the next pass.
func TestPrioritizeDefersOnlyDeferrable(t *testing.T) {
	var writes []statusWrite
	add := func(p writePriority, n int) {
		for i := range n {
			writes = append(writes, statusWrite{obj: &v1.Egress{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%d-%d", p, i)}}, prio: p, index: len(writes),
				do: func(context.Context) error { return nil }})
		}
	}
	add(prioOther, 30)
	add(prioAssign, 300)
	add(prioReady, 150)
	add(prioMove, 200)
	r := &PassReconciler{DeferrableWrites: 100}
	now, later := r.prioritize(writes)
	if len(now) != 200+150+100 || len(later) != 300+30-100 {
		t.Fatalf("%d now and %d later, want 450 and 230", len(now), len(later))
	}
	for i := 1; i < len(now); i++ {
		if now[i].prio < now[i-1].prio {
			t.Fatalf("write %d (%s, priority %d) after one of priority %d", i, now[i].obj.GetName(), now[i].prio, now[i-1].prio)
		}
	}
	count := map[writePriority]int{}
	for _, w := range now {
		count[w.prio]++
	}
	if count[prioMove] != 200 || count[prioReady] != 150 || count[prioAssign] != 100 || count[prioOther] != 0 {
		t.Fatalf("issued now by priority %v, want every move and Ready change and 100 assignments", count)
	}
	for _, w := range later {
		if w.prio < prioAssign {
			t.Fatalf("deferred %s of priority %d", w.obj.GetName(), w.prio)
		}
	}
	if now, later := (&PassReconciler{}).prioritize(writes); len(now) != len(writes) || len(later) != 0 {
		t.Fatalf("without a bound: %d now, %d later, want all now", len(now), len(later))
	}
	if got := deferrableWrites(DefaultKubeAPIQPS); got != DefaultKubeAPIQPS {
		t.Fatalf("deferrableWrites(%d) = %d", DefaultKubeAPIQPS, got)
	}
	if got := deferrableWrites(-1); got != 0 {
		t.Fatalf("deferrableWrites(-1) = %d, want 0 (no client rate limit, no bound)", got)
	}
}
