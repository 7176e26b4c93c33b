package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

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

// writeSelected patches status.selectedPods and status.shadowedBy of e
// when they differ from want; only those two fields are sent (a merge
// patch), so the scheduling pass's writes of the other fields are not
// overwritten. A gone Egress is no error.
func (r *MembersReconciler) writeSelected(ctx context.Context, e *v1.Egress, want selectedStatus) error {
	if e.Status.SelectedPods != nil && *e.Status.SelectedPods == want.pods && slices.Equal(e.Status.ShadowedBy, want.shadowedBy) {
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
