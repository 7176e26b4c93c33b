package agent_test

import (
	"errors"
	"testing"
	"time"

	v1 "github.com/egressip/egressip/api/v1alpha1"

	"github.com/egressip/egressip/internal/agent/fence"
	"github.com/egressip/egressip/internal/testutil/poll"
)

// TestAgentFenceUnbindsAndRejoins: a fence decision makes the agent unbind
// every egress IP (netns, real kube-apiserver) and say so in its report;
// an Egress moved away while the Node is fenced is not bound again when the
// fence is lifted, the one still assigned is, and the rejoin ends once the
// cache agrees with the API server.
func TestAgentFenceUnbindsAndRejoins(t *testing.T) {
	env := apiServer(t)
	c := env.Client
	n := newTestNode(t)
	pool := createPool(t, c, "192.0.2.0/24", "192.0.2.1", 24)
	moving := createEgress(t, c, "fmove", pool, "192.0.2.40", n.name)
	createEgress(t, c, "fstay", pool, "192.0.2.41", n.name)
	a := newAgent(t, n.config())
	r := startAgent(t, env.Config, n.name, a)
	poll.Until(t, 15*time.Second, "both bound and announced", func() error {
		rep, err := r.report(ctx)
		if err != nil {
			return err
		}
		return wantReport(rep, n.NodeIf, true, ip("192.0.2.40"), ip("192.0.2.41"))
	})

	a.SetFence(ctx, fence.Decision{Fence: true, Reason: v1.ReasonPeersLost, Message: "test: isolated"})
	poll.Until(t, 10*time.Second, "every IP unbound while fenced", func() error {
		if n.present(t, ip("192.0.2.40")) || n.present(t, ip("192.0.2.41")) {
			return errors.New("still bound")
		}
		rep, err := r.report(ctx)
		if err != nil {
			return err
		}
		if rep.Fence == nil || !rep.Fence.Fenced || rep.Fence.Reason != v1.ReasonPeersLost {
			return errors.New("report does not say fenced")
		}
		return wantReport(rep, n.NodeIf, true)
	})
	if !a.Fenced() {
		t.Fatal("Fenced() false")
	}
	// A resync while fenced binds nothing (ResyncPeriod is 2 s here).
	time.Sleep(2500 * time.Millisecond)
	if n.present(t, ip("192.0.2.41")) {
		t.Fatal("a resync bound an IP while fenced")
	}
	// Meanwhile the controller moved one Egress away.
	setStatus(t, c, moving, "192.0.2.40", uniq("other-node"))
	a.SetFence(ctx, fence.Decision{Reason: v1.ReasonPolled, Message: "test: polled again"})
	poll.Until(t, 15*time.Second, "the assigned IP back, the moved one not, rejoin over", func() error {
		if n.present(t, ip("192.0.2.40")) {
			t.Fatal("192.0.2.40, moved away while fenced, bound again")
		}
		rep, err := r.report(ctx)
		if err != nil {
			return err
		}
		if rep.Fence == nil || rep.Fence.Fenced || rep.Fence.Rejoining {
			return errors.New("report still fenced or rejoining")
		}
		return wantReport(rep, n.NodeIf, true, ip("192.0.2.41"))
	})
	if n.present(t, ip("192.0.2.40")) {
		t.Fatal("192.0.2.40 bound after the rejoin")
	}
}
