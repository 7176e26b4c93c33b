package controller

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/report"
)

// TestOneEgressFailsReadyFalseWithEvent: when a Node's agent reports that
// its kernel refuses one Egress's datapath, that Egress (only) turns
// Ready=False with reason DatapathRefused naming the Node and the kernel's
// error, a Warning Event says the same, and it turns Ready again once no
// agent reports it.
func TestOneEgressFailsReadyFalseWithEvent(t *testing.T) {
	cl := newCluster(t, "refuse", 2, 4)
	cl.pool("refuse", nil)
	cl.egress("refuse-a", "refuse", "")
	cl.egress("refuse-b", "refuse", "")
	cl.waitReady("refuse-a", "refuse-b")

	const kernelErr = "try nftables table inet egressip-try: conn.Receive: netlink receive: numerical result out of range"
	cl.agents["refuse-n2"].setRefusedEgresses([]report.RefusedEgress{{Egress: "refuse-a", Message: kernelErr}})
	var note string
	cl.eventually("refuse-a Ready=False DatapathRefused", func() (bool, string) {
		e := cl.get("refuse-a")
		c := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionReady)
		if c != nil {
			note = c.Message
		}
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1.ReasonDatapathRefused &&
			strings.Contains(c.Message, "Node refuse-n2") && strings.Contains(c.Message, kernelErr), describe(e)
	})
	t.Logf("Ready message: %s", note)
	cl.eventually("DatapathRefused Warning Event", func() (bool, string) {
		var evs eventsv1.EventList
		if err := cl.c.List(cl.ctx, &evs); err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, ev := range evs.Items {
			if ev.Regarding.Name == "refuse-a" {
				if ev.Reason == v1.ReasonDatapathRefused && ev.Type == corev1.EventTypeWarning && strings.Contains(ev.Note, "refuse-n2") {
					return true, ""
				}
				seen = append(seen, ev.Reason)
			}
		}
		return false, fmt.Sprintf("Events of refuse-a: %v", seen)
	})
	if e := cl.get("refuse-b"); !ready(e) {
		t.Fatalf("the other Egress is not Ready: %s", describe(e))
	}
	cl.agents["refuse-n2"].setRefusedEgresses(nil)
	cl.waitReady("refuse-a", "refuse-b")
}
