package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/test/e2e/harness"
)

// fallbackNode is the Node whose agent runs in forced-fallback mode
// (--address-ownership=record: IFA_PROTO neither written nor read).
func fallbackNode(t *testing.T) *harness.Node {
	t.Helper()
	for _, n := range c.Nodes {
		if n.ForcedFallback {
			return n
		}
	}
	t.Fatal("no Node runs in forced-fallback mode (harness.Config.RecordNodes)")
	return nil
}

// recorded reads n's ownership record: the IPs it lists (nil when the file
// does not exist yet).
func recorded(t *testing.T, n *harness.Node) []netip.Addr {
	t.Helper()
	raw, err := os.ReadFile(n.Record)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Addresses []struct {
			IP netip.Addr `json:"ip"`
		} `json:"addresses"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatalf("ownership record of %s: %v", n.Name, err)
	}
	var out []netip.Addr
	for _, a := range f.Addresses {
		out = append(out, a.IP)
	}
	return out
}

// waitRecorded waits until n's record lists ip (want) or does not.
func waitRecorded(t *testing.T, n *harness.Node, ip netip.Addr, want bool) {
	t.Helper()
	if !harness.WaitFor(context.Background(), 15*time.Second, func() bool { return slices.Contains(recorded(t, n), ip) == want }) {
		t.Fatalf("ownership record of %s: lists %s = %v, want %v (it lists %v)", n.Name, ip, !want, want, recorded(t, n))
	}
}

// placeOn creates Egress name from the sample pool with every other Node
// cordoned, so it lands on n, and uncordons them once it is Ready.
func placeOn(t *testing.T, name string, n *harness.Node) *v1.Egress {
	t.Helper()
	ctx := context.Background()
	uncordon := func() {
		for _, o := range c.Nodes {
			if o != n {
				_ = c.Cordon(ctx, o.Name, false)
			}
		}
	}
	t.Cleanup(uncordon)
	for _, o := range c.Nodes {
		if o != n {
			if err := c.Cordon(ctx, o.Name, true); err != nil {
				t.Fatal(err)
			}
		}
	}
	newEgress(t, name, "office-egress", "")
	e := waitReady(t, name)[name]
	uncordon()
	if e.Status.EgressNode != n.Name {
		t.Fatalf("%s landed on %s; want %s", name, e.Status.EgressNode, n.Name)
	}
	return e
}

// TestFallbackNode runs the crash failover, the planned move and the
// agent restart of the other scenarios with an Egress on the Node whose
// agent keeps ownership in its record alone (forced fallback), and checks
// the record along the way.
func TestFallbackNode(t *testing.T) {
	n := fallbackNode(t)
	ctx := context.Background()

	t.Run("AgentRestart", func(t *testing.T) {
		e := placeOn(t, "fb-restart", n)
		ip := netip.MustParseAddr(e.Status.EgressIP)
		waitRecorded(t, n, ip, true)
		replacedInPlace(t, e, "agent restart (forced fallback)", func(n *harness.Node) {
			c.StopAgent(n, syscall.SIGTERM)
			time.Sleep(time.Second)
			if err := c.StartAgent(n); err != nil {
				t.Fatal(err)
			}
			time.Sleep(3 * time.Second)
		})
		// Adopted from the record: still listed, and released on delete.
		waitRecorded(t, n, ip, true)
		deleteEgress(e.Name)
		waitRecorded(t, n, ip, false)
	})

	t.Run("PlannedMove", func(t *testing.T) {
		e := placeOn(t, "fb-move", n)
		ip := netip.MustParseAddr(e.Status.EgressIP)
		waitRecorded(t, n, ip, true)
		m, err := c.CordonAndWait(ctx, e.Name, 20*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Cordon(ctx, n.Name, false); err != nil {
			t.Fatal(err)
		}
		if m.From != n {
			t.Fatalf("moved from %s; want %s", m.From.Name, n.Name)
		}
		waitRecorded(t, n, ip, false)
		after, err := c.Egress(ctx, e.Name)
		if err != nil {
			t.Fatal(err)
		}
		checkReachable(t, after)
		t.Logf("planned move off the fallback Node: ARP gap %v, %d answers", m.Gap, m.Replies)
	})

	t.Run("CrashFailover", func(t *testing.T) {
		e := placeOn(t, "fb-crash", n)
		ip := netip.MustParseAddr(e.Status.EgressIP)
		waitRecorded(t, n, ip, true)
		f, err := c.CrashAndWait(ctx, e.Name, 20*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if f.From != n {
			t.Fatalf("failed over from %s; want %s", f.From.Name, n.Name)
		}
		after, err := c.Egress(ctx, e.Name)
		if err != nil {
			t.Fatal(err)
		}
		checkReachable(t, after)
		// The revived Node lost the address with its kernel state; its
		// agent drops the stale record entry and does not take the IP.
		if err := c.ReviveNode(n); err != nil {
			t.Fatal(err)
		}
		waitRecorded(t, n, ip, false)
		time.Sleep(2 * time.Second) // let the revived agent be seen alive again
		again, err := c.Egress(ctx, e.Name)
		if err != nil {
			t.Fatal(err)
		}
		if again.Status.EgressNode != f.To.Name {
			t.Fatalf("after the revival: %s; want it still on %s", harness.Describe(again), f.To.Name)
		}
		checkReachable(t, again)
		t.Logf("crash of the fallback Node to ARP answered by %s: %v", f.To.Name, f.Took)
	})
}
