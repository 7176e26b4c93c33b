// Package nodeaddr indexes the Nodes' own addresses, which are never egress
// IPs (issue 14): the controller keeps them out of every pool's allocation
// and unassigns an Egress whose IP a Node takes, and the webhook refuses a
// named spec.egressIP equal to one. It is pure: callers pass Node objects
// and say which addresses to leave out.
package nodeaddr

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Owner is the Node an address belongs to and how the Node lists it.
type Owner struct {
	// Node is the Node's name.
	Node string
	// Type is corev1.NodeInternalIP or corev1.NodeExternalIP.
	Type corev1.NodeAddressType
}

// String reads "the InternalIP of Node worker-1".
func (o Owner) String() string { return fmt.Sprintf("the %s of Node %s", o.Type, o.Node) }

// Index maps each Node address to its Owner.
type Index map[netip.Addr]Owner

// Build returns the InternalIP and ExternalIP entries of every Node's
// status.addresses (Kubernetes: kubelet or the cloud provider fills them),
// as canonical unmapped addresses. Entries that are not IP addresses are
// ignored. An address listed by several Nodes belongs to the first by name,
// so the result does not depend on the order of nodes. skip, when not nil,
// leaves out an address of a Node: the controller uses it for an egress IP
// the Node itself holds, which some cloud providers list back as an
// InternalIP of that Node.
func Build(nodes []corev1.Node, skip func(node string, ip netip.Addr) bool) Index {
	idx := Index{}
	order := make([]*corev1.Node, 0, len(nodes))
	for i := range nodes {
		order = append(order, &nodes[i])
	}
	slices.SortFunc(order, func(a, b *corev1.Node) int { return cmp.Compare(a.Name, b.Name) })
	for _, n := range order {
		for _, a := range n.Status.Addresses {
			if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
				continue
			}
			ip, err := netip.ParseAddr(strings.TrimSpace(a.Address))
			if err != nil || ip.Zone() != "" {
				continue
			}
			ip = ip.Unmap()
			if _, taken := idx[ip]; taken || (skip != nil && skip(n.Name, ip)) {
				continue
			}
			idx[ip] = Owner{Node: n.Name, Type: a.Type}
		}
	}
	return idx
}

// Sorted returns the addresses of idx in ascending order.
func (idx Index) Sorted() []netip.Addr {
	out := make([]netip.Addr, 0, len(idx))
	for ip := range idx {
		out = append(out, ip)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}
