package controller

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// TestEgressIPChangedEventAndSharedWith (issue 15 fault 4): moving an
// assigned Egress to another address (a spec.egressIP edit, then a
// spec.externalIPPool edit) records an EgressIPChanged Warning Event naming
// the old and the new address each time; Egresses naming one address list
// each other in status.sharedWith.
func TestEgressIPChangedEventAndSharedWith(t *testing.T) {
	cl := newCluster(t, "ipch", 1, 8)
	cl.pool("ipch", nil)
	cl.pool("ipch-2", func(p *v1.ExternalIPPool) { p.Spec.IPRanges = []v1.IPRange{{CIDR: "198.51.100.0/28"}} })
	cl.egress("ipch-a", "ipch", "192.0.2.5")
	cl.egress("ipch-b", "ipch", "192.0.2.5")
	cl.waitReady("ipch-a", "ipch-b")
	cl.eventually("sharedWith", func() (bool, string) {
		a, b := cl.get("ipch-a"), cl.get("ipch-b")
		return slices.Equal(a.Status.SharedWith, []string{"ipch-b"}) && slices.Equal(b.Status.SharedWith, []string{"ipch-a"}),
			fmt.Sprintf("a %v b %v", a.Status.SharedWith, b.Status.SharedWith)
	})

	event := func(from, to string) {
		t.Helper()
		cl.eventually("EgressIPChanged "+from+" -> "+to, func() (bool, string) {
			var evs eventsv1.EventList
			if err := cl.c.List(cl.ctx, &evs); err != nil {
				return false, err.Error()
			}
			var notes []string
			for _, ev := range evs.Items {
				if ev.Regarding.Name != "ipch-a" || ev.Reason != v1.EventEgressIPChanged {
					continue
				}
				if ev.Type == corev1.EventTypeWarning && strings.Contains(ev.Note, "from "+from+" to "+to) {
					t.Logf("Event: %s", ev.Note)
					return true, ""
				}
				notes = append(notes, ev.Note)
			}
			return false, fmt.Sprintf("EgressIPChanged Events: %q", notes)
		})
	}
	edit := func(mutate func(*v1.Egress)) {
		t.Helper()
		e := cl.get("ipch-a")
		patch := client.MergeFrom(e.DeepCopy())
		mutate(e)
		if err := cl.c.Patch(cl.ctx, e, patch); err != nil {
			t.Fatal(err)
		}
	}
	edit(func(e *v1.Egress) { e.Spec.EgressIP = "192.0.2.9" })
	event("192.0.2.5", "192.0.2.9")
	cl.eventually("sharing ended", func() (bool, string) {
		a, b := cl.get("ipch-a"), cl.get("ipch-b")
		return a.Status.SharedWith == nil && b.Status.SharedWith == nil, fmt.Sprintf("a %v b %v", a.Status.SharedWith, b.Status.SharedWith)
	})
	edit(func(e *v1.Egress) { e.Spec.EgressIP, e.Spec.ExternalIPPool = "", "ipch-2" })
	event("192.0.2.9", "198.51.100.1")
}
