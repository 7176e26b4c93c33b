package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/egressip/egressip/test/e2e/harness"
)

// takeoverBound is the generous bound TestLeaderTakeover asserts on each
// takeover (the figures, about 3 to 4 s with the default lease timings,
// go in the note; docs/failover.md explains the window).
const takeoverBound = 15 * time.Second

// takeoverReplicas runs controller replicas beside the cluster's own and
// puts the cluster's own controller back, leading, when the test ends.
type takeoverReplicas struct {
	t          *testing.T
	n          int
	live       []*harness.Replica
	mainKilled bool
}

func newTakeoverReplicas(t *testing.T) *takeoverReplicas {
	r := &takeoverReplicas{t: t}
	t.Cleanup(r.restore)
	return r
}

// standby starts a replica and waits until it takes part in the election
// (its caches are synced by then: controller-runtime starts the election
// after them).
func (r *takeoverReplicas) standby() *harness.Replica {
	r.t.Helper()
	r.n++
	s, err := c.StartReplica(fmt.Sprintf("controller-r%d", r.n))
	if err != nil {
		r.t.Fatal(err)
	}
	r.live = append(r.live, s)
	if !harness.WaitFor(context.Background(), 60*time.Second, func() bool { return s.Logged("attempting to acquire leader lease") }) {
		r.t.Fatalf("replica %s never started its leader election", s.Name)
	}
	return s
}

// killLeader SIGKILLs the leader: the cluster's own controller the first
// time, then the replica leader. It returns when the process is gone.
func (r *takeoverReplicas) killLeader(leader *harness.Replica) {
	if leader == nil {
		c.StopController()
		r.mainKilled = true
		return
	}
	leader.Stop(syscall.SIGKILL)
}

func (r *takeoverReplicas) restore() {
	if !r.mainKilled {
		for _, s := range r.live {
			s.Stop(syscall.SIGTERM)
		}
		return
	}
	if err := c.StartController(); err != nil {
		r.t.Errorf("restart the cluster's controller: %v", err)
		return
	}
	// SIGTERM releases the Lease, so the cluster's controller takes over
	// at its next try.
	for _, s := range r.live {
		s.Stop(syscall.SIGTERM)
	}
	if !harness.WaitFor(context.Background(), 60*time.Second, func() bool {
		n, err := harness.PassCount(context.Background(), harness.ControllerMetricsAddr)
		return err == nil && n > 0
	}) {
		r.t.Errorf("the cluster's controller ran no pass within 60 s of being restarted")
	}
}

// takeover kills leader (nil: the cluster's controller) and measures the
// time until standby holds the Lease and until it has completed its first
// scheduling pass.
func (r *takeoverReplicas) takeover(leader, standby *harness.Replica) (lease, pass time.Duration) {
	r.t.Helper()
	ctx := context.Background()
	old := c.LeaseHolder(ctx)
	if old == "" {
		r.t.Fatal("no Lease holder before the kill")
	}
	if n, err := harness.PassCount(ctx, standby.MetricsAddr); err != nil || n != 0 {
		r.t.Fatalf("standby %s: %d passes before the kill (%v): it must not lead yet", standby.Name, n, err)
	}
	killed := time.Now()
	r.killLeader(leader)
	ok := harness.WaitFor(ctx, 2*takeoverBound, func() bool {
		if lease == 0 {
			if h := c.LeaseHolder(ctx); h != "" && h != old {
				lease = time.Since(killed)
			}
		}
		if pass == 0 {
			if n, err := harness.PassCount(ctx, standby.MetricsAddr); err == nil && n > 0 {
				pass = time.Since(killed)
			}
		}
		return lease > 0 && pass > 0
	})
	if !ok {
		r.t.Fatalf("standby %s: Lease taken after %v, first pass after %v (0: not within %v)", standby.Name, lease, pass, 2*takeoverBound)
	}
	return lease, pass
}

