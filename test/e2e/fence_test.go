package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/agent/fence"
	"github.com/egressip/egressip/test/e2e/harness"
)

// fenceRuns is how many times the timed fencing scenarios run.
const fenceRuns = 3

// fenceBound is the longest time, from the cut, until a cut-off Node no
// longer answers for its IPs, with the agent's default flags: the fence
// timeout (2 s, counted from the last poll, which came before the cut)
// plus one probe interval (250 ms) plus the unbind allowance (200 ms), and
// one ARP watch interval (20 ms) for the last answer to be seen. The
// controller cannot declare the Node dead before 3 s after its last answer.
const fenceBound = fence.DefaultTimeout + fence.DefaultProbeInterval + fence.UnbindAllowance + 20*time.Millisecond

// fenceSlack is the scheduling delay the fenceBound assertion allows: on
// a 2-core CI machine at load average 27 the last answer came 7.6 ms past
// fenceBound once (the agent's probe loop ran late), while the answers'
// order, the property that matters, held. The order is asserted without
// slack; the medians are logged.
const fenceSlack = 500 * time.Millisecond

// fenceCount returns Node n's count of fences for reason (the metric
// egressip_agent_fence_events_total, action "fence").
func fenceCount(t *testing.T, n *harness.Node, reason string) float64 {
	t.Helper()
	var v float64
	var err error
	if !harness.WaitFor(context.Background(), 10*time.Second, func() bool {
		v, err = c.AgentMetric(context.Background(), n, "egressip_agent_fence_events_total", map[string]string{"action": "fence", "reason": reason})
		return err == nil
	}) {
		t.Fatalf("fence events of %s: %v", n.Name, err)
	}
	return v
}

// allFences returns every Node's total count of fences (any reason).
func allFences(t *testing.T) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, n := range c.Nodes {
		out[n.Name] = fenceCount(t, n, v1.ReasonPeersLost) + fenceCount(t, n, v1.ReasonControllerPollsOthers)
	}
	return out
}

