package agent_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/report"
	"github.com/egressip/egressip/internal/testutil/poll"
)

// TestAcquireBindsAheadOfStatus is the agent's side of the poll's acquire
// instruction (issue 22 goal 2), on real netlink in a network namespace
// against a real API server: the Egresses' statuses name another (dead)
// Node; a poll asking this Node to acquire one binds and announces it
// before any status names this Node, and the status written afterwards
// keeps it bound without a gap although the polls stop carrying the
// instruction. An instruction the polls stop carrying while no status
// follows is dropped within its lifetime; one whose IP does not match the
// cached status, or for an Egress the poll also asks to release, binds
// nothing; an agent that reports acquires says so (report.Acquires).
func TestAcquireBindsAheadOfStatus(t *testing.T) {
	env := apiServer(t)
	c := env.Client
	n := newTestNode(t)
	dead := uniq("dead-node")
	pool := createPool(t, c, "192.0.2.0/24", "192.0.2.1", 24)
	moved := createEgress(t, c, "moved", pool, "192.0.2.20", dead)
	abandoned := createEgress(t, c, "abandoned", pool, "192.0.2.21", dead)
	wrongIP := createEgress(t, c, "wrong-ip", pool, "192.0.2.22", dead)
	released := createEgress(t, c, "released", pool, "192.0.2.23", dead)

	r := startAgent(t, env.Config, n.name, newAgent(t, n.config()))
	cl := report.NewClient(r.port, 2*time.Second)
	loop := netip.MustParseAddr("127.0.0.1")
	acq := func(name, ip string) report.Acquire {
		var e v1alpha1.Egress
		if err := c.Get(ctx, client.ObjectKey{Name: name}, &e); err != nil {
			t.Fatal(err)
		}
		return report.Acquire{IP: netip.MustParseAddr(ip), UID: string(e.UID), ResourceVersion: e.ResourceVersion, Egress: name}
	}
	pollWith := func(p report.Poll) report.Report {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		rep, err := cl.Get(cctx, loop, p)
		if err != nil {
			t.Fatalf("poll: %v", err)
		}
		return rep
	}
	rep := pollWith(report.Poll{})
	if !rep.Acquires {
		t.Fatalf("report %+v does not say the agent takes acquire instructions", rep)
	}
	if len(rep.Bound) != 0 {
		t.Fatalf("bound %v before any instruction, want nothing (every status names %s)", rep.Bound, dead)
	}

	rel := acq(released, "192.0.2.23")
	p := report.Poll{
		Acquires: []report.Acquire{acq(moved, "192.0.2.20"), acq(abandoned, "192.0.2.21"), acq(wrongIP, "192.0.2.99"), rel},
		Releases: []report.Release{report.Release(rel)},
	}
	// The poll that brings the instructions is answered once they are
	// announced, or after at most 150 ms (logged, not asserted: timing).
	asked := time.Now()
	first := wantReport(pollWith(p), n.NodeIf, true, ip("192.0.2.20"), ip("192.0.2.21"))
	t.Logf("the first poll's report, answered after %v: %v", time.Since(asked).Round(time.Millisecond), cmpOrOK(first))
	poll.Until(t, 10*time.Second, "the acquired IPs are bound and announced", func() error {
		return wantReport(pollWith(p), n.NodeIf, true, ip("192.0.2.20"), ip("192.0.2.21"))
	})
	if _, err := n.capture.waitAnnouncements(5*time.Second, ip("192.0.2.20"), ip("192.0.2.21")); err != nil {
		t.Fatalf("peer: %v", err)
	}
	for _, s := range []string{"192.0.2.22", "192.0.2.23", "192.0.2.99"} {
		if n.present(t, ip(s)) {
			t.Errorf("%s is on the Node: a mismatched or released acquire must bind nothing", s)
		}
	}

	// The controller writes the move of "moved" and stops carrying both
	// instructions; "abandoned" gets no status.
	setStatus(t, c, moved, "192.0.2.20", n.name)
	start := time.Now()
	poll.Until(t, 10*time.Second, "the abandoned acquire is dropped", func() error {
		return wantReport(pollWith(report.Poll{}), n.NodeIf, true, ip("192.0.2.20"))
	})
	if d := time.Since(start); d < time.Second {
		t.Errorf("abandoned acquire dropped after %v: it must outlive a poll round (lifetime 1.5 s)", d)
	}
	// "moved" stayed bound throughout: its binding never left.
	for range 10 {
		if !n.present(t, ip("192.0.2.20")) {
			t.Fatal("192.0.2.20 left the Node after its status named the Node")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// cmpOrOK is err's message, or "as wanted" for nil.
func cmpOrOK(err error) string {
	if err != nil {
		return err.Error()
	}
	return "as wanted"
}
