package harness

import (
	"context"
	"fmt"
	"net/netip"
	"time"
)

// Failover is what the client saw when the Node holding an Egress crashed.
type Failover struct {
	IP       netip.Addr
	From, To *Node
	// Took is the time from the crash to the first ARP answer from To.
	Took time.Duration
}

// CrashAndWait crashes the Node holding Egress name (see CrashNode) while
// the client asks for its IPv4 address every 20 ms, and waits up to timeout
// for the IP to answer ARP from another Node and the Egress to be Ready
// there. The status must name the Node whose MAC answered.
func (c *Cluster) CrashAndWait(ctx context.Context, name string, timeout time.Duration) (Failover, error) {
	e, err := c.Egress(ctx, name)
	if err != nil {
		return Failover{}, err
	}
	f := Failover{IP: netip.MustParseAddr(e.Status.EgressIP), From: c.Node(e.Status.EgressNode)}
	if f.From == nil {
		return f, fmt.Errorf("%s is on no known Node: %s", name, Describe(e))
	}
	w, err := c.WatchARP(f.IP, 20*time.Millisecond)
	if err != nil {
		return f, err
	}
	time.Sleep(200 * time.Millisecond)
	crashed := time.Now()
	if err := c.CrashNode(f.From); err != nil {
		w.Stop()
		return f, err
	}
	var newMAC string
	ok := WaitFor(ctx, timeout, func() bool {
		for _, r := range w.Replies() {
			if r.At.After(crashed) && r.MAC != f.From.MAC.String() {
				newMAC = r.MAC
				return true
			}
		}
		return false
	})
	f.Took = time.Since(crashed)
	w.Stop()
	if !ok {
		return f, fmt.Errorf("%s never answered ARP from another Node within %v of the crash of %s", f.IP, timeout, f.From.Name)
	}
	got, err := c.WaitReady(ctx, timeout, name)
	if err != nil {
		return f, err
	}
	f.To = c.Node(got[name].Status.EgressNode)
	if f.To == nil || f.To == f.From || f.To.MAC.String() != newMAC {
		return f, fmt.Errorf("ARP answered by %s but the status says %s", newMAC, Describe(got[name]))
	}
	return f, nil
}

// PlannedMove is what the client saw during a planned move.
type PlannedMove struct {
	IP       netip.Addr
	From, To *Node
	// Took is the time from the cordon to the first ARP answer from To.
	Took time.Duration
	// Gap is the ARP silence between the last answer from From and the
	// first from To.
	Gap time.Duration
	// Replies counts the ARP answers seen.
	Replies int
}

// CordonAndWait cordons the Node holding Egress name while the client asks
// for its IPv4 address every 10 ms, and waits for the planned move. It
// fails if the old Node answers after the new one did (a duplicate).
func (c *Cluster) CordonAndWait(ctx context.Context, name string, timeout time.Duration) (PlannedMove, error) {
	e, err := c.Egress(ctx, name)
	if err != nil {
		return PlannedMove{}, err
	}
	m := PlannedMove{IP: netip.MustParseAddr(e.Status.EgressIP), From: c.Node(e.Status.EgressNode)}
	if m.From == nil {
		return m, fmt.Errorf("%s is on no known Node: %s", name, Describe(e))
	}
	w, err := c.WatchARP(m.IP, 10*time.Millisecond)
	if err != nil {
		return m, err
	}
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	if err := c.Cordon(ctx, m.From.Name, true); err != nil {
		w.Stop()
		return m, err
	}
	if !WaitFor(ctx, timeout, func() bool {
		e, err := c.Egress(ctx, name)
		if err != nil || e.Status.EgressNode == "" || e.Status.EgressNode == m.From.Name {
			return false
		}
		m.To = c.Node(e.Status.EgressNode)
		return m.To != nil
	}) {
		w.Stop()
		return m, fmt.Errorf("%s did not leave cordoned %s within %v", name, m.From.Name, timeout)
	}
	WaitFor(ctx, 5*time.Second, func() bool {
		r := w.Replies()
		return len(r) > 0 && r[len(r)-1].MAC == m.To.MAC.String()
	})
	time.Sleep(500 * time.Millisecond) // would the old Node still answer?
	replies := w.Stop()
	m.Replies = len(replies)
	lastOld, firstNew := start, time.Time{}
	for _, r := range replies {
		if r.MAC == m.From.MAC.String() && r.At.After(lastOld) {
			lastOld = r.At
		}
		if r.MAC == m.To.MAC.String() && firstNew.IsZero() {
			firstNew = r.At
		}
	}
	if firstNew.IsZero() {
		return m, fmt.Errorf("%s never answered ARP from %s", m.IP, m.To.Name)
	}
	for _, r := range replies {
		if r.At.After(firstNew) && r.MAC != m.To.MAC.String() {
			return m, fmt.Errorf("duplicate: %s answered for %s after %s did", r.MAC, m.IP, m.To.Name)
		}
	}
	m.Took, m.Gap = firstNew.Sub(start), firstNew.Sub(lastOld)
	_, err = c.WaitReady(ctx, timeout, name)
	return m, err
}
