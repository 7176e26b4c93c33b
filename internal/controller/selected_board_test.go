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
