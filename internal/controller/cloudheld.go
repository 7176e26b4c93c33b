package controller

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/egressip/egressip/internal/cloud"
)

// actionHolders is the action label of the address look-ups
// (cloud.AddressLookup.Holders) in the cloud call metrics.
const actionHolders = "Holders"

// heldAddr is an address the controller meant to attach and found held by
// an interface that is not one of ours (a Pod IP of the VPC CNI, a load
// balancer's interface, another instance's interface): it is not taken.
type heldAddr struct {
	// Holder is the interface that holds it.
	Holder cloud.Holder
	// Subnet is the subnet it was looked up in.
	Subnet string
	// Since is when it was first found held.
	Since time.Time
}

// cloudJob is one provider call Run makes, on one interface.
type cloudJob struct {
	action, pool string
	node, iface  string
	// subnet is the destination interface's subnet (named attaches).
	subnet string
	ips    []netip.Addr
	count  int
	// from maps the addresses of a named attach that are ours now to the
	// interface of ours that holds them (a move); the others must be free.
	from map[netip.Addr]string
	// moves are the addresses screen found on one of our other
	// interfaces (attached with reassignment); the rest of ips nobody
	// holds (attached without).
	moves []netip.Addr
	// err, when set by screen, fails the job without a call.
	err error
}

// heldMessage says who holds ip (named as what, e.g. "spec.egressIP") and
// what to do, for the Egress's condition and its Warning Event.
func heldMessage(ip netip.Addr, what string, h heldAddr) string {
	return fmt.Sprintf("%s (%s) is held by network interface %s, which is not egressip's, so the controller does not take it; free the address there or name another one (reserve the pool's addresses with a subnet CIDR reservation so that nothing else takes them)",
		ip, what, h.Holder)
}

// screen looks up who holds the addresses of the named attach jobs, in one
// batched call per subnet (cloud.AddressLookup.Holders), before any of
// them is attached, and rewrites each job: an address on the interface of
// ours the pass named (job.from) or our own calls attached it to (c.ours)
// is a move (reassignment allowed), one nobody holds is attached without
// reassignment, and one any other interface holds, the destination
// included (a Pod IP on the Node's interface), is dropped and recorded in
// c.held (the next pass puts it in a condition). A failed
// look-up fails the jobs it covered: nothing is attached blind.
func (c *CloudActuator) screen(ctx context.Context, jobs []cloudJob) []cloudJob {
	lookup, ok := c.cfg.Provider.(cloud.AddressLookup)
	if !ok {
		// A provider that cannot look addresses up (test doubles):
		// every named attach is a move, as before.
		for i := range jobs {
			if jobs[i].action == actionAssign {
				jobs[i].moves = slices.Clone(jobs[i].ips)
			}
		}
		return jobs
	}
	bySubnet := map[string][]netip.Addr{}
	for _, j := range jobs {
		if j.action == actionAssign && len(j.ips) > 0 {
			bySubnet[j.subnet] = append(bySubnet[j.subnet], j.ips...)
		}
	}
	holders := map[string]map[netip.Addr]cloud.Holder{}
	errs := map[string]error{}
	for _, subnet := range slices.Sorted(maps.Keys(bySubnet)) {
		var got map[netip.Addr]cloud.Holder
		err := c.call(ctx, actionHolders, func() error {
			var err error
			got, err = lookup.Holders(ctx, subnet, bySubnet[subnet])
			return err
		})
		if err != nil {
			errs[subnet] = fmt.Errorf("look up who holds the addresses before attaching them: %w", err)
			continue
		}
		holders[subnet] = got
	}
	now := c.cfg.Clock.Now()
	changed := false
	c.mu.Lock()
	for i := range jobs {
		j := &jobs[i]
		if j.action != actionAssign || len(j.ips) == 0 {
			continue
		}
		if err := errs[j.subnet]; err != nil {
			j.err = err
			continue
		}
		var keep []netip.Addr
		for _, ip := range j.ips {
			h, held := holders[j.subnet][ip]
			// Ours: the pass knew it on that interface, one of our calls
			// attached it there (perhaps since the pass), or it is on an
			// interface tagged as ours for this cluster.
			ours := held && !h.Primary && (h.InterfaceID == j.from[ip] || h.InterfaceID == c.ours[ip] || c.ownInterface(h.InterfaceID))
			switch {
			case !held:
				keep = append(keep, ip)
				if _, was := c.held[ip]; was {
					delete(c.held, ip)
					changed = true
				}
			case ours && h.InterfaceID == j.iface:
				keep = append(keep, ip) // already there: the call is a no-op for it
			case ours:
				keep = append(keep, ip)
				j.moves = append(j.moves, ip)
			default:
				prev, was := c.held[ip]
				if !was || prev.Holder != h {
					c.held[ip] = heldAddr{Holder: h, Subnet: j.subnet, Since: now}
					changed = true
					log.FromContext(ctx).Info("address held by an interface that is not ours; not taking it", "address", ip, "holder", h.String(), "wanted on", j.iface)
				}
				c.dropAttaching(j, ip)
			}
		}
		j.ips = keep
	}
	c.mu.Unlock()
	if changed {
		c.notify()
	}
	return jobs
}

