// Package ipam allocates egress IPs from ExternalIPPools. It is pure Go over
// net/netip values, with no Kubernetes types: the controller and the
// validating webhook convert API objects into Range and SubnetInfo.
//
// # Pools
//
// A pool's spec.ipRanges has one or more entries, each a CIDR or a start/end
// pair, all of one IP family, none sharing an address (ParseRanges, NewPool).
// A CIDR must be canonical: "192.0.2.5/24" is rejected, not masked, since the
// user may have meant something else.
//
// # Which addresses are allocated
//
// The allocatable addresses of a pool are the addresses of its ranges minus:
//
//   - for an IPv4 CIDR shorter than /31, its network (all host bits zero) and
//     broadcast (all host bits one) addresses. A /31 gives both of its
//     addresses (RFC 3021, point-to-point links) and a /32 its only one;
//   - for an IPv6 CIDR shorter than /127, its Subnet-Router anycast address
//     (all interface-identifier bits zero, RFC 4291 section 2.6.1), which
//     routers on the link answer. A /127 gives both addresses (RFC 6164) and
//     a /128 its only one. IPv6 has no broadcast address. The reserved subnet
//     anycast addresses of RFC 2526 (the highest 128 interface identifiers of
//     a 64-bit-IID subnet) are not skipped;
//   - the gateway, subnetInfo.gateway, wherever it lies;
//   - when subnetInfo.prefixLength is set, the same network/broadcast
//     (IPv4) or Subnet-Router anycast (IPv6) addresses of that subnet, since
//     a host cannot use them on the link whatever the range says;
//   - the special-purpose blocks of SpecialBlocks (loopback, link-local,
//     multicast, "this network", limited broadcast, unspecified,
//     IPv4-mapped) wherever a range spans them: the API refuses such ranges
//     (SpecialOverlaps), but a pool admitted before keeps working without
//     handing them out;
//   - the addresses the caller excludes (Pool.WithExclusions): the
//     controller passes every Node's InternalIP and ExternalIP, so that a
//     Node's own address is never an egress IP.
//
// Pool.Excluded counts the addresses left out for each of these causes.
//
// A start/end range gives every address from start to end inclusive, apart
// from the gateway and the subnet's own reserved addresses.
//
// # Sizes
//
// Counts are uint64 and saturate at math.MaxUint64 instead of overflowing:
// one IPv6 /64 already holds 2^64 addresses. Used never exceeds Total and
// never goes below zero.
//
// # Allocation
//
// An Allocator holds the allocated addresses of one pool in memory only; the
// API server is the only store, so the controller rebuilds it from the IPs
// in Egress statuses (ReserveAll). Allocate returns the lowest free
// address, so the same allocated set always yields the same next IP. Egresses
// that name the same IP share one allocation, counted once.
package ipam
