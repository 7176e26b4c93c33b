package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// createPod creates a running Pod on node with the given IPs (status
// written through the status subresource, as the kubelet does).
func (cl *cluster) createPod(ns, name, node string, lbl map[string]string, hostIP string, ips ...string) {
	cl.t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbl},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/c"}}},
	}
	if err := cl.c.Create(cl.ctx, p); err != nil {
		cl.t.Fatal(err)
	}
	p.Status.Phase = corev1.PodRunning
	p.Status.HostIPs = []corev1.HostIP{{IP: hostIP}}
	p.Status.HostIP = hostIP
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	p.Status.PodIP = ips[0]
	if err := cl.c.Status().Update(cl.ctx, p); err != nil {
		cl.t.Fatal(err)
	}
}

func (cl *cluster) namespace(name string, lbl map[string]string) {
	cl.t.Helper()
	if err := cl.c.Create(cl.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbl}}); err != nil {
		cl.t.Fatal(err)
	}
}

// membersOf returns the slices of egress, by name, read from the API server.
func (cl *cluster) membersOf(egress string) (map[string]v1.EgressMemberSlice, []string) {
	cl.t.Helper()
	var l v1.EgressMemberSliceList
	if err := cl.c.List(cl.ctx, &l, client.MatchingFields{v1.EgressMemberSliceField: egress}); err != nil {
		cl.t.Fatal(err)
	}
	out := map[string]v1.EgressMemberSlice{}
	var ips []string
	for _, s := range l.Items {
		out[s.Name] = s
		for _, m := range s.Members {
			ips = append(ips, m.PodIP+"@"+m.HostIP)
		}
	}
	slices.Sort(ips)
	return out, ips
}

func (cl *cluster) waitMembers(egress string, want ...string) map[string]v1.EgressMemberSlice {
	cl.t.Helper()
	slices.Sort(want)
	var got map[string]v1.EgressMemberSlice
	cl.eventually(fmt.Sprintf("members of %s = %v", egress, want), func() (bool, string) {
		var ips []string
		got, ips = cl.membersOf(egress)
		return slices.Equal(ips, want), fmt.Sprintf("%v", ips)
	})
	return got
}

// TestMemberSlices publishes the Pods an Egress selects, follows label,
// namespace and Pod changes, and gives a Pod to the older of two Egresses.
func TestMemberSlices(t *testing.T) {
	cl := newCluster(t, "mem", 1, 10)
	cl.pool("mem", nil)
	cl.namespace("mem-pay", map[string]string{"team": "pay"})
	cl.namespace("mem-other", nil)
	old := cl.egressSel("mem-old", "mem", map[string]string{"team": "pay"}, map[string]string{"app": "web"})
	cl.createPod("mem-pay", "web1", "mem-n1", map[string]string{"app": "web"}, "192.0.2.11", "10.1.0.1", "fd00::1")
	cl.createPod("mem-pay", "db", "mem-n1", map[string]string{"app": "db"}, "192.0.2.11", "10.1.0.2")
	cl.createPod("mem-other", "web2", "mem-n1", map[string]string{"app": "web"}, "192.0.2.12", "10.1.0.3")
	hn := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "mem-pay", Name: "hostnet", Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{NodeName: "mem-n1", HostNetwork: true, Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/c"}}}}
	if err := cl.c.Create(cl.ctx, hn); err != nil {
		t.Fatal(err)
	}

	got := cl.waitMembers("mem-old", "10.1.0.1@192.0.2.11")
	for _, s := range got {
		if s.Labels[v1.EgressLabel] != "mem-old" || len(s.OwnerReferences) != 1 || s.OwnerReferences[0].UID != old.UID {
			t.Errorf("slice %s: labels %v owners %v, want the Egress label and owner", s.Name, s.Labels, s.OwnerReferences)
		}
	}

	// The namespace gains the label: web2 joins.
	var ns corev1.Namespace
	if err := cl.c.Get(cl.ctx, client.ObjectKey{Name: "mem-other"}, &ns); err != nil {
		t.Fatal(err)
	}
	ns.Labels = map[string]string{"team": "pay"}
	if err := cl.c.Update(cl.ctx, &ns); err != nil {
		t.Fatal(err)
	}
	cl.waitMembers("mem-old", "10.1.0.1@192.0.2.11", "10.1.0.3@192.0.2.12")

	// A younger Egress selecting the whole namespace gets only what the
	// older one leaves: db.
	cl.egressSel("mem-young", "mem", map[string]string{"team": "pay"}, nil)
	cl.waitMembers("mem-young", "10.1.0.2@192.0.2.11")

	// web1 changes its label: it moves to the younger Egress.
	var p corev1.Pod
	if err := cl.c.Get(cl.ctx, client.ObjectKey{Namespace: "mem-pay", Name: "web1"}, &p); err != nil {
		t.Fatal(err)
	}
	p.Labels = map[string]string{"app": "api"}
	if err := cl.c.Update(cl.ctx, &p); err != nil {
		t.Fatal(err)
	}
	cl.waitMembers("mem-young", "10.1.0.1@192.0.2.11", "10.1.0.2@192.0.2.11")
	cl.waitMembers("mem-old", "10.1.0.3@192.0.2.12")

	// The Pod terminates: it leaves.
	p.Status.Phase = corev1.PodSucceeded
	if err := cl.c.Status().Update(cl.ctx, &p); err != nil {
		t.Fatal(err)
	}
	cl.waitMembers("mem-young", "10.1.0.2@192.0.2.11")

	// The Egress is deleted: its slices go (no garbage collector runs in
	// this control plane; the controller removes them itself).
	if err := cl.c.Delete(cl.ctx, old); err != nil {
		t.Fatal(err)
	}
	cl.waitMembers("mem-old")
}

// TestMemberSlicesStableAt250 spreads 250 Pods over 3 slices of at most
// 100, and checks that deleting one Pod rewrites exactly one slice.
func TestMemberSlicesStableAt250(t *testing.T) {
	cl := newCluster(t, "many", 1, 10)
	cl.pool("many", nil)
	cl.namespace("many-ns", map[string]string{"team": "many"})
	cl.egressSel("many-e", "many", map[string]string{"team": "many"}, nil)
	var want []string
	for i := range 250 {
		ip := fmt.Sprintf("10.2.%d.%d", i/200, i%200+1)
		cl.createPod("many-ns", fmt.Sprintf("p%d", i), "many-n1", nil, "192.0.2.11", ip)
		want = append(want, ip+"@192.0.2.11")
	}
	before := cl.waitMembers("many-e", want...)
	if len(before) != 3 {
		t.Fatalf("%d slices for 250 members, want 3", len(before))
	}
	for _, s := range before {
		if len(s.Members) > v1.MaxMembersPerSlice {
			t.Errorf("slice %s has %d members", s.Name, len(s.Members))
		}
	}
	// Without a kubelet a graceful delete never completes (a terminating
	// Pod still runs and stays a member): delete at once.
	if err := cl.c.Delete(cl.ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "many-ns", Name: "p7"}}, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	after := cl.waitMembers("many-e", slices.DeleteFunc(slices.Clone(want), func(s string) bool { return strings.HasPrefix(s, "10.2.0.8@") })...)
	changed := 0
	for name, s := range after {
		if before[name].ResourceVersion != s.ResourceVersion {
			changed++
		}
	}
	if changed != 1 || len(after) != 3 {
		t.Errorf("deleting one Pod rewrote %d slices (now %d slices), want 1 (3)", changed, len(after))
	}
}

