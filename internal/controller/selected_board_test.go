package controller

import (
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// TestSelectedBoard: the member publication's counts reach the pass's
// input only where they differ from the statuses read (and only for the
// Egress counted, not a recreated one of the same name), the statuses
// read stay as they were (the base of the pass's patches), and only a
// publication that changes a count signals a pass.
func TestSelectedBoard(t *testing.T) {
	egress := func(name string, uid types.UID, pods *int32, by ...string) v1.Egress {
		return v1.Egress{ObjectMeta: metav1.ObjectMeta{Name: name, UID: uid}, Status: v1.EgressStatus{SelectedPods: pods, ShadowedBy: by}}
	}
	egs := []v1.Egress{
		egress("counted", "u1", nil),
		egress("same", "u2", new(int32(3))),
		egress("recreated", "u3-new", nil),
		egress("shadowed", "u4", new(int32(2))),
	}
	b := newSelectedBoard()
	if got := b.overlay(egs); &got[0] != &egs[0] {
		t.Fatal("an empty board copied the Egresses")
	}
	if got := (*selectedBoard)(nil).overlay(egs); &got[0] != &egs[0] {
		t.Fatal("no board copied the Egresses")
	}
	counts := map[string]selectedEntry{
		"counted":   {uid: "u1", st: selectedStatus{pods: 0}},
		"same":      {uid: "u2", st: selectedStatus{pods: 3}},
		"recreated": {uid: "u3-old", st: selectedStatus{pods: 5}},
		"shadowed":  {uid: "u4", st: selectedStatus{pods: 0, shadowedBy: []string{"older"}}},
	}
	signalled := func() bool {
		select {
		case <-b.events:
			return true
		default:
			return false
		}
	}
	b.publish(counts)
	if !signalled() {
		t.Fatal("a first publication signalled no pass")
	}
	got := b.overlay(egs)
	if &got[0] == &egs[0] {
		t.Fatal("the overlay modified the Egresses read instead of a copy")
	}
	pods := func(e v1.Egress) any {
		if e.Status.SelectedPods == nil {
			return nil
		}
		return *e.Status.SelectedPods
	}
	for i, want := range []struct {
		pods any
		by   []string
	}{{int32(0), nil}, {int32(3), nil}, {nil, nil}, {int32(0), []string{"older"}}} {
		if pods(got[i]) != want.pods || !slices.Equal(got[i].Status.ShadowedBy, want.by) {
			t.Errorf("%s: selectedPods %v, shadowedBy %v; want %v, %v", got[i].Name, pods(got[i]), got[i].Status.ShadowedBy, want.pods, want.by)
		}
	}
	if egs[0].Status.SelectedPods != nil || egs[3].Status.ShadowedBy != nil || *egs[3].Status.SelectedPods != 2 {
		t.Fatalf("the statuses read changed: %+v", egs)
	}
	b.publish(map[string]selectedEntry{
		"counted":   {uid: "u1", st: selectedStatus{pods: 0}},
		"same":      {uid: "u2", st: selectedStatus{pods: 3}},
		"recreated": {uid: "u3-old", st: selectedStatus{pods: 5}},
		"shadowed":  {uid: "u4", st: selectedStatus{pods: 0, shadowedBy: []string{"older"}}},
	})
	if signalled() {
		t.Fatal("a publication that changed nothing signalled a pass")
	}
	b.publish(map[string]selectedEntry{"counted": {uid: "u1", st: selectedStatus{pods: 1}}})
	if !signalled() {
		t.Fatal("a publication that changed a count signalled no pass")
	}
	written := slices.Clone(egs)
	written[0].Status.SelectedPods = new(int32(1))
	if got := b.overlay(written); &got[0] != &written[0] {
		t.Fatal("statuses that already say the counts were copied")
	}
}

// TestMemberInputChanged: with the pass writing the counts, the member
// publication runs again for an Egress update only when it changes what
// selection reads (spec, deletion, the status addresses that decide the
// family), not for the pass's other status writes.
func TestMemberInputChanged(t *testing.T) {
	base := v1.Egress{ObjectMeta: metav1.ObjectMeta{Name: "e", Generation: 1}, Status: v1.EgressStatus{EgressIP: "10.0.0.1", EgressNode: "n1",
		IPs: []v1.EgressIPStatus{{IP: "10.0.0.1", Node: "n1"}}}}
	cases := []struct {
		name   string
		change func(e *v1.Egress)
		want   bool
	}{
		{"moved to another Node", func(e *v1.Egress) { e.Status.EgressNode, e.Status.IPs[0].Node = "n2", "n2" }, false},
		{"Ready changed", func(e *v1.Egress) {
			e.Status.Conditions = []metav1.Condition{{Type: v1.ConditionReady, Status: "True"}}
		}, false},
		{"count written", func(e *v1.Egress) { e.Status.SelectedPods = new(int32(4)) }, false},
		{"spec changed", func(e *v1.Egress) { e.Generation = 2 }, true},
		{"deleted", func(e *v1.Egress) { e.DeletionTimestamp = &metav1.Time{} }, true},
		{"new address", func(e *v1.Egress) { e.Status.EgressIP = "fd00::1" }, true},
		{"new address in status.ips", func(e *v1.Egress) { e.Status.IPs[0].IP = "fd00::1" }, true},
		{"another address in status.ips", func(e *v1.Egress) { e.Status.IPs = append(e.Status.IPs, v1.EgressIPStatus{IP: "10.0.0.2"}) }, true},
	}
	for _, tc := range cases {
		n := base.DeepCopy()
		tc.change(n)
		if got := memberInputChanged(&base, n); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
