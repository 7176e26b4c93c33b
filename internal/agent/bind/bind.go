// Package bind puts egress IPs on a Linux interface with netlink and takes
// them off again, touching only addresses it added itself.
//
// # Addresses
//
// Every egress IP is added as a host address (/32 or /128) with
// IFA_F_NOPREFIXROUTE, so the kernel installs no prefix route and the Node's
// routing is unchanged, and for IPv6 with IFA_F_NODAD, so the address is
// usable (not tentative) at once, and deprecated (preferred lifetime 0) so
// the Node never picks it as a source address. Before adding an IPv4 address the
// interface's net.ipv4.conf.<if>.promote_secondaries is set to 1, so deleting
// a primary address never deletes the secondaries of its subnet. The devconf
// is written with RTM_SETLINK (IFLA_INET_CONF) instead of /proc/sys: both
// reach the same value in the agent's (host) namespace, but container
// runtimes mount /proc/sys read-only unless the container is privileged,
// whereas netlink needs only CAP_NET_ADMIN.
//
// # Ownership
//
// Ownership lives in the kernel, on the address itself: egressip sets the
// address protocol attribute IFA_PROTO (Linux 6.3+; iproute2 6.3+ shows and
// sets it as `proto`) to DefaultProto. It therefore survives
// a crash or restart of the agent and needs no state file or hostPath, and
// an address the agent did not add (the Node's own IPs, even inside a pool
// range, addresses added by hand or by another daemon) never carries it.
//
// vishvananda/netlink v1.3.1 has no field for IFA_PROTO (netlink.Addr has
// no Proto), so the package builds the RTM_NEWADDR / RTM_GETADDR messages it
// needs itself with the library's nl helpers (see rtnl.go), and uses the
// library for links and routes.
//
// Kernels older than 6.3 silently ignore IFA_PROTO. The first address a
// Binder adds is read back; if the mark is missing the address is deleted
// again and Bind fails with ErrOwnershipUnsupported, so an unmarked (and so
// unremovable) egress IP is never left behind.
package bind

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// DefaultProto is the IFA_PROTO value that marks addresses bound by egressip.
//
// The kernel defines IFAPROTO_UNSPEC (0), IFAPROTO_KERNEL_LO (1),
// IFAPROTO_KERNEL_RA (2) and IFAPROTO_KERNEL_LL (3), which is also all that
// iproute2's rt_addrprotos names. Daemons that mark addresses tend to reuse
// their route protocol number (keepalived: RTPROT_KEEPALIVED, 18), so the
// value also avoids every RTPROT_* in linux/rtnetlink.h (0-4, 8-18, 42, 84,
// 99, 186-189, 192) and 255. 101 is ASCII 'e'. Config.Proto overrides it
// should a site already use 101.
const DefaultProto uint8 = 101

var (
	// ErrNotOwned is returned by Unbind for an address egressip did not add.
	ErrNotOwned = errors.New("address is not owned by egressip")
	// ErrForeignAddress is returned by Bind when the IP is already present
	// on the Node without egressip's mark; it is left untouched.
	ErrForeignAddress = errors.New("address already present on the node and not owned by egressip")
	// ErrOwnershipUnsupported is returned when the kernel drops IFA_PROTO
	// (Linux < 6.3), so ownership could not be recorded.
	ErrOwnershipUnsupported = errors.New("kernel does not keep the address protocol (IFA_PROTO, Linux 6.3+)")
	// ErrInvalidIP is returned for addresses that cannot be egress IPs.
	ErrInvalidIP = errors.New("not a usable egress IP")
)

// Config configures a Binder.
type Config struct {
	// Interface, when set, is used for every IP whose Hint names none.
	Interface string
	// HintFor, when set, returns per-IP selection hints (typically from the
	// pool's subnetInfo). Its Interface overrides Config.Interface.
	HintFor func(netip.Addr) Hint
	// Proto overrides DefaultProto. Values 0-3 belong to the kernel.
	Proto uint8
}

// Bound is an address owned by egressip, as listed by the kernel.
type Bound struct {
	Addr      netip.Addr
	Interface string
	LinkIndex int
}

func (b Bound) String() string { return b.Addr.String() + "@" + b.Interface }

