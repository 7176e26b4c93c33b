package controller

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/selection"
)

// selectedStatus is what an Egress's status says about its selection:
// status.selectedPods and status.shadowedBy.
type selectedStatus struct {
	pods       int32
	shadowedBy []string
}

// selectedOf counts the distinct Pods among an Egress's members (a
// dual-stack Pod's two IPs count once) and, when there are none, names the
// older Egresses that won the Pods it matches.
func selectedOf(name string, sel selection.Result) selectedStatus {
	pods := map[string]bool{}
	for _, m := range sel.Members[name] {
		pods[m.Pod] = true
	}
	st := selectedStatus{pods: int32(min(len(pods), 1<<31-1))}
	if st.pods == 0 {
		st.shadowedBy = sel.ShadowedBy[name]
	}
	return st
}

// selectedBoard hands the member publication's counts
// (status.selectedPods and status.shadowedBy) to the scheduling pass,
// which writes them in its own status patch of each Egress (issue 22
// goal 2): one patch carries the count, the Ready message that depends on
// it (noPodsNote) and whatever else changed, and it is ordered with the
// pass's other patches (a count alone is deferrable, prioOther), so these
// writes never compete with a failover's moves. Both run in the leader's
// process; a new leader's board starts empty and the pass keeps the
// statuses' counts until the first publication.
type selectedBoard struct {
	mu sync.Mutex
	// byName holds the last publication, by Egress name.
	byName map[string]selectedEntry
	// events receives one event (coalesced: buffered 1) per publication
	// that changed a count; the pass controller watches it.
	events chan event.GenericEvent
}

// selectedEntry is one Egress's published count; uid tells a recreated
// Egress of the same name from the one counted.
type selectedEntry struct {
	uid types.UID
	st  selectedStatus
}

func newSelectedBoard() *selectedBoard {
	return &selectedBoard{byName: map[string]selectedEntry{}, events: make(chan event.GenericEvent, 1)}
}

// publish replaces the board's counts with counts and, when any differs
// from the previous publication, signals a pass.
func (b *selectedBoard) publish(counts map[string]selectedEntry) {
	b.mu.Lock()
	changed := !maps.EqualFunc(b.byName, counts, func(x, y selectedEntry) bool {
		return x.uid == y.uid && x.st.pods == y.st.pods && slices.Equal(x.st.shadowedBy, y.st.shadowedBy)
	})
	b.byName = counts
	b.mu.Unlock()
	if changed {
		select {
		case b.events <- event.GenericEvent{Object: &v1.Egress{}}:
		default: // a pass is already due
		}
	}
}

// overlay returns egs with each Egress's status.selectedPods and
// status.shadowedBy replaced by the board's count where they differ: egs
// itself when none does, else a copy (egs is not modified; its Egresses
// stay what the API server holds, the base of the pass's patches).
func (b *selectedBoard) overlay(egs []v1.Egress) []v1.Egress {
	if b == nil {
		return egs
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	out, cloned := egs, false
	for i := range egs {
		e := &egs[i]
		c, ok := b.byName[e.Name]
		if !ok || c.uid != e.UID || selectedEqual(e, c.st) {
			continue
		}
		if !cloned {
			out, cloned = slices.Clone(egs), true
		}
		out[i].Status.SelectedPods = new(c.st.pods)
		out[i].Status.ShadowedBy = c.st.shadowedBy
	}
	return out
}

// selectedEqual reports whether e's status already says want.
func selectedEqual(e *v1.Egress, want selectedStatus) bool {
	return e.Status.SelectedPods != nil && *e.Status.SelectedPods == want.pods && slices.Equal(e.Status.ShadowedBy, want.shadowedBy)
}

// writeSelected patches status.selectedPods and status.shadowedBy of e
// when they differ from want (a MembersReconciler without a board, that
// is without a scheduling pass to write them); only those two fields are sent (a merge
// patch), so the scheduling pass's writes of the other fields are not
// overwritten. A gone Egress is no error.
func (r *MembersReconciler) writeSelected(ctx context.Context, e *v1.Egress, want selectedStatus) error {
	if selectedEqual(e, want) {
		return nil
	}
	patch := client.MergeFrom(e.DeepCopy())
	e = e.DeepCopy()
	e.Status.SelectedPods = new(want.pods)
	e.Status.ShadowedBy = want.shadowedBy
	if err := r.Client.Status().Patch(ctx, e, patch); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("patch status.selectedPods of Egress %s: %w", e.Name, err)
	}
	return nil
}

// noPodsNote is the sentence the Ready message ends with while an Egress
// selects no Pod; empty while it selects some or has not been counted.
func noPodsNote(e *v1.Egress) string {
	if e.Status.SelectedPods == nil || *e.Status.SelectedPods > 0 {
		return ""
	}
	if len(e.Status.ShadowedBy) > 0 {
		return fmt.Sprintf("; it selects no Pod: every Pod its appliedTo matches uses other Egresses for all its destinations (%s; see condition Shadowed)", joinNames(e.Status.ShadowedBy))
	}
	return "; it selects no Pod: no running Pod matches its appliedTo"
}

// joinNames lists names as "a, b and c".
func joinNames(ns []string) string {
	if len(ns) < 2 {
		return strings.Join(ns, "")
	}
	return strings.Join(ns[:len(ns)-1], ", ") + " and " + ns[len(ns)-1]
}
