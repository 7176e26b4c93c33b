package e2e

import (
	"context"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/egressip/egressip/test/e2e/harness"
)

// agentGoneBound is how long after the new Node's first ARP answer the
// old Node may still answer when its agent is gone: its addresses expire
// --address-lifetime (3 s) after the last renewal plus up to 1 s of the
// kernel's expiry check (net/ipv4/devinet.c check_lifetime), and the IP
// moves no sooner than --agent-dead-after (3 s) after the agent stopped
// answering; so at most about 1 s, plus the ARP watcher's interval.
const agentGoneBound = 1500 * time.Millisecond

// TestAgentGoneSIGKILL kills the agent of the Node holding an Egress with
// SIGKILL and does not restart it while the Node stays up (link up,
// answering ARP): the controller moves the IP after its dead-after, and
// the kernel removes the address from the old Node when its lifetime runs
// out, so the old Node stops answering ARP within agentGoneBound of the
// new Node's first answer, and the IP is gone from its namespace.
func TestAgentGoneSIGKILL(t *testing.T) {
	ctx := context.Background()
	const name = "agent-gone"
	newEgress(t, name, "office-egress", "")
	e := waitReady(t, name)[name]
	ip := netip.MustParseAddr(e.Status.EgressIP)
	from := c.Node(e.Status.EgressNode)
	w, err := c.WatchARP(ip, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	time.Sleep(200 * time.Millisecond)
	killed := time.Now()
	c.StopAgent(from, syscall.SIGKILL)
	t.Cleanup(func() {
		if err := c.StartAgent(from); err != nil {
			t.Error(err)
		}
		time.Sleep(2 * time.Second) // seen alive again before the next test
	})
	var firstNew time.Time
	var newMAC string
	if !harness.WaitFor(ctx, 20*time.Second, func() bool {
		for _, r := range w.Replies() {
			if r.At.After(killed) && r.MAC != from.MAC.String() {
				firstNew, newMAC = r.At, r.MAC
				return true
			}
		}
		return false
	}) {
		t.Fatalf("%s never answered ARP from another Node within 20 s of killing the agent of %s", ip, from.Name)
	}
	var gone time.Time
	if !harness.WaitFor(ctx, 10*time.Second, func() bool {
		held, err := c.HasAddress(from, ip)
		if err == nil && !held {
			gone = time.Now()
			return true
		}
		return false
	}) {
		t.Fatalf("%s still bound on %s 10 s after the new Node answered: the address outlived its agent", ip, from.Name)
	}
	time.Sleep(300 * time.Millisecond)
	replies := w.Stop()
	var lastOld time.Time
	for _, r := range replies {
		if r.MAC == from.MAC.String() {
			lastOld = r.At
		}
	}
	overlap := lastOld.Sub(firstNew)
	if overlap > agentGoneBound {
		t.Errorf("%s answered ARP for %s until %v after the new Node's first answer, want at most %v", from.Name, ip, overlap, agentGoneBound)
	}
	got, err := c.WaitReady(ctx, 20*time.Second, name)
	if err != nil {
		t.Fatal(err)
	}
	if to := c.Node(got[name].Status.EgressNode); to == nil || to == from || to.MAC.String() != newMAC {
		t.Fatalf("ARP answered by %s, but the status says %s", newMAC, harness.Describe(got[name]))
	}
	t.Logf("agent killed: new Node answered after %v, address gone from %s after %v, old Node's last answer %v after the new Node's first",
		firstNew.Sub(killed), from.Name, gone.Sub(killed), overlap)
}
