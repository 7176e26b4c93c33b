// Package warm plans a cloud-backed pool's warm IPs: how many addresses to
// attach ahead of demand or to detach, and on which Nodes' interfaces, so
// that every cloud API call carries a whole batch.
//
// It is pure Go over plain values (no client, no clock: the caller passes
// the time). The targets follow the AWS VPC CNI's WARM_IP_TARGET and
// MINIMUM_IP_TARGET (amazon-vpc-cni-k8s PR #125, docs/eni-and-ip-target.md),
// counted pool-wide instead of per Node:
//
//	short = max(warm + pending - available - attaching, minimum - total - attaching, 0)
//	over  = max(min(available - warm - pending, total - minimum), 0)
//
// where warm and minimum are the pool's targets, total counts the pool's
// attached addresses (allocated plus warm), available the warm addresses
// out of cooldown on an eligible Node, and pending the Egresses waiting for
// an address (so a warm target of 0 still attaches on demand); attaching
// counts addresses that calls in flight are attaching, so a pass that runs
// before they complete does not ask for them again. An address in
// cooldown is neither available nor detached, so the pool attaches others
// instead of counting on it (the fault described in VPC CNI issue #2896).
package warm

import (
	"cmp"
	"net/netip"
	"slices"
	"time"
)

// Cooldown is how long an address that left an Egress (released, or moved
// away from a Node) stays unavailable for another Egress: long enough for
// the old Node's agent to unbind it and for connection-tracking entries of
// the previous tenant to stop matching. 30 s is the VPC CNI's default IP
// cooldown (IP_COOLDOWN_PERIOD).
const Cooldown = 30 * time.Second

// ScaleDownInterval is the least time between two detach rounds of a pool,
// so that a burst of deletions followed by a burst of creations does not
// detach and re-attach the same addresses (VPC CNI: at most one release
// per 30 s).
const ScaleDownInterval = 30 * time.Second

// Node is one eligible Node of the pool with its interface.
type Node struct {
	// Name is the Node's name.
	Name string
	// InterfaceID is the cloud ID of the Node's interface in the pool's
	// subnet.
	InterfaceID string
	// Room is how many more addresses the interface may take now: the
	// smaller of the Node's egress-IP capacity left and the interface's
	// free address slots. 0 or less means none.
	Room int
	// Load is the number of the pool's addresses (allocated plus warm) on
	// the Node; new warm addresses go to the least-loaded Nodes first.
	Load int
}

// IP is a warm address of the pool.
type IP struct {
	Addr netip.Addr
	// Node holds the address; a Node absent from Input.Nodes is not
	// eligible, so its addresses are not available.
	Node string
	// CoolUntil is the end of the address's cooldown (zero: none).
	CoolUntil time.Time
}

// Input is one pool's state.
type Input struct {
	// Now is the current time.
	Now time.Time
	// WarmTarget and MinimumTarget are spec.cloud.warmIPTarget and
	// spec.cloud.minimumIPTarget.
	WarmTarget, MinimumTarget int
	// Allocated is the number of the pool's attached addresses allocated
	// to Egresses.
	Allocated int
	// Pending is the number of Egresses waiting for an address.
	Pending int
	// Attaching is the number of addresses calls in flight are attaching
	// for the pool (not yet in Warm).
	Attaching int
	// Warm are the pool's warm addresses.
	Warm []IP
	// Nodes are the pool's eligible Nodes that may take addresses now
	// (Nodes in attach backoff left out).
	Nodes []Node
	// LastScaleDown is when the pool last detached addresses.
	LastScaleDown time.Time
	// BackoffUntil: no attach before this time (after the cloud reported
	// the subnet or an interface full, or kept throttling).
	BackoffUntil time.Time
	// Ranged is true when the pool restricts itself to spec.ipRanges: then
	// attaches name addresses from Free instead of letting the cloud pick.
	Ranged bool
	// Free are the pool's addresses attached nowhere, lowest first (used
	// when Ranged).
	Free []netip.Addr
}

// Op is one cloud call on one interface.
type Op struct {
	Node, InterfaceID string
	// Count is the number of addresses the cloud picks (AssignCount) when
	// IPs is empty.
	Count int
	// IPs are the addresses to attach or detach by name.
	IPs []netip.Addr
}

// Plan is what to do for one pool now.
type Plan struct {
	// Available, Total, Short and Over are the figures of the formulas
	// in the package documentation.
	Available, Total, Short, Over int
	// Attach has at most one Op per interface, sorted by Node.
	Attach []Op
	// Detach has at most one Op per interface, sorted by Node; it lists
	// warm addresses out of cooldown only.
	Detach []Op
	// Recheck, when positive, is how long until the plan may change with
	// no other input changing (a cooldown ends, the scale-down spacing or
	// a backoff elapses).
	Recheck time.Duration
}

