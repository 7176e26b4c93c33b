package e2e

import (
	"context"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/test/e2e/harness"
)

// failoverBound is the failover bound of docs/failover.md: a crashed
// Node's IPs answer from another Node about 3-4 s after the crash with the
// default flags, and the target is 5 s.
const failoverBound = 5 * time.Second

// TestReleaseWaitBoundedStaleAgent is issue 16's reproduction of the wait
// with no end: the Node holding the Egress turns Ready=Unknown and is
// cordoned, and its agent, which still answers the controller's polls with
// the IP bound and announced, can no longer reach the API server (its
// packets to the API server's port are dropped), so its cache keeps the
// old assignment. The poll's release instruction makes it release: the
// Egress is Ready on another Node within the failover bound, before the
// release timeout, and the client never sees the old Node answer ARP after
// the new one did.
func TestReleaseWaitBoundedStaleAgent(t *testing.T) {
	ctx := context.Background()
	const name = "release-wait"
	newEgress(t, name, "office-egress", "")
	e := waitReady(t, name)[name]
	ip := netip.MustParseAddr(e.Status.EgressIP)
	from := c.Node(e.Status.EgressNode)
	w, err := c.WatchARP(ip, 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	time.Sleep(200 * time.Millisecond)
	if err := c.CutAPIServer(from); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Reconnect and restart the agent, so that the next tests meet an
		// agent whose cache is current (its hung watch would recover on
		// its own, but not at a known time).
		if err := c.RestoreAPIServer(from); err != nil {
			t.Error(err)
		}
		if err := c.SetNodeReady(ctx, from.Name, corev1.ConditionTrue); err != nil {
			t.Error(err)
		}
		if err := c.Cordon(ctx, from.Name, false); err != nil {
			t.Error(err)
		}
		c.StopAgent(from, syscall.SIGTERM)
		if err := c.StartAgent(from); err != nil {
			t.Error(err)
		}
		time.Sleep(2 * time.Second)
	})
	start := time.Now()
	if err := c.SetNodeReady(ctx, from.Name, corev1.ConditionUnknown); err != nil {
		t.Fatal(err)
	}
	if err := c.Cordon(ctx, from.Name, true); err != nil {
		t.Fatal(err)
	}
	var to *harness.Node
	var last *v1.Egress
	if !harness.WaitFor(ctx, 20*time.Second, func() bool {
		e, err := c.Egress(ctx, name)
		if err != nil {
			return false
		}
		last = e
		to = c.Node(e.Status.EgressNode)
		return to != nil && to != from && meta.IsStatusConditionTrue(e.Status.Conditions, v1.ConditionReady)
	}) {
		t.Fatalf("not Ready on another Node 20 s after %s turned Ready=Unknown and was cordoned: %s", from.Name, harness.Describe(last))
	}
	took := time.Since(start)
	time.Sleep(500 * time.Millisecond) // would the old Node still answer?
	replies := w.Stop()
	lastOld, firstNew := start, time.Time{}
	for _, r := range replies {
		if r.MAC == from.MAC.String() && r.At.After(lastOld) {
			lastOld = r.At
		}
		if r.MAC == to.MAC.String() && firstNew.IsZero() {
			firstNew = r.At
		}
	}
	if firstNew.IsZero() {
		t.Fatalf("%s never answered ARP from %s", ip, to.Name)
	}
	for _, r := range replies {
		if r.At.After(firstNew) && r.MAC != to.MAC.String() {
			t.Fatalf("two answering Nodes: %s answered for %s %v after %s first did", r.MAC, ip, r.At.Sub(firstNew), to.Name)
		}
	}
	if took > failoverBound {
		t.Errorf("Ready on %s %v after the cut, want within the failover bound %v", to.Name, took, failoverBound)
	}
	if held, err := c.HasAddress(from, ip); err != nil || held {
		t.Errorf("%s still bound on %s (%v): its agent did not release it", ip, from.Name, err)
	}
	if c := meta.FindStatusCondition(last.Status.Conditions, v1.ConditionAssigned); c == nil || strings.Contains(c.Message, "still reports it bound") {
		t.Errorf("the move went by the release timeout, not the instruction: %s", harness.Describe(last))
	}
	t.Logf("Ready on %s %v after %s turned Ready=Unknown and was cordoned; ARP silence %v; first answer from the new Node %v after the cut",
		to.Name, took, from.Name, firstNew.Sub(lastOld), firstNew.Sub(start))
}
