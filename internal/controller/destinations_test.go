package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// egressDst creates an Egress selecting namespace team=dst with the given
// destinationCIDRs and excludedCIDRs.
func (cl *cluster) egressDst(name, pool string, dst, exc []v1.DestinationCIDR) *v1.Egress {
	cl.t.Helper()
	e := &v1.Egress{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.EgressSpec{ExternalIPPool: pool,
		AppliedTo:        v1.AppliedTo{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "dst"}}},
		DestinationCIDRs: dst, ExcludedCIDRs: exc}}
	if err := cl.c.Create(cl.ctx, e); err != nil {
		cl.t.Fatal(err)
	}
	cl.t.Cleanup(func() { _ = env.Client.Delete(context.Background(), e) })
	return e
}

// TestDestinationsMemberSlices (issue 21): Pod P is selected by B (every
// destination but 203.0.113.0/25) and the newer A (198.51.100.0/24): both
// carry some of its destinations, so P is in both Egresses' member slices
// and each counts it. C, newer still, names only A's network: it loses
// every destination of P, counts no Pod, is Shadowed=True naming A, and
// its Ready message (it has no Node: its pool matches none) no longer
// claims that its failurePolicy rejects traffic. Once C's destinations
// change to a network nobody else names, it carries P's traffic to it.
func TestDestinationsMemberSlices(t *testing.T) {
	cl := newCluster(t, "dst", 1, 10)
	cl.pool("dst", nil)
	cl.pool("dst-none", func(p *v1.ExternalIPPool) {
		p.Spec.IPRanges = []v1.IPRange{{CIDR: "192.0.2.16/28"}}
		p.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"egress": "never"}}
	})
	cl.namespace("dst-ns", map[string]string{"team": "dst"})
	cl.createPod("dst-ns", "p", "dst-n1", nil, "127.0.0.1", "10.72.0.1")
	cl.egressDst("dst-b", "dst", nil, []v1.DestinationCIDR{"203.0.113.0/25"})
	cl.egressDst("dst-a", "dst", []v1.DestinationCIDR{"198.51.100.0/24"}, nil)
	cl.waitMembers("dst-b", "10.72.0.1@127.0.0.1")
	cl.waitMembers("dst-a", "10.72.0.1@127.0.0.1")
	count := func(e *v1.Egress) string {
		if e.Status.SelectedPods == nil {
			return "unset"
		}
		return fmt.Sprint(*e.Status.SelectedPods)
	}
	for _, n := range []string{"dst-a", "dst-b"} {
		cl.eventually(n+" counts P", func() (bool, string) {
			e := cl.get(n)
			return count(e) == "1" && meta.FindStatusCondition(e.Status.Conditions, v1.ConditionShadowed) == nil, count(e) + " " + describe(e)
		})
	}

	c := cl.egressDst("dst-c", "dst-none", []v1.DestinationCIDR{"198.51.100.0/24"}, nil)
	cl.eventually("dst-c shadowed by dst-a, Ready says its policy affects nothing", func() (bool, string) {
		e := cl.get("dst-c")
		sh := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionShadowed)
		r := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionReady)
		ok := count(e) == "0" && slices.Equal(e.Status.ShadowedBy, []string{"dst-a"}) &&
			sh != nil && sh.Status == metav1.ConditionTrue && sh.Reason == v1.ReasonDestinationsTaken && strings.Contains(sh.Message, "(dst-a)") &&
			r != nil && r.Reason == v1.ReasonNoEgressNode && strings.Contains(r.Message, "failurePolicy Fail affects no traffic") && !strings.Contains(r.Message, "is rejected")
		return ok, count(e) + " " + describe(e)
	})
	if _, ips := cl.membersOf("dst-c"); len(ips) != 0 {
		t.Errorf("dst-c has members %v", ips)
	}
	t.Logf("dst-c: %s", describe(cl.get("dst-c")))

	e := cl.get("dst-c")
	e.Spec.DestinationCIDRs = []v1.DestinationCIDR{"192.0.2.128/25"}
	if err := cl.c.Update(cl.ctx, e); err != nil {
		t.Fatal(err)
	}
	cl.waitMembers("dst-c", "10.72.0.1@127.0.0.1")
	cl.eventually("dst-c carries P's traffic to 192.0.2.128/25; Ready says what Fail rejects", func() (bool, string) {
		e := cl.get(c.Name)
		sh := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionShadowed)
		r := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionReady)
		ok := count(e) == "1" && e.Status.ShadowedBy == nil && sh != nil && sh.Status == metav1.ConditionFalse && sh.Reason == v1.ReasonCarriesTraffic &&
			r != nil && strings.Contains(r.Message, "external traffic is rejected (only to the destinations this Egress carries)")
		return ok, count(e) + " " + describe(e)
	})
	// A and B keep P.
	cl.waitMembers("dst-a", "10.72.0.1@127.0.0.1")
	cl.waitMembers("dst-b", "10.72.0.1@127.0.0.1")
}
