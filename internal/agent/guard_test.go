package agent_test

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/egressip/egressip/internal/testutil/poll"
)

// TestTakeoverGuardWaitsForPreviousHolder: the peer namespace (another
// host on the Node's link) holds two IPs assigned to the Node, as a
// cut-off Node that has not fenced yet would. The agent binds a free IP at
// once, holds the two back without refusing them while the peer answers
// ARP / ND for them, and binds and announces them once the peer lets go.
func TestTakeoverGuardWaitsForPreviousHolder(t *testing.T) {
	env := apiServer(t)
	c := env.Client
	n := newTestNode(t)
	p4 := createPool(t, c, "192.0.2.0/24", "192.0.2.1", 24)
	p6 := createPool(t, c, "2001:db8::/64", "2001:db8::1", 64)
	taken4, taken6, free := ip("192.0.2.30"), ip("2001:db8::30"), ip("192.0.2.31")
	n.Peer.MustIP(t, "addr", "add", "192.0.2.30/32", "dev", n.PeerIf)
	n.Peer.MustIP(t, "-6", "addr", "add", "2001:db8::30/128", "dev", n.PeerIf, "nodad")
	createEgress(t, c, "taken4", p4, taken4.String(), n.name)
	createEgress(t, c, "taken6", p6, taken6.String(), n.name)
	createEgress(t, c, "free", p4, free.String(), n.name)
	heldBefore := metricValue(t, "egressip_agent_takeover_guard_total", map[string]string{"outcome": "held"})

	cfg := n.config()
	cfg.TakeoverGuard = time.Minute // no expiry within the test
	r := startAgent(t, env.Config, n.name, newAgent(t, cfg))
	poll.Until(t, 15*time.Second, "the free IP bound and announced", func() error {
		rep, err := r.report(ctx)
		if err != nil {
			return err
		}
		return wantReport(rep, n.NodeIf, true, free)
	})
	// Held for as long as the peer answers: a second, several probe rounds.
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		for _, a := range []netip.Addr{taken4, taken6} {
			if n.present(t, a) {
				t.Fatalf("%s bound while the peer still answers for it", a)
			}
		}
	}
	rep, err := r.report(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Refused) != 0 {
		t.Errorf("held IPs reported as refused: %+v", rep.Refused)
	}
	if held := metricValue(t, "egressip_agent_takeover_guard_total", map[string]string{"outcome": "held"}) - heldBefore; held < 4 {
		t.Errorf("takeover guard counted %v holds in a second for two IPs, want several rounds", held)
	}

	released := time.Now()
	n.Peer.MustIP(t, "addr", "del", "192.0.2.30/32", "dev", n.PeerIf)
	n.Peer.MustIP(t, "-6", "addr", "del", "2001:db8::30/128", "dev", n.PeerIf)
	poll.Until(t, 5*time.Second, "both held IPs bound and announced after the peer let go", func() error {
		rep, err := r.report(ctx)
		if err != nil {
			return err
		}
		return wantReport(rep, n.NodeIf, true, free, taken4, taken6)
	})
	t.Logf("bound and announced %v after the peer let go", time.Since(released))
}

// TestTakeoverGuardExpires: a host that keeps answering for an IP (not an
// egressip Node letting go) holds the bind back for --takeover-guard only;
// then the IP is bound and the duplicate-IP check reports the conflict.
func TestTakeoverGuardExpires(t *testing.T) {
	env := apiServer(t)
	c := env.Client
	n := newTestNode(t)
	p4 := createPool(t, c, "192.0.2.0/24", "192.0.2.1", 24)
	taken := ip("192.0.2.32")
	n.Peer.MustIP(t, "addr", "add", "192.0.2.32/32", "dev", n.PeerIf)
	createEgress(t, c, "kept", p4, taken.String(), n.name)
	expiredBefore := metricValue(t, "egressip_agent_takeover_guard_total", map[string]string{"outcome": "expired"})

	cfg := n.config()
	cfg.TakeoverGuard = 700 * time.Millisecond
	start := time.Now()
	r := startAgent(t, env.Config, n.name, newAgent(t, cfg))
	poll.Until(t, 15*time.Second, "the IP bound once the guard expired", func() error {
		if !n.present(t, taken) {
			return fmt.Errorf("%s not bound yet", taken)
		}
		return nil
	})
	if d := time.Since(start); d < cfg.TakeoverGuard {
		t.Errorf("%s bound %v after the start, before the guard (%v) expired", taken, d, cfg.TakeoverGuard)
	}
	if got := metricValue(t, "egressip_agent_takeover_guard_total", map[string]string{"outcome": "expired"}) - expiredBefore; got != 1 {
		t.Errorf("takeover guard counted %v expiries, want 1", got)
	}
	var peerMAC string
	if err := n.Peer.Do(func() error {
		ifi, err := net.InterfaceByName(n.PeerIf)
		if err == nil {
			peerMAC = ifi.HardwareAddr.String()
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "the conflict reported", func() error {
		rep, err := r.report(ctx)
		if err != nil {
			return err
		}
		for _, cf := range rep.Conflicts {
			if cf.IP == taken && len(cf.MACs) > 0 && cf.MACs[0] == peerMAC {
				return nil
			}
		}
		return fmt.Errorf("conflicts %+v, want %s answered by the peer", rep.Conflicts, taken)
	})
}
