package bind

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ErrNoInterface is wrapped by interface selection when no interface fits.
var ErrNoInterface = errors.New("no interface: none configured, no connected subnet holds the address and no default route for its family")

// Hint carries what is known about where an egress IP belongs, typically from
// the agent's configuration and the pool's subnetInfo. The zero Hint means
// "work it out from the kernel's addresses and routes".
type Hint struct {
	// MAC, when set, picks the link with this hardware address, written
	// as net.HardwareAddr.String does (lower case, colon-separated): the
	// cloud network interface the controller attached the address to
	// (Egress status.interfaceMAC). It wins over Interface, because the
	// cloud delivers the address only to that interface.
	MAC string
	// Interface, when set, is used as is (it must exist).
	Interface string
	// Subnet is the pool's L2 subnet (subnetInfo gateway + prefixLength).
	// When valid, the interface that has an address inside it is chosen,
	// which also works for pool IPs outside every connected prefix.
	Subnet netip.Prefix
	// VLAN is subnetInfo.vlan: when non-zero the address goes on the VLAN
	// sub-interface with this ID of the interface chosen above (or on the
	// chosen interface itself if it already is that VLAN).
	VLAN int
}

// LinkSource is the read-only slice of netlink that interface selection needs.
// *netlink.Handle satisfies it; tests may provide a double (for instance to
// exercise VLAN sub-interfaces on a kernel without the 8021q module).
type LinkSource interface {
	LinkList() ([]netlink.Link, error)
	// AddrList with a nil link lists the addresses of every link.
	AddrList(link netlink.Link, family int) ([]netlink.Addr, error)
	RouteListFiltered(family int, filter *netlink.Route, filterMask uint64) ([]netlink.Route, error)
}

// SelectInterface chooses the link that should carry ip, in this order:
//
//  0. the link whose hardware address is hint.MAC, when set (an error
//     wrapping ErrNoInterface when none has it; if several do, such as a
//     bond and its ports, the lowest index that is not a bond port);
//  1. hint.Interface, when set;
//  2. the up, non-loopback link with a connected subnet (an address with a
//     prefix route, i.e. without noprefixroute) holding ip - or holding an
//     address inside hint.Subnet when that is set; the longest prefix wins,
//     then the lowest link index;
//  3. the link of the main table's default route for ip's family (lowest
//     metric, then lowest link index; first hop of a multipath route).
//
// hint.VLAN is then applied. Errors wrap ErrNoInterface or the netlink error
// and read "find interface for <ip>: ...".
func SelectInterface(src LinkSource, ip netip.Addr, hint Hint) (netlink.Link, error) {
	ip = ip.Unmap()
	links, err := src.LinkList()
	if err != nil {
		return nil, fmt.Errorf("find interface for %s: list links: %w", ip, err)
	}
	byIndex := make(map[int]netlink.Link, len(links))
	for _, l := range links {
		byIndex[l.Attrs().Index] = l
	}

	var base netlink.Link
	var how string
	switch {
	case hint.MAC != "":
		for _, l := range links {
			a := l.Attrs()
			if a.HardwareAddr.String() != hint.MAC || a.MasterIndex != 0 && isBond(byIndex[a.MasterIndex]) {
				continue
			}
			if base == nil || a.Index < base.Attrs().Index {
				base = l
			}
		}
		if base == nil {
			return nil, fmt.Errorf("find interface for %s: no link with hardware address %s: %w", ip, hint.MAC, ErrNoInterface)
		}
		how = "hardware address"
	case hint.Interface != "":
		for _, l := range links {
			if l.Attrs().Name == hint.Interface {
				base = l
			}
		}
		if base == nil {
			return nil, fmt.Errorf("find interface for %s: configured interface %q: %w", ip, hint.Interface, ErrNoInterface)
		}
		how = "configured"
	default:
		base, err = connectedLink(src, byIndex, ip, hint.Subnet)
		if err != nil {
			return nil, fmt.Errorf("find interface for %s: %w", ip, err)
		}
		how = "connected subnet"
		if base == nil {
			base, err = defaultRouteLink(src, byIndex, ip)
			if err != nil {
				return nil, fmt.Errorf("find interface for %s: %w", ip, err)
			}
			how = "default route"
		}
		if base == nil {
			return nil, fmt.Errorf("find interface for %s: %w", ip, ErrNoInterface)
		}
	}

	if hint.VLAN == 0 {
		return base, nil
	}
	if v, ok := base.(*netlink.Vlan); ok && v.VlanId == hint.VLAN {
		return base, nil
	}
	var found netlink.Link
	for _, l := range links {
		v, ok := l.(*netlink.Vlan)
		if !ok || v.VlanId != hint.VLAN || v.Attrs().ParentIndex != base.Attrs().Index {
			continue
		}
		if found == nil || l.Attrs().Index < found.Attrs().Index {
			found = l
		}
	}
	if found == nil {
		return nil, fmt.Errorf("find interface for %s: %w", ip, &noVLANLinkError{vlan: hint.VLAN, parent: base.Attrs().Name, how: how})
	}
	return found, nil
}

