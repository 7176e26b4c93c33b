package agent_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/testutil/poll"
)

// createMultiEgress creates an Egress with spec.ips (count IPs from pool)
// and writes status.ips as the controller does (status.egressIP and
// egressNode repeating the first entry with a Node).
func createMultiEgress(t *testing.T, c client.Client, prefix, pool string, entries ...v1alpha1.EgressIPStatus) string {
	t.Helper()
	count := int32(len(entries))
	e := &v1alpha1.Egress{
		ObjectMeta: metav1.ObjectMeta{Name: uniq(prefix)},
		Spec: v1alpha1.EgressSpec{
			AppliedTo: v1alpha1.AppliedTo{PodSelector: &metav1.LabelSelector{}},
			IPs:       []v1alpha1.EgressIPSource{{Pool: pool, Count: &count}},
		},
	}
	if err := c.Create(ctx, e); err != nil {
		t.Fatalf("create Egress: %v", err)
	}
	t.Cleanup(func() { _ = c.Delete(ctx, e) })
	setMultiStatus(t, c, e.Name, entries...)
	return e.Name
}

// setMultiStatus writes status.ips of Egress name.
func setMultiStatus(t *testing.T, c client.Client, name string, entries ...v1alpha1.EgressIPStatus) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var e v1alpha1.Egress
		if err := c.Get(ctx, client.ObjectKey{Name: name}, &e); err != nil {
			return err
		}
		e.Status.IPs = entries
		e.Status.EgressIP, e.Status.EgressNode = "", ""
		for _, x := range entries {
			if x.Node != "" {
				e.Status.EgressIP, e.Status.EgressNode = x.IP, x.Node
				break
			}
		}
		return c.Status().Update(ctx, &e)
	})
	if err != nil {
		t.Fatalf("update status of Egress %s: %v", name, err)
	}
}

// TestMultiIPAgentBindsOwnEntries: with real netlink in a Node namespace
// and a real API server, the agent binds exactly the status.ips entries
// that name its Node, also of an Egress whose status.egressNode names
// another Node (found through the holder index, not the field selector),
// reports them bound and announced beside a single-IP Egress's IP, refuses
// an entry outside its pool, and releases an entry once it moves away.
func TestMultiIPAgentBindsOwnEntries(t *testing.T) {
	env := apiServer(t)
	c := env.Client
	n := newTestNode(t)
	other, third := uniq("other-node"), uniq("third-node")
	p4 := createPool(t, c, "192.0.2.0/24", "192.0.2.1", 24)
	narrow := createPool(t, c, "192.0.2.64/28", "192.0.2.1", 24)

	entry := func(ipS, pool, node string, ready bool) v1alpha1.EgressIPStatus {
		return v1alpha1.EgressIPStatus{IP: ipS, Pool: pool, Node: node, Ready: ready}
	}
	// First entry here: status.egressNode names this Node too.
	first := createMultiEgress(t, c, "multi-first", p4,
		entry("192.0.2.40", p4, n.name, false), entry("192.0.2.41", p4, other, true), entry("192.0.2.42", p4, third, true))
	// Second entry here: status.egressNode names another Node.
	second := createMultiEgress(t, c, "multi-second", p4,
		entry("192.0.2.50", p4, other, true), entry("192.0.2.51", p4, n.name, false))
	// An entry here whose IP lies outside its pool: refused.
	createMultiEgress(t, c, "multi-bad", narrow, entry("192.0.2.60", narrow, n.name, false))
	createEgress(t, c, "single", p4, "192.0.2.30", n.name)
	// Nothing of these is this Node's.
	createMultiEgress(t, c, "multi-theirs", p4, entry("192.0.2.70", p4, other, true), entry("192.0.2.71", p4, third, true))

	r := startAgent(t, env.Config, n.name, newAgent(t, n.config()))
	want := []string{"192.0.2.30", "192.0.2.40", "192.0.2.51"}
	poll.Until(t, 20*time.Second, "report lists this Node's entries as announced, and the refused one", func() error {
		rep, err := r.report(ctx)
		if err != nil {
			return err
		}
		if err := wantReport(rep, n.NodeIf, true, ip(want[0]), ip(want[1]), ip(want[2])); err != nil {
			return err
		}
		if len(rep.Refused) != 1 || rep.Refused[0].IP != ip("192.0.2.60") {
			return fmt.Errorf("refused %+v, want 192.0.2.60 alone", rep.Refused)
		}
		return nil
	})
	if _, err := n.capture.waitAnnouncements(5*time.Second, ip(want[0]), ip(want[1]), ip(want[2])); err != nil {
		t.Fatalf("peer: %v", err)
	}
	owned := n.owned(t)
	if len(owned) != 3 {
		t.Errorf("owned %v, want %v", owned, want)
	}
	for _, s := range []string{"192.0.2.41", "192.0.2.42", "192.0.2.50", "192.0.2.60", "192.0.2.70", "192.0.2.71"} {
		if n.present(t, ip(s)) {
			t.Errorf("%s (not this Node's, or refused) is on the Node", s)
		}
	}
	// The holder index lists the Egresses holding an IP here, whichever
	// entry it is.
	var held v1alpha1.EgressList
	if err := r.mgr.GetCache().List(ctx, &held, client.MatchingFields{"egressip.io/holder": n.name}); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, e := range held.Items {
		names[e.Name] = true
	}
	if !names[first] || !names[second] || len(names) != 4 {
		t.Errorf("holder index lists %v, want the 3 multi-IP Egresses with an entry here and the single-IP one", names)
	}

	// The second Egress's entry moves to a third Node: released here, the
	// first Egress's entry stays.
	setMultiStatus(t, c, second, entry("192.0.2.50", p4, other, true), entry("192.0.2.51", p4, third, false))
	poll.Until(t, 15*time.Second, "192.0.2.51 released", func() error {
		if n.present(t, ip("192.0.2.51")) {
			return errors.New("still bound")
		}
		rep, err := r.report(ctx)
		if err != nil {
			return err
		}
		return wantReport(rep, n.NodeIf, true, ip("192.0.2.30"), ip("192.0.2.40"))
	})
}
