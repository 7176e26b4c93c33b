// Package datapath makes selected Pods' outbound traffic leave the cluster
// with their Egress's IP: a flow-based VXLAN-GPE tunnel from a Pod's Node to
// the egress Node, SNAT on the egress Node in an nftables table of our own,
// and policy routing keyed by marks. See /docs/datapath.md.
package datapath

import (
	"net/netip"

	"github.com/egressip/egressip/internal/destinations"
)

// Role is what this Node does for one Egress.
type Role int

const (
	// RoleNone: this Node neither holds the Egress IP nor has members of it.
	RoleNone Role = iota
	// RoleSource: members run here; their traffic is tunnelled to the
	// egress IP, which another Node holds.
	RoleSource
	// RoleEgress: this Node holds the egress IP; it SNATs its own members'
	// traffic and that of remote members arriving through the tunnel.
	RoleEgress
	// RoleFailed: the Egress has no IP or no Node; its members' traffic
	// follows FailurePolicy.
	RoleFailed
)

// FailurePolicy is spec.failurePolicy of an Egress.
type FailurePolicy string

const (
	// FailurePolicyFail rejects members' external traffic while the Egress
	// has no Node (ICMP host unreachable, so sockets see EHOSTUNREACH).
	FailurePolicyFail FailurePolicy = "Fail"
	// FailurePolicyIgnore lets members' traffic leave with the Node's IP.
	FailurePolicyIgnore FailurePolicy = "Ignore"
)

// Member is a Pod that uses an Egress.
type Member struct {
	// IP is one of the Pod's IPs (status.podIPs), of the Egress's family.
	IP netip.Addr
	// HostIP is the IP of the Pod's Node (status.hostIPs) of the same
	// family: the outer destination of return traffic.
	HostIP netip.Addr
}

// Egress is one Egress as this Node's datapath needs it.
type Egress struct {
	// Name is the Egress's name (cluster-scoped); it keys the Node-local ID.
	Name string
	// IP is status.egressIP; invalid (zero) when none is allocated.
	IP netip.Addr
	// Role is this Node's role for the Egress.
	Role Role
	// FailurePolicy applies when Role is RoleFailed.
	FailurePolicy FailurePolicy
	// Assigning is set with RoleFailed while the Egress waits for its
	// first assignment (the controller has not decided on an IP and a Node
	// yet, for about a pass). New flows of its members follow
	// FailurePolicy, but the flows they opened before it existed are not
	// cut: they keep the Node IP until they end, as for a working Egress.
	// Once the controller reports it cannot assign it, it is failed like
	// any other and those flows are cut then.
	Assigning bool
	// Local are members running on this Node.
	Local []netip.Addr
	// Remote are members on other Nodes; set only when Role is RoleEgress.
	Remote []Member
	// IPs are, for an Egress with several IPs (spec.ips), every IP it has
	// been allocated (status.ips entries with an IP), sorted by IP; empty
	// for a single-IP Egress. For such an Egress Role is RoleEgress when
	// this Node holds one of them (IP is that one: the distinct-Node rule
	// of the scheduler gives a Node at most one), else RoleSource while
	// one is Usable, else RoleFailed; the local members' new connections
	// are spread over the Usable ones (docs/datapath.md, "Several IPs").
	IPs []EgressIP
}

// EgressIP is one IP of an Egress with several IPs, as this Node sees it.
type EgressIP struct {
	// IP is the address (status.ips[].ip).
	IP netip.Addr
	// Held: this Node holds it (status.ips[].node): it SNATs the
	// connections that chose it.
	Held bool
	// Usable: this Node's members' new connections may choose it: it is
	// Ready, and it is in this Node's zone or no IP of the Egress that is
	// Ready is.
	Usable bool
}

// State is everything the datapath of one Node is programmed from. Applying
// the same State twice changes nothing.
type State struct {
	// Egresses, in any order; names are unique.
	Egresses []Egress
	// NodeIPs are the internal IPs of every Node of the cluster: tunnel
	// packets are accepted only from them, and traffic to them never takes
	// an egress path.
	NodeIPs []netip.Addr
	// ClusterCIDRs are Pod and Service CIDRs and any configured exclusions:
	// traffic to them never takes an egress path.
	ClusterCIDRs []netip.Prefix
	// Pods are the Pods running on this Node (host-network Pods excepted),
	// one element per IP, sorted by IP. A local member that leaves an
	// Egress while the same Pod (by UID) still holds its IP keeps the
	// flows it opened under that Egress on their path until they end (a
	// drain); without its Pod here, its entries are deleted at once (the
	// IP may already be another Pod's).
	Pods []LocalPod
	// Peers are the other Nodes, one element per internal IP, with their
	// Pod CIDRs (spec.podCIDRs). An egress Node admits a tunnelled flow
	// of a member it does not know yet (its EgressMemberSlice is not
	// there yet) when the outer source is a peer's IP, the inner source
	// lies in that peer's Pod CIDR, and the outer destination is an
	// egress IP held here; it routes replies to a peer's Pod CIDR back
	// through the tunnel to that peer.
	Peers []Peer
	// Splits are the member IPs whose destinations several Egresses
	// share, or that an Egress carries only in part (spec.destinationCIDRs,
	// spec.excludedCIDRs): their new flows are classified by destination
	// through an interval map per Split. Every IP of a Split is also in
	// Local (or Remote) of each Egress its Spans name; an IP in no Split
	// uses its one Egress for every destination outside the cluster.
	Splits []Split
}

// Split is a group of member IPs of one family whose destinations are
// divided alike (destinations.Resolve).
type Split struct {
	// IPs are the members, of one family.
	IPs []netip.Addr
	// Remote: members on other Nodes, whose tunnelled flows this Node,
	// their Egresses' egress Node, classifies (Spans name only Egresses
	// held here); else members running here.
	Remote bool
	// Spans say which Egress carries each destination; a destination in
	// no Span, or in the Span of an Egress without a datapath here
	// (failurePolicy Ignore and no Node), takes no Egress: a local
	// member's flow leaves with the Node IP.
	Spans []destinations.Span
}

// Peer is another Node by one of its internal IPs.
type Peer struct {
	// IP is one of the Node's internal IPs (status.addresses).
	IP netip.Addr
	// PodCIDRs are the Node's Pod CIDRs (spec.podCIDRs); those of IP's
	// family are used.
	PodCIDRs []netip.Prefix
}