// Compute returns the plan for one pool.
func Compute(in Input) Plan {
	var p Plan
	eligible := make(map[string]bool, len(in.Nodes))
	for _, n := range in.Nodes {
		eligible[n.Name] = true
	}
	var avail []IP
	soonest := time.Duration(0)
	later := func(d time.Duration) {
		if d > 0 && (soonest == 0 || d < soonest) {
			soonest = d
		}
	}
	for _, ip := range in.Warm {
		if !in.Now.Before(ip.CoolUntil) {
			if eligible[ip.Node] {
				avail = append(avail, ip)
			}
			continue
		}
		later(ip.CoolUntil.Sub(in.Now))
	}
	p.Available = len(avail)
	p.Total = in.Allocated + len(in.Warm)
	p.Short = max(max(in.WarmTarget+in.Pending-p.Available, in.MinimumTarget-p.Total, 0)-in.Attaching, 0)
	p.Over = max(min(p.Available-in.WarmTarget-in.Pending, p.Total-in.MinimumTarget), 0)

	if p.Short > 0 {
		if in.Now.Before(in.BackoffUntil) {
			later(in.BackoffUntil.Sub(in.Now))
		} else {
			p.Attach = spread(in, p.Short)
		}
	}
	if p.Over > 0 {
		if wait := in.LastScaleDown.Add(ScaleDownInterval).Sub(in.Now); !in.LastScaleDown.IsZero() && wait > 0 {
			later(wait)
		} else {
			p.Detach = shed(avail, in.Nodes, p.Over)
		}
	}
	p.Recheck = soonest
	return p
}

// spread places n new addresses one at a time on the Node with the least
// load (ties: the name), within each Node's room, and returns one Op per
// Node.
func spread(in Input, n int) []Op {
	nodes := slices.Clone(in.Nodes)
	slices.SortFunc(nodes, func(a, b Node) int { return cmp.Compare(a.Name, b.Name) })
	count := make([]int, len(nodes))
	if in.Ranged && n > len(in.Free) {
		n = len(in.Free)
	}
	for range n {
		best := -1
		for i, nd := range nodes {
			if count[i] >= nd.Room {
				continue
			}
			if best < 0 || nd.Load+count[i] < nodes[best].Load+count[best] {
				best = i
			}
		}
		if best < 0 {
			break
		}
		count[best]++
	}
	var ops []Op
	free := in.Free
	for i, nd := range nodes {
		if count[i] == 0 {
			continue
		}
		op := Op{Node: nd.Name, InterfaceID: nd.InterfaceID}
		if in.Ranged {
			op.IPs, free = slices.Clone(free[:count[i]]), free[count[i]:]
		} else {
			op.Count = count[i]
		}
		ops = append(ops, op)
	}
	return ops
}

// shed picks n available addresses to detach, one at a time from the Node
// that holds the most available addresses (ties: the name; within a Node,
// the highest address first), and returns one Op per Node.
func shed(avail []IP, nodes []Node, n int) []Op {
	ifc := make(map[string]string, len(nodes))
	for _, nd := range nodes {
		ifc[nd.Name] = nd.InterfaceID
	}
	byNode := map[string][]netip.Addr{}
	for _, ip := range avail {
		byNode[ip.Node] = append(byNode[ip.Node], ip.Addr)
	}
	names := make([]string, 0, len(byNode))
	for name, ips := range byNode {
		slices.SortFunc(ips, func(a, b netip.Addr) int { return a.Compare(b) })
		names = append(names, name)
	}
	slices.Sort(names)
	picked := map[string][]netip.Addr{}
	for range n {
		best := ""
		for _, name := range names {
			if len(byNode[name]) > 0 && (best == "" || len(byNode[name]) > len(byNode[best])) {
				best = name
			}
		}
		if best == "" {
			break
		}
		ips := byNode[best]
		picked[best] = append(picked[best], ips[len(ips)-1])
		byNode[best] = ips[:len(ips)-1]
	}
	var ops []Op
	for _, name := range names {
		if ips := picked[name]; len(ips) > 0 {
			slices.SortFunc(ips, func(a, b netip.Addr) int { return a.Compare(b) })
			ops = append(ops, Op{Node: name, InterfaceID: ifc[name], IPs: ips})
		}
	}
	return ops
}
