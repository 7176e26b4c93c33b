package conflict

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"

	"github.com/egressip/egressip/internal/testutil/netnstest"
)

// wire is a Node namespace (the prober) and a second namespace on the same
// link (the rogue) that can bind the Node's egress IPs and answer for them
// with its own kernel.
type wire struct {
	pair   *netnstest.Pair
	prober *Prober
	rogue  string // the rogue's MAC
	own    string // the Node's MAC
}

func newWire(t *testing.T) *wire {
	t.Helper()
	p := netnstest.NewPair(t)
	// The Node holds the egress IPs, as the agent binds them (host routes;
	// IPv6 without DAD), plus an address of its own on the link.
	p.Node.MustIP(t, "addr", "add", "192.0.2.11/24", "dev", p.NodeIf)
	p.Node.MustIP(t, "addr", "add", ip4.String()+"/32", "dev", p.NodeIf)
	p.Node.MustIP(t, "addr", "add", ip6.String()+"/128", "dev", p.NodeIf, "nodad")
	p.Peer.MustIP(t, "addr", "add", "192.0.2.99/24", "dev", p.PeerIf)
	pr, err := NewProber(p.Node.Handle, ProbeConfig{Probes: 2, Spacing: 100 * time.Millisecond, Wait: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pr.Close() })
	return &wire{pair: p, prober: pr,
		rogue: strings.ToLower(p.Peer.Interface(t, p.PeerIf).HardwareAddr.String()),
		own:   strings.ToLower(p.Node.Interface(t, p.NodeIf).HardwareAddr.String())}
}

func (w *wire) foreign(t *testing.T, ips ...netip.Addr) map[netip.Addr][]string {
	t.Helper()
	answers, err := w.prober.Probe(context.Background(), w.pair.NodeIf, ips)
	if err != nil {
		t.Fatalf("Probe: %v", err)
	}
	own, err := w.prober.OwnMACs()
	if err != nil {
		t.Fatal(err)
	}
	if !own[w.own] {
		t.Fatalf("OwnMACs %v lacks the Node's %s", own, w.own)
	}
	return Foreign(answers, ips, own)
}

// TestProbeOnTheWire runs real probe rounds between two network
// namespaces: nothing answers while only the Node holds the addresses
// (the Node's own kernel never answers its own probes, and its own
// announcements are ignored); once the second namespace binds them its
// kernel answers the ARP probe and the DAD-style NS, naming its MAC; when
// it lets them go the next round is clean again.
func TestProbeOnTheWire(t *testing.T) {
	w := newWire(t)
	if got := w.foreign(t, ip4, ip6); len(got) != 0 {
		t.Fatalf("only the Node holds the IPs, yet foreign answers: %v", got)
	}

	w.pair.Peer.MustIP(t, "addr", "add", ip4.String()+"/32", "dev", w.pair.PeerIf)
	w.pair.Peer.MustIP(t, "addr", "add", ip6.String()+"/128", "dev", w.pair.PeerIf, "nodad")
	want := map[netip.Addr][]string{ip4: {w.rogue}, ip6: {w.rogue}}
	if d := cmp.Diff(want, w.foreign(t, ip4, ip6)); d != "" {
		t.Fatalf("the rogue binds both IPs (-want +got):\n%s", d)
	}
	// Per family on its own, too.
	if d := cmp.Diff(map[netip.Addr][]string{ip6: {w.rogue}}, w.foreign(t, ip6)); d != "" {
		t.Fatalf("IPv6 alone (-want +got):\n%s", d)
	}

	w.pair.Peer.MustIP(t, "addr", "del", ip4.String()+"/32", "dev", w.pair.PeerIf)
	w.pair.Peer.MustIP(t, "addr", "del", ip6.String()+"/128", "dev", w.pair.PeerIf)
	if got := w.foreign(t, ip4, ip6); len(got) != 0 {
		t.Fatalf("the rogue left, yet foreign answers: %v", got)
	}
}

// TestCheckerOnTheWire runs the Checker (start, kick, periodic) against the
// real wire and checks the conflict's life: it starts when the rogue binds
// the IP, keeps its Since while it lasts, and ends after one clean round.
func TestCheckerOnTheWire(t *testing.T) {
	w := newWire(t)
	rounds := make(chan Round, 16)
	c := NewChecker(w.prober, func() []Target { return []Target{{ip4, w.pair.NodeIf}, {ip6, w.pair.NodeIf}} },
		time.Hour, func(r Round) { rounds <- r }, logr.Discard())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	next := func(what string) Round {
		t.Helper()
		select {
		case r := <-rounds:
			return r
		case <-time.After(30 * time.Second):
			t.Fatalf("no round %s", what)
		}
		return Round{}
	}
	if r := next("at start"); len(r.Conflicts) != 0 || len(r.Errors) != 0 {
		t.Fatalf("start: %+v", r)
	}
	w.pair.Peer.MustIP(t, "addr", "add", ip4.String()+"/32", "dev", w.pair.PeerIf)
	c.Kick()
	r := next("after the kick")
	if len(r.Conflicts) != 1 || r.Conflicts[0].IP != ip4 || r.Conflicts[0].MACs[0] != w.rogue || len(r.Started) != 1 {
		t.Fatalf("after the rogue bound %v: %+v", ip4, r)
	}
	since := r.Conflicts[0].Since
	c.Kick()
	if r := next("second"); len(r.Conflicts) != 1 || !r.Conflicts[0].Since.Equal(since) || len(r.Started) != 0 {
		t.Fatalf("second round: %+v", r)
	}
	w.pair.Peer.MustIP(t, "addr", "del", ip4.String()+"/32", "dev", w.pair.PeerIf)
	c.Kick()
	if r := next("after the rogue left"); len(r.Conflicts) != 0 || len(r.Ended) != 1 || r.Ended[0] != ip4 {
		t.Fatalf("after the rogue left: %+v", r)
	}
}

// TestProbeErrors: a missing interface is an error, naming it.
func TestProbeErrors(t *testing.T) {
	w := newWire(t)
	_, err := w.prober.Probe(context.Background(), "nosuch0", []netip.Addr{ip4})
	if err == nil || !strings.Contains(err.Error(), "nosuch0") {
		t.Fatalf("Probe on a missing interface: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := w.prober.Probe(ctx, w.pair.NodeIf, []netip.Addr{ip4}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Probe: %v", err)
	}
}