// Binder binds egress IPs in one network namespace. It is safe for concurrent
// use; mutations are serialised.
type Binder struct {
	links LinkSource
	rt    *rtnl
	h     *netlink.Handle
	cfg   Config
	proto uint8

	mu       sync.Mutex
	verified bool // the kernel was seen to keep IFA_PROTO
}

// New returns a Binder working in network namespace ns; pass netns.None()
// for the namespace of the calling process (the agent runs in the host
// namespace). Sockets are opened in ns at once, so the caller may close ns
// afterwards. Close releases them.
func New(ns netns.NsHandle, cfg Config) (*Binder, error) {
	proto := cfg.Proto
	if proto == 0 {
		proto = DefaultProto
	}
	if proto <= 3 {
		return nil, fmt.Errorf("address protocol %d is reserved for the kernel", proto)
	}
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("open netlink handle: %w", err)
	}
	rt, err := newRTNL(ns)
	if err != nil {
		h.Close()
		return nil, err
	}
	return &Binder{links: h, h: h, rt: rt, cfg: cfg, proto: proto}, nil
}

// Close releases the Binder's netlink sockets. Bound addresses stay.
func (b *Binder) Close() {
	b.rt.Close()
	b.h.Close()
}

// Proto is the IFA_PROTO value this Binder marks and recognises.
func (b *Binder) Proto() uint8 { return b.proto }

func normalize(ip netip.Addr) (netip.Addr, error) {
	ip = ip.Unmap()
	if !ip.IsValid() || ip.Zone() != "" || ip.IsUnspecified() || ip.IsLoopback() ||
		ip.IsMulticast() || ip.IsLinkLocalUnicast() || ip == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return netip.Addr{}, fmt.Errorf("%w: %q", ErrInvalidIP, ip)
	}
	return ip, nil
}

func (b *Binder) hint(ip netip.Addr) Hint {
	var h Hint
	if b.cfg.HintFor != nil {
		h = b.cfg.HintFor(ip)
	}
	if h.Interface == "" {
		h.Interface = b.cfg.Interface
	}
	return h
}

// Interface reports the interface Bind would choose for ip now.
func (b *Binder) Interface(ip netip.Addr) (string, error) {
	n, err := normalize(ip)
	if err != nil {
		return "", fmt.Errorf("find interface for %s: %w", ip, err)
	}
	l, err := SelectInterface(b.links, n, b.hint(n))
	if err != nil {
		return "", err
	}
	return l.Attrs().Name, nil
}

func hostAddr(ip netip.Addr, linkIndex int, proto uint8) kernelAddr {
	a := kernelAddr{Addr: ip, LinkIndex: linkIndex, Proto: proto, Flags: unix.IFA_F_NOPREFIXROUTE, PrefixLen: 32, Scope: egressScope(ip)}
	if ip.Is6() {
		a.PrefixLen = 128
		a.Flags |= unix.IFA_F_NODAD
	}
	return a
}