// hasAddr is c.HasAddress, failing the test on error.
func hasAddr(t *testing.T, n *harness.Node, ip netip.Addr) bool {
	t.Helper()
	ok, err := c.HasAddress(n, ip)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// waitUnfenced waits until Node n's agent has lifted its fence after a
// partition healed (its egressip_agent_fenced gauge reads 0).
func waitUnfenced(t *testing.T, n *harness.Node) {
	t.Helper()
	if !harness.WaitFor(context.Background(), 20*time.Second, func() bool {
		v, err := c.AgentMetric(context.Background(), n, "egressip_agent_fenced", nil)
		return err == nil && v == 0
	}) {
		t.Fatalf("%s still fenced 20 s after the partition healed", n.Name)
	}
}

// TestFenceCutOffNode cuts the Node holding an Egress off from the
// controller and the API server while it stays on the client's L2 segment
// and reaches its peers. Its agent fences: the client's ARP watcher sees no
// answer from it after the new Node's first, and its last answer comes
// within fenceBound of the cut. After the partition heals the old Node
// binds nothing again (the IP now belongs to the new Node).
func TestFenceCutOffNode(t *testing.T) {
	ctx := context.Background()
	var silences, failovers, overlaps []time.Duration
	for i := range fenceRuns {
		name := fmt.Sprintf("fence-cut-%d", i)
		newEgress(t, name, "office-egress", "")
		e := waitReady(t, name)[name]
		ip := netip.MustParseAddr(e.Status.EgressIP)
		old := c.Node(e.Status.EgressNode)
		before, beforeLost := fenceCount(t, old, v1.ReasonControllerPollsOthers), fenceCount(t, old, v1.ReasonPeersLost)
		w, err := c.WatchARP(ip, 20*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
		cut := time.Now()
		p, err := c.CutOffControlPlane(old)
		if err != nil {
			w.Stop()
			t.Fatal(err)
		}
		var newMAC string
		moved := harness.WaitFor(ctx, 20*time.Second, func() bool {
			for _, r := range w.Replies() {
				if r.At.After(cut) && r.MAC != old.MAC.String() {
					newMAC = r.MAC
					return true
				}
			}
			return false
		})
		time.Sleep(time.Second) // would the old Node still answer?
		stillBound := hasAddr(t, old, ip)
		replies := w.Stop()
		if err := p.Heal(); err != nil {
			t.Fatal(err)
		}
		if !moved {
			t.Fatalf("run %d: %s never answered ARP from another Node within 20 s of cutting %s off", i, ip, old.Name)
		}
		if stillBound {
			t.Errorf("run %d: %s still bound on cut-off %s", i, ip, old.Name)
		}
		var lastOld, firstNew time.Time
		for _, r := range replies {
			if r.MAC == old.MAC.String() {
				lastOld = r.At
			}
			if r.MAC == newMAC && firstNew.IsZero() {
				firstNew = r.At
			}
		}
		for _, r := range replies {
			if r.At.After(firstNew) && r.MAC == old.MAC.String() {
				t.Errorf("run %d: duplicate: cut-off %s answered for %s at +%v, after the new Node's first answer at +%v",
					i, old.Name, ip, r.At.Sub(cut), firstNew.Sub(cut))
			}
		}
		if lastOld.Sub(cut) > fenceBound+fenceSlack {
			t.Errorf("run %d: cut-off %s answered for %s until +%v after the cut, bound %v (+%v scheduling slack)", i, old.Name, ip, lastOld.Sub(cut), fenceBound, fenceSlack)
		}
		silences = append(silences, lastOld.Sub(cut))
		failovers = append(failovers, firstNew.Sub(cut))
		overlaps = append(overlaps, firstNew.Sub(lastOld))
		// Healed: the old Node is polled again, lifts its fence and
		// binds nothing (the IP is the new Node's now).
		waitUnfenced(t, old)
		// One fence; its reason is ControllerPollsOthers (the peers are
		// polled), or PeersLost if the peers' answers were late (a loaded
		// machine): both release the IPs, the log says which.
		after, afterLost := fenceCount(t, old, v1.ReasonControllerPollsOthers), fenceCount(t, old, v1.ReasonPeersLost)
		if after+afterLost != before+beforeLost+1 {
			t.Errorf("run %d: %s counted %v fences, want 1", i, old.Name, after+afterLost-before-beforeLost)
		}
		reason := v1.ReasonControllerPollsOthers
		if afterLost > beforeLost {
			reason = v1.ReasonPeersLost
		}
		got := waitReady(t, name)[name]
		if got.Status.EgressNode == old.Name {
			t.Errorf("run %d: the IP came back to %s: %s", i, old.Name, harness.Describe(got))
		}
		time.Sleep(time.Second)
		if hasAddr(t, old, ip) {
			t.Errorf("run %d: %s bound %s again after the partition healed", i, old.Name, ip)
		}
		checkReachable(t, got)
		t.Logf("run %d: %s cut off: fenced (%s), last answer +%v, new Node's first +%v (silence %v), %d answers", i, old.Name,
			reason, lastOld.Sub(cut), firstNew.Sub(cut), firstNew.Sub(lastOld), len(replies))
		deleteEgress(name)
	}
	t.Logf("cut-off Node: last answer after the cut: median %v of %v (bound %v); new Node's first answer: median %v of %v; silence between: median %v",
		median(silences), silences, fenceBound, median(failovers), failovers, median(overlaps))
}

// TestFenceAPIServerOutage drops every packet to and from the API server
// for 60 s (the agents and the controller all lose it; the controller
// exits when it loses its Lease and is started again afterwards, as its
// Deployment would): nothing is unbound, nothing moves, ARP is answered
// throughout by the same Node, and no agent counts a fence.
func TestFenceAPIServerOutage(t *testing.T) {
	ctx := context.Background()
	names := []string{"fence-api-a", "fence-api-b"}
	for _, n := range names {
		newEgress(t, n, "office-egress", "")
	}
	before := waitReady(t, names...)
	fences := allFences(t)
	ip := netip.MustParseAddr(before[names[0]].Status.EgressIP)
	holder := c.Node(before[names[0]].Status.EgressNode)
	w, err := c.WatchARP(ip, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	p, err := c.APIServerOutage()
	if err != nil {
		w.Stop()
		t.Fatal(err)
	}
	start := time.Now()
	healed := false
	heal := func() {
		if !healed {
			healed = true
			if err := p.Heal(); err != nil {
				t.Error(err)
			}
		}
	}
	defer heal()
	unbound := 0
	for time.Since(start) < 60*time.Second {
		for _, n := range names {
			e := before[n]
			if !hasAddr(t, c.Node(e.Status.EgressNode), netip.MustParseAddr(e.Status.EgressIP)) {
				unbound++
				t.Errorf("+%v: %s unbound from %s during the API-server outage", time.Since(start).Round(time.Millisecond), e.Status.EgressIP, e.Status.EgressNode)
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	heal()
	restarted, err := c.RestartControllerIfExited()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WaitLeader(ctx, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * time.Second) // longer than --agent-dead-after
	replies := w.Stop()
	var maxGap time.Duration
	for i, r := range replies {
		if r.MAC != holder.MAC.String() {
			t.Fatalf("%s answered by %s during the outage; only %s holds it", ip, r.MAC, holder.Name)
		}
		if i > 0 {
			maxGap = max(maxGap, r.At.Sub(replies[i-1].At))
		}
	}
	// Reading replies can stall ~0.8 s when the test process is
	// descheduled on a loaded machine; an unbind is caught by the
	// address checks above.
	if maxGap > 2*time.Second {
		t.Errorf("ARP answers for %s stopped for %v", ip, maxGap)
	}
	for _, n := range names {
		e, err := c.Egress(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		if e.Status.EgressNode != before[n].Status.EgressNode || e.Status.EgressIP != before[n].Status.EgressIP {
			t.Errorf("%s moved during the API-server outage: before %s, after %s", n, harness.Describe(before[n]), harness.Describe(e))
		}
	}
	waitReady(t, names...)
	for node, v := range allFences(t) {
		if v != fences[node] {
			n := c.Node(node)
			t.Errorf("%s fenced during the API-server outage (%v fences, %v before; counts now: %s %v, %s %v)", node, v, fences[node],
				v1.ReasonPeersLost, fenceCount(t, n, v1.ReasonPeersLost),
				v1.ReasonControllerPollsOthers, fenceCount(t, n, v1.ReasonControllerPollsOthers))
		}
	}
	t.Logf("API-server outage of 60 s: nothing unbound (%d checks failed), nothing moved, %d ARP answers all from %s, longest gap %v; controller restarted after losing its Lease: %v",
		unbound, len(replies), holder.Name, maxGap, restarted)
}

// TestFenceControllerCrash kills the controller for twice its dead-after
// time: the agents reach the API server, so none fences, nothing is
// unbound, and ARP is answered throughout by the same Node.
func TestFenceControllerCrash(t *testing.T) {
	ctx := context.Background()
	name := "fence-ctl"
	newEgress(t, name, "office-egress", "")
	e := waitReady(t, name)[name]
	fences := allFences(t)
	ip := netip.MustParseAddr(e.Status.EgressIP)
	holder := c.Node(e.Status.EgressNode)
	w, err := c.WatchARP(ip, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	c.StopController()
	start := time.Now()
	for time.Since(start) < 6*time.Second {
		if !hasAddr(t, holder, ip) {
			t.Fatalf("+%v: %s unbound from %s while the controller is down", time.Since(start).Round(time.Millisecond), ip, holder.Name)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := c.StartController(); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitLeader(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	replies := w.Stop()
	var maxGap time.Duration
	for i, r := range replies {
		if r.MAC != holder.MAC.String() {
			t.Fatalf("%s answered by %s while the controller was down; only %s holds it", ip, r.MAC, holder.Name)
		}
		if i > 0 {
			maxGap = max(maxGap, r.At.Sub(replies[i-1].At))
		}
	}
	if maxGap > 2*time.Second { // see TestFenceAPIServerOutage
		t.Errorf("ARP answers for %s stopped for %v", ip, maxGap)
	}
	after := waitReady(t, name)[name]
	if after.Status.EgressNode != holder.Name || after.Status.EgressIP != e.Status.EgressIP {
		t.Errorf("controller crash moved the IP: %s", harness.Describe(after))
	}
	for node, v := range allFences(t) {
		if v != fences[node] {
			t.Errorf("%s fenced while the controller was down (%v fences, %v before)", node, v, fences[node])
		}
	}
	t.Logf("controller down 6 s: %s stayed bound on %s, %d ARP answers all from it, longest gap %v", ip, holder.Name, len(replies), maxGap)
}

// TestFenceIsolatedNode isolates the Node holding two Egresses from
// everything (IP and ARP dropped on its uplink): its agent fences, both IPs
// leave its interface within fenceBound. One Egress can move (the office
// pool) and moves; the other's pool selects this Node only. Once the
// isolation ends the Node binds the pinned Egress's IP again, and never the
// one that moved.
func TestFenceIsolatedNode(t *testing.T) {
	ctx := context.Background()
	var unbinds []time.Duration
	for i := range fenceRuns {
		moving := fmt.Sprintf("fence-iso-%d", i)
		newEgress(t, moving, "office-egress", "")
		e := waitReady(t, moving)[moving]
		a := c.Node(e.Status.EgressNode)
		pool := fmt.Sprintf("fence-pinned-%d", i)
		pp := &v1.ExternalIPPool{ObjectMeta: metav1.ObjectMeta{Name: pool}, Spec: v1.ExternalIPPoolSpec{
			IPRanges:     []v1.IPRange{{Start: "192.0.2.130", End: "192.0.2.131"}},
			SubnetInfo:   &v1.SubnetInfo{Gateway: "192.0.2.1", PrefixLength: 24},
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelHostname: a.Name}}}}
		if err := c.Client.Create(ctx, pp); err != nil {
			t.Fatal(err)
		}
		pinned := fmt.Sprintf("fence-pin-%d", i)
		newEgress(t, pinned, pool, "")
		p0 := waitReady(t, pinned)[pinned]
		if p0.Status.EgressNode != a.Name {
			t.Fatalf("pinned Egress on %s, want %s", harness.Describe(p0), a.Name)
		}
		ipMove, ipPin := netip.MustParseAddr(e.Status.EgressIP), netip.MustParseAddr(p0.Status.EgressIP)
		before := fenceCount(t, a, v1.ReasonPeersLost)

		start := time.Now()
		p, err := c.Isolate(a)
		if err != nil {
			t.Fatal(err)
		}
		gone := harness.WaitFor(ctx, 10*time.Second, func() bool { return !hasAddr(t, a, ipMove) && !hasAddr(t, a, ipPin) })
		took := time.Since(start)
		if !gone {
			_ = p.Heal()
			t.Fatalf("run %d: isolated %s still holds its IPs 10 s after the isolation", i, a.Name)
		}
		if took > fenceBound+fenceSlack {
			t.Errorf("run %d: isolated %s unbound its IPs %v after the isolation, bound %v (+%v scheduling slack)", i, a.Name, took, fenceBound, fenceSlack)
		}
		unbinds = append(unbinds, took)
		// The movable Egress goes to another Node meanwhile.
		if !harness.WaitFor(ctx, 20*time.Second, func() bool {
			got, err := c.Egress(ctx, moving)
			return err == nil && got.Status.EgressNode != "" && got.Status.EgressNode != a.Name && meta.IsStatusConditionTrue(got.Status.Conditions, v1.ConditionReady)
		}) {
			_ = p.Heal()
			got, _ := c.Egress(ctx, moving)
			t.Fatalf("run %d: %s did not move off isolated %s: %s", i, moving, a.Name, harness.Describe(got))
		}
		movedTo, _ := c.Egress(ctx, moving)
		w, err := c.WatchARP(ipMove, 20*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		healed := time.Now()
		if err := p.Heal(); err != nil {
			t.Fatal(err)
		}
		// Back: the pinned IP returns to the isolated Node, the moved one
		// never does.
		waitUnfenced(t, a)
		pin := waitReady(t, pinned)[pinned]
		if pin.Status.EgressNode != a.Name || !hasAddr(t, a, ipPin) {
			t.Errorf("run %d: pinned Egress not bound on %s again: %s (bound: %v)", i, a.Name, harness.Describe(pin), hasAddr(t, a, ipPin))
		}
		time.Sleep(time.Second)
		replies := w.Stop()
		if hasAddr(t, a, ipMove) {
			t.Errorf("run %d: %s bound %s again, which moved to %s", i, a.Name, ipMove, movedTo.Status.EgressNode)
		}
		for _, r := range replies {
			if r.MAC == a.MAC.String() {
				t.Errorf("run %d: %s answered for %s at +%v after the isolation ended; it belongs to %s", i, a.Name, ipMove, r.At.Sub(healed), movedTo.Status.EgressNode)
				break
			}
		}
		if after := fenceCount(t, a, v1.ReasonPeersLost); after != before+1 {
			t.Errorf("run %d: %s counted %v fences (PeersLost), want %v", i, a.Name, after, before+1)
		}
		t.Logf("run %d: isolated %s unbound both IPs %v after the isolation; back: %s bound again, %s stays on %s", i, a.Name, took, ipPin, ipMove, movedTo.Status.EgressNode)
		deleteEgress(pinned)
		deleteEgress(moving)
		_ = c.Client.Delete(ctx, pp)
	}
	t.Logf("isolated Node: IPs unbound after the isolation: median %v of %v (bound %v)", median(unbinds), unbinds, fenceBound)
}
