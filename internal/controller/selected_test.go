package controller

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// TestSelectedPodsShadowedByOlderEgress (issue 15 fault 5): an Egress
// whose Pods all use an older Egress shows status.selectedPods 0, names
// the older Egress in status.shadowedBy, and its Ready message says it
// selects no Pod and why; the older one counts the Pods; a new Pod of its
// own turns the count to 1 and the note goes away.
func TestSelectedPodsShadowedByOlderEgress(t *testing.T) {
	cl := newCluster(t, "shadow", 1, 4)
	cl.pool("shadow", nil)
	cl.namespace("shadow-ns", map[string]string{"team": "shadow"})
	cl.createPod("shadow-ns", "p1", "shadow-n1", map[string]string{"app": "x"}, "127.0.0.1", "10.70.0.1")
	cl.createPod("shadow-ns", "p2", "shadow-n1", map[string]string{"app": "x"}, "127.0.0.1", "10.70.0.2")
	cl.egressSel("shadow-a", "shadow", map[string]string{"team": "shadow"}, nil)
	cl.egressSel("shadow-b", "shadow", map[string]string{"team": "shadow"}, map[string]string{"app": "x"})

	count := func(e *v1.Egress) string {
		if e.Status.SelectedPods == nil {
			return "unset"
		}
		return fmt.Sprint(*e.Status.SelectedPods)
	}
	cl.eventually("shadow-a selects 2 Pods", func() (bool, string) {
		e := cl.get("shadow-a")
		return count(e) == "2" && e.Status.ShadowedBy == nil, count(e)
	})
	cl.eventually("shadow-b selects none, shadowed by shadow-a, said in Ready", func() (bool, string) {
		e := cl.get("shadow-b")
		c := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionReady)
		ok := count(e) == "0" && slices.Equal(e.Status.ShadowedBy, []string{"shadow-a"}) && c != nil &&
			strings.Contains(c.Message, "it selects no Pod: every Pod its appliedTo matches uses other Egresses for all its destinations (shadow-a")
		return ok, count(e) + " " + describe(e)
	})
	t.Logf("Ready of shadow-b: %s", meta.FindStatusCondition(cl.get("shadow-b").Status.Conditions, v1.ConditionReady).Message)

	// A Pod only shadow-b matches: it has one, and the note goes.
	cl.namespace("shadow-ns2", map[string]string{"team": "other"})
	if err := cl.c.Delete(cl.ctx, cl.get("shadow-b")); err != nil {
		t.Fatal(err)
	}
	cl.egressSel("shadow-c", "shadow", nil, map[string]string{"app": "y"})
	cl.eventually("shadow-c selects none: no Pod matches", func() (bool, string) {
		e := cl.get("shadow-c")
		c := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionReady)
		return count(e) == "0" && c != nil && strings.Contains(c.Message, "it selects no Pod: no running Pod matches its appliedTo"), describe(e)
	})
	cl.createPod("shadow-ns2", "p3", "shadow-n1", map[string]string{"app": "y"}, "127.0.0.1", "10.70.0.3")
	cl.eventually("shadow-c selects 1, no note", func() (bool, string) {
		e := cl.get("shadow-c")
		c := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionReady)
		return count(e) == "1" && c != nil && !strings.Contains(c.Message, "selects no Pod"), describe(e)
	})
}

// waitCounted waits until the member publication has counted every named
// Egress's Pods (status.selectedPods) and the pass has written the Ready
// message that goes with the count: the status tests compare is settled.
func (cl *cluster) waitCounted(names ...string) {
	cl.t.Helper()
	for _, n := range names {
		cl.eventually(n+" counted", func() (bool, string) {
			e := cl.get(n)
			c := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionReady)
			if e.Status.SelectedPods == nil || c == nil {
				return false, describe(e)
			}
			return (*e.Status.SelectedPods == 0) == strings.Contains(c.Message, "selects no Pod"), describe(e)
		})
	}
}
