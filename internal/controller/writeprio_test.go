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
// every move and Ready change is kept however many there are, and the
// deferrable ones fill what the urgent ones leave of DeferrableWrites;
// the rest are left for the next pass. A failover's pass (more urgent
// patches than the bound) issues nothing deferrable.
func TestPrioritizeDefersOnlyDeferrable(t *testing.T) {
	build := func(moves, readys, assigns, others int) []statusWrite {
		var writes []statusWrite
		add := func(p writePriority, n int) {
			for i := range n {
				writes = append(writes, statusWrite{obj: &v1.Egress{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%d-%d", p, i)}}, prio: p, index: len(writes),
					do: func(context.Context) error { return nil }})
			}
		}
		add(prioOther, others)
		add(prioAssign, assigns)
		add(prioReady, readys)
		add(prioMove, moves)
		return writes
	}
	cases := []struct {
		name                          string
		moves, readys, assigns, other int
		// want: issued now by priority.
		want [prioOther + 1]int
	}{
		{"failover", 200, 150, 300, 30, [prioOther + 1]int{200, 150, 0, 0}},
		{"cold start chunk", 0, 40, 300, 30, [prioOther + 1]int{0, 40, 60, 0}},
		{"bulk of assignments", 0, 0, 300, 30, [prioOther + 1]int{0, 0, 100, 0}},
		{"within the bound", 10, 10, 50, 30, [prioOther + 1]int{10, 10, 50, 30}},
	}
	for _, tc := range cases {
		writes := build(tc.moves, tc.readys, tc.assigns, tc.other)
		r := &PassReconciler{DeferrableWrites: 100}
		now, later := r.prioritize(writes)
		if len(now)+len(later) != len(writes) {
			t.Fatalf("%s: %d now and %d later of %d", tc.name, len(now), len(later), len(writes))
		}
		for i := 1; i < len(now); i++ {
			if now[i].prio < now[i-1].prio {
				t.Fatalf("%s: write %d (%s, priority %d) after one of priority %d", tc.name, i, now[i].obj.GetName(), now[i].prio, now[i-1].prio)
			}
		}
		var count [prioOther + 1]int
		for _, w := range now {
			count[w.prio]++
		}
		if count != tc.want {
			t.Errorf("%s: issued now by priority %v, want %v", tc.name, count, tc.want)
		}
		for _, w := range later {
			if w.prio < prioAssign {
				t.Fatalf("%s: deferred %s of priority %d", tc.name, w.obj.GetName(), w.prio)
			}
		}
		if now, later := (&PassReconciler{}).prioritize(writes); len(now) != len(writes) || len(later) != 0 {
			t.Fatalf("%s without a bound: %d now, %d later, want all now", tc.name, len(now), len(later))
		}
	}
	if got := deferrableWrites(DefaultKubeAPIQPS); got != DefaultKubeAPIQPS {
		t.Fatalf("deferrableWrites(%d) = %d", DefaultKubeAPIQPS, got)
	}
	if got := deferrableWrites(-1); got != 0 {
		t.Fatalf("deferrableWrites(-1) = %d, want 0 (no client rate limit, no bound)", got)
	}
}