// TestNoEgressNode: an Egress whose pool has no eligible Node is
// Ready=False NoEgressNode with its failurePolicy in the message, and gets a
// Warning Event.
func TestNoEgressNode(t *testing.T) {
	cl := newCluster(t, "noden", 1, 10)
	cl.pool("noden", func(p *v1.ExternalIPPool) {
		p.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"egress": "nowhere"}}
	})
	e := cl.egress("noden-a", "noden", "")
	cl.egress("noden-b", "noden", "")
	// A merge patch: the controller may have written the status since.
	patch := client.MergeFrom(e.DeepCopy())
	e.Spec.FailurePolicy = v1.FailurePolicyIgnore
	if err := cl.c.Patch(cl.ctx, e, patch); err != nil {
		t.Fatal(err)
	}
	cl.eventually("noden-b Assigned=False says no Node matches", func() (bool, string) {
		e := cl.get("noden-b")
		c := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionAssigned)
		return c != nil && c.Reason == v1.ReasonNoEligibleNode && strings.Contains(c.Message, `Nodes matches the nodeSelector of pool "noden"`), describe(e)
	})
	for name, want := range map[string]string{"noden-a": "failurePolicy Ignore", "noden-b": "failurePolicy Fail"} {
		cl.eventually(name+" Ready=False NoEgressNode", func() (bool, string) {
			e := cl.get(name)
			c := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionReady)
			return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1.ReasonNoEgressNode && strings.Contains(c.Message, want), describe(e)
		})
		cl.eventually(name+" NoEgressNode Event", func() (bool, string) {
			var evs eventsv1.EventList
			if err := cl.c.List(cl.ctx, &evs); err != nil {
				return false, err.Error()
			}
			// The Event of the Egress's latest failurePolicy: one may also
			// have been recorded for the policy before the patch.
			var notes []string
			for _, ev := range evs.Items {
				if ev.Regarding.Name == name && ev.Reason == v1.ReasonNoEgressNode && ev.Type == corev1.EventTypeWarning {
					if strings.Contains(ev.Note, want) {
						return true, ""
					}
					notes = append(notes, ev.Note)
				}
			}
			return false, fmt.Sprintf("NoEgressNode Events: %q", notes)
		})
	}
}

func (cl *cluster) egressSel(name, pool string, nsSel, podSel map[string]string) *v1.Egress {
	cl.t.Helper()
	e := &v1.Egress{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.EgressSpec{ExternalIPPool: pool}}
	if nsSel != nil {
		e.Spec.AppliedTo.NamespaceSelector = &metav1.LabelSelector{MatchLabels: nsSel}
	}
	if podSel != nil {
		e.Spec.AppliedTo.PodSelector = &metav1.LabelSelector{MatchLabels: podSel}
	}
	if err := cl.c.Create(cl.ctx, e); err != nil {
		cl.t.Fatal(err)
	}
	cl.t.Cleanup(func() { _ = env.Client.Delete(context.Background(), e) })
	return e
}
