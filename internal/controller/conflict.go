package controller

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// Duplicate-IP detection (issue 16 item 3): each agent probes the wire for
// other hosts answering for the IPs it holds and lists what it finds in its
// report (report.Report.Conflicts). The pass turns the egress Node's
// finding into the Egress condition Conflict and a Warning Event naming the
// other MACs; it moves nothing.

// macOwners maps each MAC the agents report as their Node's own
// (report.Report.MACs) to that Node, from every agent ever heard from
// (dead ones too: a cut-off Node still answering is the case to name).
func macOwners(nodes []corev1.Node, agents func(string) AgentState) map[string]string {
	out := map[string]string{}
	for i := range nodes {
		st := agents(nodes[i].Name)
		if !st.Known {
			continue
		}
		for _, m := range st.Report.MACs {
			out[strings.ToLower(m)] = nodes[i].Name
		}
	}
	return out
}

// conflictCondition returns the Conflict condition for an Egress whose new
// status is st, and whether the pass knows it: true with the condition when
// the egress Node's live agent reports a conflict for the IP (True) or
// reports none while the condition was True before (False); false when
// there is nothing to change (no conflict now and none before, or the
// agent is unknown or dead: the condition then stays as it is).
func conflictCondition(e *v1.Egress, st v1.EgressStatus, agents func(string) AgentState, owners map[string]string) (metav1.Condition, bool) {
	prev := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionConflict)
	wasTrue := prev != nil && prev.Status == metav1.ConditionTrue
	cleared := metav1.Condition{Type: v1.ConditionConflict, Status: metav1.ConditionFalse, Reason: v1.ReasonNoConflict,
		Message: "no other host answers for the egress IP on its Node's link (the last duplicate-IP probe saw none)", ObservedGeneration: e.Generation}
	ip, err := netip.ParseAddr(st.EgressIP)
	if st.EgressNode == "" || err != nil {
		return cleared, wasTrue
	}
	a := agents(st.EgressNode)
	if !a.Known || a.Dead {
		return metav1.Condition{}, false
	}
	c, ok := a.Report.LookupConflict(ip.Unmap())
	if !ok {
		return cleared, wasTrue
	}
	others := make([]string, 0, len(c.MACs))
	for _, m := range c.MACs {
		switch n := owners[strings.ToLower(m)]; {
		case n == st.EgressNode:
			others = append(others, m+" (another interface of Node "+n+")")
		case n != "":
			others = append(others, m+" (Node "+n+")")
		default:
			others = append(others, m+" (not a Node of this cluster)")
		}
	}
	msg := fmt.Sprintf("another host answers for %s on the link of Node %s (interface %s) since %s: MAC %s; Node %s keeps the address, so neighbours may send its traffic to either: stop the other host from using %s",
		ip, st.EgressNode, c.Interface, c.Since.UTC().Format(time.RFC3339), strings.Join(others, ", "), st.EgressNode, ip)
	return metav1.Condition{Type: v1.ConditionConflict, Status: metav1.ConditionTrue, Reason: v1.ReasonDuplicateIP, Message: msg, ObservedGeneration: e.Generation}, true
}

// applyConflict sets the Conflict condition of st (see conflictCondition)
// and the Warning Event of ch when the condition turns True or its message
// changes. It reports whether the Egress is in conflict.
func applyConflict(e *v1.Egress, st *v1.EgressStatus, ch *egressChange, agents func(string) AgentState, owners map[string]string) bool {
	c, ok := conflictCondition(e, *st, agents, owners)
	if !ok {
		prev := meta.FindStatusCondition(st.Conditions, v1.ConditionConflict)
		return prev != nil && prev.Status == metav1.ConditionTrue
	}
	prev := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionConflict)
	if c.Status == metav1.ConditionTrue && (prev == nil || prev.Status != metav1.ConditionTrue || prev.Message != c.Message) {
		ch.ConflictEvent = c.Message
	}
	meta.SetStatusCondition(&st.Conditions, c)
	return c.Status == metav1.ConditionTrue
}
