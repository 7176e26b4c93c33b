package controller

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// carriesNothing reports whether e, by the member publication's last
// count (status.selectedPods), carries no Pod's traffic; false until the
// first count.
func carriesNothing(e *v1.Egress) bool {
	return e.Status.SelectedPods != nil && *e.Status.SelectedPods == 0
}

// shadowedCondition sets the Shadowed condition of es from the member
// publication (issue 21): True while the Egress's appliedTo matches Pods
// but other Egresses take every destination of each (status.shadowedBy
// names them), False once it carries traffic again; left absent on an
// Egress never shadowed.
func shadowedCondition(es *egressStatus) {
	e := es.e
	prev := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionShadowed)
	if carriesNothing(e) && len(e.Status.ShadowedBy) > 0 {
		meta.SetStatusCondition(&es.st.Conditions, metav1.Condition{Type: v1.ConditionShadowed, Status: metav1.ConditionTrue, Reason: v1.ReasonDestinationsTaken,
			Message:            fmt.Sprintf("every Pod its appliedTo matches sends all its destinations through other Egresses (%s): a destination uses the Egress whose destinationCIDRs match it with the longest prefix (none: every destination, the shortest), then the oldest; this Egress carries no traffic", joinNames(e.Status.ShadowedBy)),
			ObservedGeneration: e.Generation})
		return
	}
	if prev != nil {
		meta.SetStatusCondition(&es.st.Conditions, metav1.Condition{Type: v1.ConditionShadowed, Status: metav1.ConditionFalse, Reason: v1.ReasonCarriesTraffic,
			Message: "the Egress carries the traffic of some Pods", ObservedGeneration: e.Generation})
	}
}

// failureEffectOf says what e's failurePolicy does while it has no Node:
// nothing when it carries no Pod's traffic (the fault issue 21 mends: a
// shadowed Egress said its Pods' traffic was rejected), else per
// failureEffect, for its destinations only when it names some.
func failureEffectOf(e *v1.Egress) string {
	p := e.Spec.FailurePolicy
	if p == "" {
		p = v1.FailurePolicyFail
	}
	if carriesNothing(e) {
		return fmt.Sprintf("failurePolicy %s affects no traffic: the Egress carries no Pod's traffic", p)
	}
	s := failureEffect(e.Spec.FailurePolicy)
	if len(e.Spec.DestinationCIDRs) > 0 || len(e.Spec.ExcludedCIDRs) > 0 {
		s += " (only to the destinations this Egress carries)"
	}
	return s
}