// noVLANLinkError: the pool's subnetInfo.vlan has no sub-interface on the
// parent interface selection found. It is an ErrNoInterface (errors.Is),
// with a message of its own: the parent was found, only the VLAN link is
// missing, and the fix is to create it or let the agent do so.
type noVLANLinkError struct {
	vlan   int
	parent string
	how    string // how the parent was chosen, e.g. "default route"
}

func (e *noVLANLinkError) Error() string {
	return fmt.Sprintf("no VLAN %d sub-interface of %s (%s): create it, or let the agent create it with --create-vlans "+
		"(chart value agent.createVLANs)", e.vlan, e.parent, e.how)
}

// Is makes errors.Is(err, ErrNoInterface) true.
func (e *noVLANLinkError) Is(target error) bool { return target == ErrNoInterface }

func isBond(l netlink.Link) bool {
	_, ok := l.(*netlink.Bond)
	return ok
}

func usable(l netlink.Link) bool {
	a := l.Attrs()
	return a.Flags&net.FlagUp != 0 && a.Flags&net.FlagLoopback == 0
}

func connectedLink(src LinkSource, byIndex map[int]netlink.Link, ip netip.Addr, subnet netip.Prefix) (netlink.Link, error) {
	addrs, err := src.AddrList(nil, familyOf(ip))
	if err != nil {
		return nil, fmt.Errorf("list addresses: %w", err)
	}
	type cand struct {
		link netlink.Link
		bits int
	}
	var cands []cand
	for _, a := range addrs {
		if a.IPNet == nil || a.Flags&unix.IFA_F_NOPREFIXROUTE != 0 {
			continue // no prefix route: not a connected subnet (our own /32s among them)
		}
		l, ok := byIndex[a.LinkIndex]
		if !ok || !usable(l) {
			continue
		}
		addr, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		addr = addr.Unmap()
		ones, bits := a.Mask.Size()
		if ones == bits || addr.IsLinkLocalUnicast() {
			continue // host addresses and link-local prefixes hold nothing else
		}
		pfx := netip.PrefixFrom(addr, ones).Masked()
		var match bool
		if subnet.IsValid() {
			match = subnet.Contains(addr)
		} else {
			match = pfx.Contains(ip)
		}
		if match {
			cands = append(cands, cand{l, ones})
		}
	}
	if len(cands) == 0 {
		return nil, nil
	}
	slices.SortFunc(cands, func(a, b cand) int {
		if a.bits != b.bits {
			return cmp.Compare(b.bits, a.bits) // longest prefix first
		}
		return cmp.Compare(a.link.Attrs().Index, b.link.Attrs().Index)
	})
	return cands[0].link, nil
}

func defaultRouteLink(src LinkSource, byIndex map[int]netlink.Link, ip netip.Addr) (netlink.Link, error) {
	routes, err := src.RouteListFiltered(familyOf(ip), &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("list routes: %w", err)
	}
	var best *netlink.Route
	var bestLink netlink.Link
	for i := range routes {
		r := &routes[i]
		if r.Dst != nil {
			if ones, _ := r.Dst.Mask.Size(); ones != 0 {
				continue
			}
		}
		idx := r.LinkIndex
		if idx == 0 && len(r.MultiPath) > 0 {
			idx = r.MultiPath[0].LinkIndex
		}
		l, ok := byIndex[idx]
		if !ok {
			continue
		}
		if best == nil || r.Priority < best.Priority ||
			(r.Priority == best.Priority && idx < bestLink.Attrs().Index) {
			best, bestLink = r, l
		}
	}
	return bestLink, nil
}
