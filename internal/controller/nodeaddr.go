package controller

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/ipam"
	"github.com/egressip/egressip/internal/nodeaddr"
)

// maxNamed is how many addresses a pool's status.excluded message names.
const maxNamed = 5

// nodeAddressIndex returns the Nodes' own addresses (nodeaddr.Build) that
// no egress IP may use, leaving out an address of a Node that is an egress
// IP that same Node holds: its alive agent reports it bound, an Egress's
// status assigns it there, or the cloud attached it to that Node's
// interface. Cloud providers (the AWS one among them) list every private
// address of a Node's interfaces as its InternalIPs, egress IPs included;
// without this rule an egress IP would conflict with its own holder.
func nodeAddressIndex(in passInput, attached map[netip.Addr]string) nodeaddr.Index {
	type nodeIP struct {
		node string
		ip   netip.Addr
	}
	// One map for every (Node, address) pair: a map per Node was a sixth
	// of a warm pass's allocations (BenchmarkPass).
	held := make(map[nodeIP]bool, len(in.Egresses))
	mark := func(node string, ip netip.Addr) { held[nodeIP{node, ip}] = true }
	for i := range in.Egresses {
		st := &in.Egresses[i].Status
		if ip, err := netip.ParseAddr(st.EgressIP); err == nil && st.EgressNode != "" {
			mark(st.EgressNode, ip.Unmap())
		}
	}
	for ip, node := range attached {
		mark(node, ip)
	}
	for i := range in.Nodes {
		st := in.Agents(in.Nodes[i].Name)
		if !st.Known || st.Dead {
			continue
		}
		for _, b := range st.Report.Bound {
			mark(in.Nodes[i].Name, b.IP)
		}
	}
	return nodeaddr.Build(in.Nodes, func(node string, ip netip.Addr) bool { return held[nodeIP{node, ip}] })
}

// withNodeExclusions returns pool without the Node addresses of idx that
// lie in it, and those addresses in ascending order.
func withNodeExclusions(pool *ipam.Pool, idx nodeaddr.Index) (*ipam.Pool, []netip.Addr) {
	var ex []ipam.Exclusion
	var in []netip.Addr
	for _, ip := range idx.Sorted() {
		if pool.Contains(ip) {
			ex = append(ex, ipam.Exclusion{Addr: ip, Reason: "is " + idx[ip].String()})
			in = append(in, ip)
		}
	}
	if len(ex) == 0 {
		return pool, nil
	}
	return pool.WithExclusions(ex), in
}

// nodeConflictMessage is the Assigned=False message of an Egress whose IP
// is an address of a Node; named says whether spec.egressIP names it.
func nodeConflictMessage(ip netip.Addr, o nodeaddr.Owner, named bool) string {
	fix := "it keeps the address and is assigned again once the Node no longer lists it; delete and recreate the Egress to get another address from the pool"
	if named {
		fix = "change spec.egressIP, or the Node's address; the Egress is assigned again once the Node no longer lists it"
	}
	return fmt.Sprintf("%s is %s (status.addresses): a Node's own address is never an egress IP, so no Node holds it; %s", ip, o, fix)
}

// excludedStatus is the status.excluded list of a pool: the counts of
// ipam.Pool.Excluded by reason, with the Node addresses (nodeIPs, in the
// pool) named.
func excludedStatus(pool *ipam.Pool, idx nodeaddr.Index, nodeIPs []netip.Addr) []v1.ExcludedAddresses {
	ex := pool.Excluded()
	var out []v1.ExcludedAddresses
	if ex.Exclusions > 0 {
		names := make([]string, 0, maxNamed+1)
		for i, ip := range nodeIPs {
			if i == maxNamed {
				names = append(names, fmt.Sprintf("and %d more", len(nodeIPs)-maxNamed))
				break
			}
			o := idx[ip]
			names = append(names, fmt.Sprintf("%s (%s of Node %s)", ip, o.Type, o.Node))
		}
		out = append(out, v1.ExcludedAddresses{Reason: v1.ExcludedNodeAddress, Count: saturate(ex.Exclusions),
			Message: "addresses of Nodes, never egress IPs: " + strings.Join(names, ", ")})
	}
	if ex.SpecialPurpose > 0 {
		blocks := pool.Specials()
		names := make([]string, 0, len(blocks))
		for _, b := range blocks {
			names = append(names, fmt.Sprintf("%s %s", b.What, b.Prefix))
		}
		out = append(out, v1.ExcludedAddresses{Reason: v1.ExcludedSpecialPurpose, Count: saturate(ex.SpecialPurpose),
			Message: "special-purpose addresses inside the ranges, never egress IPs: " + strings.Join(names, ", ") + "; split the ranges around them"})
	}
	if ex.Reserved > 0 {
		out = append(out, v1.ExcludedAddresses{Reason: v1.ExcludedReserved, Count: saturate(ex.Reserved),
			Message: "the gateway and the network, broadcast or Subnet-Router anycast addresses of the ranges and subnet"})
	}
	return out
}

// excludedSummary completes a pool's Ready message when Node or
// special-purpose addresses are excluded ("" otherwise).
func excludedSummary(ex []v1.ExcludedAddresses) string {
	var parts []string
	for _, e := range ex {
		switch e.Reason {
		case v1.ExcludedNodeAddress:
			parts = append(parts, countOf(e.Count, "Node address"))
		case v1.ExcludedSpecialPurpose:
			parts = append(parts, countOf(e.Count, "special-purpose address"))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return "; never allocated: " + strings.Join(parts, ", ") + " (see status.excluded)"
}

// statusIPKept decides about an Egress without a named IP whose
// status.egressIP the pass could not reserve. kept is true when that IP
// lies in the pool's ranges but is a Node's address (o its owner) and no
// other Egress keeps it yet: the Egress keeps the IP, unassigned, rather
// than changing its source address. Otherwise note, when not empty, is the
// Warning Event note for an IP the pool can never give (outside its ranges
// or reserved); the caller allocates another.
func statusIPKept(e *v1.Egress, pool *ipam.Pool, idx nodeaddr.Index, held map[netip.Addr]bool) (ip netip.Addr, kept bool, o *nodeaddr.Owner, note string) {
	if e.Status.EgressIP == "" {
		return netip.Addr{}, false, nil, ""
	}
	ip, err := netip.ParseAddr(e.Status.EgressIP)
	if err != nil {
		return netip.Addr{}, false, nil, fmt.Sprintf("status.egressIP %q is not an IP address; no agent binds it and the controller allocates an address from ExternalIPPool %q", e.Status.EgressIP, e.Spec.ExternalIPPool)
	}
	cerr := pool.Check(ip)
	if owner, ok := idx[ip]; ok && errors.Is(cerr, ipam.ErrExcludedAddress) {
		if held[ip] {
			return netip.Addr{}, false, nil, ""
		}
		return ip, true, &owner, ""
	}
	if errors.Is(cerr, ipam.ErrOutsidePool) || errors.Is(cerr, ipam.ErrReservedAddress) {
		return netip.Addr{}, false, nil, fmt.Sprintf("status.egressIP %s cannot come from ExternalIPPool %q: %v; no agent binds it and the controller allocates another address", ip, e.Spec.ExternalIPPool, cerr)
	}
	return netip.Addr{}, false, nil, ""
}

// countOf reads "1 Node address" or "3 Node addresses".
func countOf(n int64, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ses", n, what)
}
