package controller

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// nodeRefusal is one Node whose agent reports an Egress refused.
type nodeRefusal struct {
	node, message string
}

// refusalsOf collects, from the reports of live agents, the Nodes whose
// kernel refuses each Egress, by Egress name, Nodes in name order.
func refusalsOf(nodes []corev1.Node, agents func(string) AgentState) map[string][]nodeRefusal {
	var out map[string][]nodeRefusal
	for i := range nodes {
		st := agents(nodes[i].Name)
		if !st.Known || st.Dead || len(st.Report.RefusedEgresses) == 0 {
			continue
		}
		if out == nil {
			out = map[string][]nodeRefusal{}
		}
		for _, r := range st.Report.RefusedEgresses {
			out[r.Egress] = append(out[r.Egress], nodeRefusal{node: nodes[i].Name, message: r.Message})
		}
	}
	for _, rs := range out {
		slices.SortFunc(rs, func(a, b nodeRefusal) int { return strings.Compare(a.node, b.node) })
	}
	return out
}

// refusedCondition is the Ready condition of an Egress refused on the
// Nodes rs (at least one): False, naming the first Node and its kernel's
// error, and how many other Nodes refuse it.
func refusedCondition(e *v1.Egress, rs []nodeRefusal) metav1.Condition {
	msg := fmt.Sprintf("the agent on Node %s cannot program this Egress's datapath (its Pods there do not use the egress IP): %s", rs[0].node, rs[0].message)
	if n := len(rs) - 1; n > 0 {
		msg += fmt.Sprintf("; %d other Node(s) refuse it too", n)
	}
	return metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionFalse, Reason: v1.ReasonDatapathRefused, Message: msg, ObservedGeneration: e.Generation}
}

// applyRefusal replaces rc with the refused condition when some Node
// refuses e, and sets the Warning Event of ch when that condition is new
// or its message changed (unless the pass already records another Event).
func applyRefusal(e *v1.Egress, rs []nodeRefusal, rc *metav1.Condition, ch *egressChange) {
	if len(rs) == 0 {
		return
	}
	*rc = refusedCondition(e, rs)
	prev := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionReady)
	if ch.EventReason == "" && (prev == nil || prev.Reason != v1.ReasonDatapathRefused || prev.Message != rc.Message) {
		ch.EventType, ch.EventReason, ch.EventNote = corev1.EventTypeWarning, v1.ReasonDatapathRefused, rc.Message
	}
}