// TestLeaderTakeover runs two controller replicas and SIGKILLs the leader
// (so it cannot release the Lease), five times: each time the standby must
// hold the Lease and complete a scheduling pass (issue 22 goal 3: within
// 5 s; asserted here only within takeoverBound, the median is logged). The
// Egresses placed before keep their Node and IP across every takeover.
// Then the leader is killed and, at once, the Node holding an Egress
// crashes: the new leader, which never heard that agent, declares it dead
// DeadAfter after its first poll and the IP answers from another Node.
func TestLeaderTakeover(t *testing.T) {
	ctx := context.Background()
	egs := []string{"takeover-a", "takeover-b", "takeover-c"}
	for _, e := range egs {
		newEgress(t, e, "office-egress", "")
	}
	before := waitReady(t, egs...)
	r := newTakeoverReplicas(t)

	var leader *harness.Replica // nil: the cluster's own controller
	var leases, passes, takeovers []time.Duration
	for i := range runs {
		standby := r.standby()
		lease, pass := r.takeover(leader, standby)
		took := max(lease, pass)
		t.Logf("run %d: %s held the Lease %v after the leader's SIGKILL, its first pass was done after %v", i, standby.Name, lease, pass)
		if took > takeoverBound {
			t.Errorf("run %d: takeover took %v, more than %v", i, took, takeoverBound)
		}
		leases, passes, takeovers = append(leases, lease), append(passes, pass), append(takeovers, took)
		leader = standby
	}
	t.Logf("leader SIGKILL to standby holding the Lease and its first pass done: median %v of %v (Lease alone: median %v of %v; first pass: %v)",
		median(takeovers), takeovers, median(leases), leases, passes)

	after := waitReady(t, egs...)
	for _, e := range egs {
		b, a := before[e].Status, after[e].Status
		if a.EgressNode != b.EgressNode || a.EgressIP != b.EgressIP {
			t.Errorf("%s moved across the takeovers: %s %s before, %s %s after", e, b.EgressNode, b.EgressIP, a.EgressNode, a.EgressIP)
		}
	}

	// A Node crash during a takeover (the Egress exists already: the
	// webhook is served by the cluster's controller, killed in run 0).
	e := after[egs[0]]
	from := c.Node(e.Status.EgressNode)
	ip := e.Status.EgressIP
	w, err := c.WatchARP(netip.MustParseAddr(ip), 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	standby := r.standby()
	oldHolder := c.LeaseHolder(ctx)
	killed := time.Now()
	r.killLeader(leader)
	if err := c.CrashNode(from); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.ReviveNode(from); err != nil {
			t.Errorf("revive %s: %v", from.Name, err)
		}
	})
	crashed := time.Now()
	var answered, leaseTaken time.Duration
	ok := harness.WaitFor(ctx, 2*takeoverBound+20*time.Second, func() bool {
		if leaseTaken == 0 {
			if h := c.LeaseHolder(ctx); h != "" && h != oldHolder {
				leaseTaken = time.Since(killed)
			}
		}
		for _, rep := range w.Replies() {
			if rep.At.After(crashed) && rep.MAC != from.MAC.String() {
				answered = rep.At.Sub(killed)
				return true
			}
		}
		return false
	})
	if !ok {
		t.Fatalf("%s never answered ARP from another Node after the leader was killed and %s crashed", ip, from.Name)
	}
	if n, err := harness.PassCount(ctx, standby.MetricsAddr); err != nil || n == 0 {
		t.Errorf("%s answered from another Node but standby %s has run no pass (%v)", ip, standby.Name, err)
	}
	t.Logf("leader SIGKILL and Node crash (%v apart) to ARP answered by the new Node: %v (the standby held the Lease after %v, the IP answered %v later)",
		crashed.Sub(killed), answered, leaseTaken, answered-leaseTaken)
	// The bound: a takeover plus a crash failover (TestCrashFailover
	// waits 20 s for the latter).
	if answered > takeoverBound+20*time.Second {
		t.Errorf("failover during a takeover took %v", answered)
	}
}