// Bind makes sure ip is on the interface chosen for it, marked as owned.
// changed is false when it already was. An owned copy of ip on another
// interface (the choice changed) is removed after the new one is added. A
// foreign address equal to ip makes Bind fail with ErrForeignAddress.
func (b *Binder) Bind(ip netip.Addr) (changed bool, err error) {
	ip, err = normalize(ip)
	if err != nil {
		return false, fmt.Errorf("bind: %w", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.bindLocked(ip)
}

func (b *Binder) bindLocked(ip netip.Addr) (bool, error) {
	link, err := SelectInterface(b.links, ip, b.hint(ip))
	if err != nil {
		return false, fmt.Errorf("bind %s: %w", ip, err)
	}
	idx, name := link.Attrs().Index, link.Attrs().Name

	present, err := b.rt.listAddrs(familyOf(ip))
	if err != nil {
		return false, fmt.Errorf("bind %s: %w", ip, err)
	}
	onTarget := false
	var rescope *kernelAddr
	var elsewhere []kernelAddr
	for _, a := range present {
		if a.Addr != ip {
			continue
		}
		switch {
		case a.Proto != b.proto:
			return false, fmt.Errorf("bind %s on %s: %w (found %s/%d on link %d, proto %d)",
				ip, name, ErrForeignAddress, a.Addr, a.PrefixLen, a.LinkIndex, a.Proto)
		case a.LinkIndex == idx:
			onTarget = true
			if a.Scope != egressScope(ip) {
				rescope = &a
			}
		default:
			elsewhere = append(elsewhere, a)
		}
	}

	changed := false
	if rescope != nil {
		if err := b.rebind(*rescope, hostAddr(ip, idx, b.proto)); err != nil {
			return false, fmt.Errorf("bind %s on %s: %w", ip, name, err)
		}
		changed = true
	}
	if !onTarget {
		if ip.Is4() {
			if err := b.ensurePromoteSecondaries(idx); err != nil {
				return false, fmt.Errorf("bind %s on %s: %w", ip, name, err)
			}
		}
		want := hostAddr(ip, idx, b.proto)
		if err := b.rt.addAddr(want); err != nil {
			return false, fmt.Errorf("bind %s on %s: add address: %w", ip, name, err)
		}
		changed = true
		if !b.verified {
			if err := b.verifyMark(want); err != nil {
				return false, fmt.Errorf("bind %s on %s: %w", ip, name, err)
			}
		}
	}
	for _, a := range elsewhere {
		if err := b.del(a); err != nil {
			return changed, fmt.Errorf("bind %s on %s: remove owned copy from link %d: %w", ip, name, a.LinkIndex, err)
		}
		changed = true
	}
	return changed, nil
}

// egressScope is the scope an egress IP is bound with. IPv4: host
// (RT_SCOPE_HOST), so that the kernel never picks it as the source of the
// Node's own traffic: inet_select_addr takes, for a route of scope
// universe or link, the first primary address of the device whose scope
// is at most the route's, in list order, so a /32 egress IP listed before
// the Node's own /32 (the Node's address removed and re-added, as a DHCP
// renewal does) would otherwise become the source of everything routed
// through a gateway (issue 23). The scope does not change how the address
// is reached: it still has its local route, answers ARP (arp_process
// looks for a local route, whatever the scope) and serves as an explicit
// (SNAT) source. IPv6 keeps scope universe (the address is deprecated
// instead, see addAddr): an IPv6 host scope is ::1's and the Node must
// still answer Neighbor Solicitations for it.
func egressScope(ip netip.Addr) uint8 {
	if ip.Is4() {
		return unix.RT_SCOPE_HOST
	}
	return unix.RT_SCOPE_UNIVERSE
}

// rebind replaces an owned address bound with another scope (by an agent
// from before egressScope) by want: the kernel keeps the scope of an
// existing address on NLM_F_REPLACE, so it is deleted and added again (the
// address is absent for that one round trip; conntrack entries stay).
func (b *Binder) rebind(old, want kernelAddr) error {
	if err := b.del(old); err != nil {
		return fmt.Errorf("remove address of scope %d: %w", old.Scope, err)
	}
	if err := b.rt.addAddr(want); err != nil {
		return fmt.Errorf("add it again with scope %d: %w", want.Scope, err)
	}
	return nil
}

// verifyMark reads the just-added address back. If the kernel dropped the
// mark, the address is removed again: it was created by us (NLM_F_EXCL).
func (b *Binder) verifyMark(want kernelAddr) error {
	present, err := b.rt.listAddrs(familyOf(want.Addr))
	if err != nil {
		return err
	}
	for _, a := range present {
		if a.Addr != want.Addr || a.LinkIndex != want.LinkIndex {
			continue
		}
		if a.Proto == b.proto {
			b.verified = true
			return nil
		}
		if err := b.rt.delAddr(want); err != nil {
			return fmt.Errorf("%w; removing the unmarked address failed too: %v", ErrOwnershipUnsupported, err)
		}
		return ErrOwnershipUnsupported
	}
	return fmt.Errorf("address vanished right after it was added")
}

func (b *Binder) ensurePromoteSecondaries(idx int) error {
	on, err := b.rt.promoteSecondaries(idx)
	if err != nil {
		return fmt.Errorf("read promote_secondaries: %w", err)
	}
	if on {
		return nil
	}
	if err := b.rt.setPromoteSecondaries(idx); err != nil {
		return fmt.Errorf("set promote_secondaries: %w", err)
	}
	return nil
}

func (b *Binder) del(a kernelAddr) error {
	err := b.rt.delAddr(a)
	if errors.Is(err, unix.EADDRNOTAVAIL) || errors.Is(err, unix.ENODEV) {
		return nil // already gone
	}
	return err
}

// Unbind removes ip if egressip owns it (on whichever interface). It is a
// no-op when ip is not present and fails with ErrNotOwned, removing nothing,
// when ip is present but not owned.
func (b *Binder) Unbind(ip netip.Addr) error {
	ip, err := normalize(ip)
	if err != nil {
		return fmt.Errorf("unbind: %w", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	present, err := b.rt.listAddrs(familyOf(ip))
	if err != nil {
		return fmt.Errorf("unbind %s: %w", ip, err)
	}
	return b.unbindLocked(ip, present)
}

func (b *Binder) unbindLocked(ip netip.Addr, present []kernelAddr) error {
	found, owned := false, false
	var errs []error
	for _, a := range present {
		if a.Addr != ip {
			continue
		}
		found = true
		if a.Proto != b.proto {
			continue
		}
		owned = true
		if err := b.del(a); err != nil {
			errs = append(errs, fmt.Errorf("unbind %s from link %d: %w", ip, a.LinkIndex, err))
		}
	}
	if found && !owned {
		return fmt.Errorf("unbind %s: %w", ip, ErrNotOwned)
	}
	return errors.Join(errs...)
}

// Owned lists the addresses egressip owns, read from the kernel, sorted by
// address then interface.
func (b *Binder) Owned() ([]Bound, error) {
	present, err := b.rt.listAddrs(unix.AF_UNSPEC)
	if err != nil {
		return nil, fmt.Errorf("list owned addresses: %w", err)
	}
	return b.owned(present)
}

func (b *Binder) owned(present []kernelAddr) ([]Bound, error) {
	var out []Bound
	var names map[int]string
	for _, a := range present {
		if a.Proto != b.proto {
			continue
		}
		if names == nil {
			links, err := b.links.LinkList()
			if err != nil {
				return nil, fmt.Errorf("list owned addresses: list links: %w", err)
			}
			names = make(map[int]string, len(links))
			for _, l := range links {
				names[l.Attrs().Index] = l.Attrs().Name
			}
		}
		out = append(out, Bound{Addr: a.Addr, Interface: names[a.LinkIndex], LinkIndex: a.LinkIndex})
	}
	slices.SortFunc(out, func(x, y Bound) int {
		if c := x.Addr.Compare(y.Addr); c != 0 {
			return c
		}
		return x.LinkIndex - y.LinkIndex
	})
	return out, nil
}

// Sync makes the owned addresses equal to desired: owned addresses that are
// not desired are removed first (release before acquire), then every
// desired IP is bound. Addresses not owned by egressip and routes are never
// touched. added lists the desired IPs that Bind changed (new, or moved to
// another interface), removed the owned IPs taken off. Errors for single
// IPs do not stop the others; they are joined.
func (b *Binder) Sync(desired []netip.Addr) (added, removed []netip.Addr, err error) {
	want := make(map[netip.Addr]bool, len(desired))
	var errs []error
	for _, ip := range desired {
		n, err := normalize(ip)
		if err != nil {
			errs = append(errs, fmt.Errorf("sync: %w", err))
			continue
		}
		want[n] = true
	}

	b.mu.Lock()
	defer b.mu.Unlock()

	present, err := b.rt.listAddrs(unix.AF_UNSPEC)
	if err != nil {
		return nil, nil, fmt.Errorf("sync: %w", err)
	}
	stale := map[netip.Addr]bool{}
	for _, a := range present {
		if a.Proto == b.proto && !want[a.Addr] {
			stale[a.Addr] = true
		}
	}
	for _, ip := range sortedKeys(stale) {
		if err := b.unbindLocked(ip, present); err != nil {
			errs = append(errs, fmt.Errorf("sync: %w", err))
			continue
		}
		removed = append(removed, ip)
	}
	for _, ip := range sortedKeys(want) {
		changed, err := b.bindLocked(ip)
		if err != nil {
			errs = append(errs, fmt.Errorf("sync: %w", err))
		}
		if changed {
			added = append(added, ip)
		}
	}
	return added, removed, errors.Join(errs...)
}

func sortedKeys(m map[netip.Addr]bool) []netip.Addr {
	out := make([]netip.Addr, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}