// dropAttaching undoes Run's bookkeeping for an address screen removed
// from a job; c.mu is held.
func (c *CloudActuator) dropAttaching(j *cloudJob, ip netip.Addr) {
	if c.attaching[ip] == j.node {
		delete(c.attaching, ip)
	}
	if j.pool != "" && j.count > 0 {
		j.count--
		if c.warmAttaching[j.pool]--; c.warmAttaching[j.pool] <= 0 {
			delete(c.warmAttaching, j.pool)
		}
	}
}

// recheckHeld looks the held addresses up again (one call per subnet) and
// forgets those nobody holds any more, so that the next pass attaches
// them; it runs with each Refresh.
func (c *CloudActuator) recheckHeld(ctx context.Context) {
	lookup, ok := c.cfg.Provider.(cloud.AddressLookup)
	if !ok {
		return
	}
	c.mu.Lock()
	bySubnet := map[string][]netip.Addr{}
	for ip, h := range c.held {
		bySubnet[h.Subnet] = append(bySubnet[h.Subnet], ip)
	}
	c.mu.Unlock()
	changed := false
	for _, subnet := range slices.Sorted(maps.Keys(bySubnet)) {
		var got map[netip.Addr]cloud.Holder
		err := c.call(ctx, actionHolders, func() error {
			var err error
			got, err = lookup.Holders(ctx, subnet, bySubnet[subnet])
			return err
		})
		if err != nil {
			log.FromContext(ctx).Info("looking up held addresses again failed; keeping them held", "subnet", subnet, "err", err)
			continue
		}
		c.mu.Lock()
		for _, ip := range bySubnet[subnet] {
			h, still := got[ip]
			cur, ok := c.held[ip]
			switch {
			case !ok:
			case !still:
				delete(c.held, ip)
				changed = true
			case h != cur.Holder:
				cur.Holder = h
				c.held[ip] = cur
				changed = true
			}
		}
		c.mu.Unlock()
	}
	if changed {
		c.notify()
	}
}

// holdingInterface is the ID of the known interface whose secondary
// addresses include ip, or "": a Node's primary interface or one of its
// other interfaces (ours after eks's tags, or anyone's; EC2 puts an
// address on one interface at a time).
func holdingInterface(ifaces map[string]cloud.Interface, ip netip.Addr) string {
	for _, ifc := range ifaces {
		if slices.Contains(ifc.Secondary, ip) {
			return ifc.ID
		}
		for _, e := range ifc.Others {
			if slices.Contains(e.Secondary, ip) {
				return e.ID
			}
		}
	}
	return ""
}

// interfaceSubnet is the subnet of the Node's interface id (its primary or
// one of its others), the primary interface's when id is not among them.
func interfaceSubnet(ifc cloud.Interface, id string) string {
	for _, e := range ifc.Others {
		if e.ID == id && e.SubnetID != "" {
			return e.SubnetID
		}
	}
	return ifc.SubnetID
}

// ownInterface reports whether id is an interface tagged as ours for this
// cluster (TagCluster and TagNoManage, see cloudInput.ours): everything on
// it was put there by egressip, so a look-up finding an address there
// finds it ours. A Node's primary interface and the VPC CNI's interfaces
// never are. c.mu is held.
func (c *CloudActuator) ownInterface(id string) bool {
	if id == "" {
		return false
	}
	for _, e := range c.tagged {
		if e.ID == id {
			return ownTags(e.Tags, c.cfg.ClusterName)
		}
	}
	return false
}

// assignNamed runs a screened named attach: the addresses nobody holds
// without reassignment (cloud.AddressLookup.AssignFree), then the moves
// from our other interfaces with it (Provider.Assign); one call each, on
// the job's interface.
func (c *CloudActuator) assignNamed(ctx context.Context, j cloudJob) error {
	if j.err != nil {
		return j.err
	}
	var free []netip.Addr
	for _, ip := range j.ips {
		if !slices.Contains(j.moves, ip) {
			free = append(free, ip)
		}
	}
	if len(free) > 0 {
		lookup := c.cfg.Provider.(cloud.AddressLookup) // screen left free empty otherwise
		if err := c.call(ctx, actionAssign, func() error { return lookup.AssignFree(ctx, j.iface, free) }); err != nil {
			return err
		}
		c.applied(j.pool, j.node, j.iface, free, true)
	}
	if len(j.moves) > 0 {
		if err := c.call(ctx, actionAssign, func() error { return c.cfg.Provider.Assign(ctx, j.iface, j.moves) }); err != nil {
			return err
		}
		c.applied(j.pool, j.node, j.iface, j.moves, true)
	}
	return nil
}

// heldSummary is the part of a cloud pool's Ready message about addresses
// of its ipRanges that others hold (at most 3 named), or "".
func heldSummary(ips []netip.Addr, held map[netip.Addr]heldAddr) string {
	if len(ips) == 0 {
		return ""
	}
	var named []string
	for _, ip := range ips[:min(len(ips), 3)] {
		named = append(named, fmt.Sprintf("%s by %s", ip, held[ip].Holder))
	}
	more := ""
	if len(ips) > 3 {
		more = fmt.Sprintf(" and %d more", len(ips)-3)
	}
	return fmt.Sprintf("; %d addresses of ipRanges are held by interfaces that are not egressip's and are skipped (%s%s): free them or take them out of ipRanges", len(ips), strings.Join(named, "; "), more)
}
