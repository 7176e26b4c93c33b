package poolroute

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// VLANAlias is the interface alias (IFLA_IFALIAS, `ip link set ... alias`)
// that marks a VLAN sub-interface as egressip's. The kernel keeps an alias
// on every link type since long before any supported kernel, so ownership
// survives agent restarts and crashes.
const VLANAlias = "egressip:vlan"

// IPv4 devconf indices (include/uapi/linux/ip.h, enum IPV4_DEVCONF_*),
// written inside IFLA_INET_CONF.
const (
	devconfRPFilter  = 8
	devconfARPIgnore = 19
)

// VLANSysctls are the IPv4 devconf values set on an owned VLAN
// sub-interface, and on it only: rp_filter 2 (loose: replies and tunnel
// packets from the Node's other networks arrive on it while the main
// table routes their sources elsewhere), arp_ignore 1 (answer ARP only
// for addresses configured on the sub-interface itself, the egress IPs,
// never for the Node's own addresses on the pool's VLAN).
var VLANSysctls = map[int]uint32{devconfRPFilter: 2, devconfARPIgnore: 1}

// Errors wrapped by VLANs.Sync results.
var (
	// ErrForeignVLAN: a VLAN link with the wanted ID already exists on the
	// parent and egressip did not create it; it is never adopted, changed
	// or deleted.
	ErrForeignVLAN = errors.New("a VLAN sub-interface egressip did not create already carries this VLAN ID")
	// ErrNoParent: the parent interface does not exist on this Node.
	ErrNoParent = errors.New("VLAN parent interface does not exist on this Node")
	// ErrVLANConflict: two pools want the same VLAN ID on different parents.
	ErrVLANConflict = errors.New("two pools want the same VLAN ID on different parents")
)

// LinkOps is the slice of netlink the VLAN rules need. NetlinkLinks
// implements it on a real namespace; tests use a double where the kernel
// has no 802.1Q support.
type LinkOps interface {
	LinkList() ([]netlink.Link, error)
	// LinkAdd creates l (a *netlink.Vlan).
	LinkAdd(l netlink.Link) error
	LinkDel(l netlink.Link) error
	LinkSetUp(l netlink.Link) error
	LinkSetAlias(l netlink.Link, alias string) error
	// SetIPv4Conf writes IPv4 devconf values (index -> value) of a link.
	SetIPv4Conf(linkIndex int, conf map[int]uint32) error
}

// NetlinkLinks is LinkOps on one network namespace.
type NetlinkLinks struct {
	*netlink.Handle
	sock *nl.SocketHandle
}

// NewNetlinkLinks opens LinkOps in ns (netns.None(): the current one).
// Close releases the sockets.
func NewNetlinkLinks(ns netns.NsHandle) (*NetlinkLinks, error) {
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("open netlink: %w", err)
	}
	s, err := nl.GetNetlinkSocketAt(ns, netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("open rtnetlink socket: %w", err)
	}
	return &NetlinkLinks{Handle: h, sock: &nl.SocketHandle{Socket: s}}, nil
}

// Close releases the sockets.
func (n *NetlinkLinks) Close() {
	n.sock.Close()
	n.Handle.Close()
}

// SetIPv4Conf writes the values with RTM_SETLINK (IFLA_AF_SPEC, AF_INET,
// IFLA_INET_CONF) rather than /proc/sys, which container runtimes mount
// read-only; this needs only CAP_NET_ADMIN.
func (n *NetlinkLinks) SetIPv4Conf(linkIndex int, conf map[int]uint32) error {
	req := nl.NewNetlinkRequest(unix.RTM_SETLINK, unix.NLM_F_ACK)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: n.sock}
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(linkIndex)
	req.AddData(msg)
	spec := nl.NewRtAttr(unix.IFLA_AF_SPEC, nil)
	c := spec.AddRtAttr(unix.AF_INET, nil).AddRtAttr(unix.IFLA_INET_CONF, nil)
	keys := make([]int, 0, len(conf))
	for k := range conf {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		v := make([]byte, 4)
		binary.NativeEndian.PutUint32(v, conf[k])
		c.AddRtAttr(k, v)
	}
	req.AddData(spec)
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
		return fmt.Errorf("set IPv4 devconf of link %d: %w", linkIndex, err)
	}
	return nil
}

// VLANWant is one pool's need of a VLAN sub-interface on this Node.
type VLANWant struct {
	// Pool names the pool, for messages.
	Pool string
	// ID is subnetInfo.vlan (1..4094).
	ID int
	// Parent is the interface the sub-interface goes on (the one carrying
	// the untagged subnet, or the agent's --vlan-parent).
	Parent string
}

// VLANResult is the outcome for one VLANWant.
type VLANResult struct {
	VLANWant
	// Link is the sub-interface's name when it is in place.
	Link string
	// Created: Sync created it in this pass.
	Created bool
	// Foreign names the link of another owner that holds the VLAN ID on
	// the parent, or the sub-interface's name (Err wraps ErrForeignVLAN).
	Foreign string
	// Err wraps ErrForeignVLAN, ErrNoParent or ErrVLANConflict, or a
	// netlink error; the message names the links.
	Err error
}

// VLANs keeps the VLAN sub-interfaces egressip owns in one namespace.
type VLANs struct{ ops LinkOps }

// NewVLANs returns the VLAN rules over ops.
func NewVLANs(ops LinkOps) *VLANs { return &VLANs{ops: ops} }

// VLANName is the name of egressip's sub-interface with VLAN ID id on the
// link of index parent: "egv<parent index>.<id>", at most 15 bytes
// (IFNAMSIZ-1) for every parent index below 10^6. It never looks like the
// names people give VLANs (eth0.100), so a foreign link is not mistaken for
// ours by its name.
func VLANName(parent, id int) string { return fmt.Sprintf("egv%d.%d", parent, id) }

// owned tells egressip's sub-interfaces: the alias, or (a crash between
// the add and the alias) no alias and our name for its parent and ID.
func owned(v *netlink.Vlan) bool {
	a := v.Attrs()
	return a.Alias == VLANAlias || a.Alias == "" && a.Name == VLANName(a.ParentIndex, v.VlanId)
}

// Sync makes egressip's VLAN sub-interfaces exactly those wants need:
// it creates missing ones (marked with VLANAlias, loose rp_filter and
// arp_ignore 1 on the sub-interface only, up), reuses one sub-interface
// for every pool wanting the same parent and ID, and deletes its own that
// no pool wants. A VLAN link of another owner with a wanted parent and
// ID is never adopted, changed or deleted: those wants fail with
// ErrForeignVLAN naming it. Results come in the order of wants. The error
// is for listing links, or deleting unused ones, failing.
func (v *VLANs) Sync(wants []VLANWant) ([]VLANResult, error) {
	links, err := v.ops.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	byName := map[string]netlink.Link{}
	byIndex := map[int]netlink.Link{}
	for _, l := range links {
		byName[l.Attrs().Name] = l
		byIndex[l.Attrs().Index] = l
	}
	res := make([]VLANResult, len(wants))
	// Pools in name order decide conflicts: the first pool's parent for
	// an ID stands, later pools naming another parent fail.
	order := make([]int, len(wants))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(wants[a].Pool, wants[b].Pool) })
	type key struct{ parent, id int }
	firstParent := map[int]VLANWant{}
	keep := map[int]bool{} // indices of our links still wanted
	done := map[key]VLANResult{}
	for _, i := range order {
		w := wants[i]
		r := VLANResult{VLANWant: w}
		p, ok := byName[w.Parent]
		switch {
		case w.ID < 1 || w.ID > 4094:
			r.Err = fmt.Errorf("pool %s: VLAN ID %d: out of 1..4094", w.Pool, w.ID)
		case !ok:
			r.Err = fmt.Errorf("pool %s: VLAN %d: parent %q: %w", w.Pool, w.ID, w.Parent, ErrNoParent)
		}
		if r.Err == nil {
			if f, seen := firstParent[w.ID]; seen && f.Parent != w.Parent {
				r.Err = fmt.Errorf("pool %s: VLAN %d on %s: %w (pool %s has it on %s)", w.Pool, w.ID, w.Parent, ErrVLANConflict, f.Pool, f.Parent)
			} else if !seen {
				firstParent[w.ID] = w
			}
		}
		if r.Err != nil {
			res[i] = r
			continue
		}
		k := key{p.Attrs().Index, w.ID}
		if d, ok := done[k]; ok {
			d.VLANWant, d.Created = w, false
			res[i] = d
			continue
		}
		name, created, idx, err := v.ensure(links, byName, p, w.ID)
		r.Link, r.Created = name, created
		if errors.Is(err, ErrForeignVLAN) {
			r.Link, r.Foreign = "", name
		}
		if err != nil {
			r.Err = fmt.Errorf("pool %s: VLAN %d on %s: %w", w.Pool, w.ID, w.Parent, err)
		} else {
			keep[idx] = true
		}
		done[k] = r
		res[i] = r
	}
	var errs []error
	for _, l := range links {
		vl, ok := l.(*netlink.Vlan)
		if !ok || !owned(vl) || keep[l.Attrs().Index] {
			continue
		}
		if err := v.ops.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
			errs = append(errs, fmt.Errorf("delete unused VLAN sub-interface %s: %w", l.Attrs().Name, err))
		}
	}
	return res, errors.Join(errs...)
}

// ensure finds or creates the sub-interface of parent p with id, and
// returns its name, whether it was created, and its index. On
// ErrForeignVLAN the name is the foreign link's.
func (v *VLANs) ensure(links []netlink.Link, byName map[string]netlink.Link, p netlink.Link, id int) (string, bool, int, error) {
	pi := p.Attrs().Index
	for _, l := range links {
		vl, ok := l.(*netlink.Vlan)
		if !ok || vl.Attrs().ParentIndex != pi || vl.VlanId != id {
			continue
		}
		if !owned(vl) {
			return vl.Attrs().Name, false, 0, fmt.Errorf("%w: %s (alias %q) is left alone; delete it, or give the pool another VLAN ID, for egressip to manage it",
				ErrForeignVLAN, vl.Attrs().Name, vl.Attrs().Alias)
		}
		return vl.Attrs().Name, false, vl.Attrs().Index, v.prepare(vl)
	}
	name := VLANName(pi, id)
	if len(name) > unix.IFNAMSIZ-1 {
		return "", false, 0, fmt.Errorf("sub-interface name %s is longer than %d bytes", name, unix.IFNAMSIZ-1)
	}
	if l, ok := byName[name]; ok {
		return name, false, 0, fmt.Errorf("%w: a link named %s (type %s) exists and is not VLAN %d of %s; it is left alone",
			ErrForeignVLAN, name, l.Type(), id, p.Attrs().Name)
	}
	nv := &netlink.Vlan{LinkAttrs: netlink.LinkAttrs{Name: name, ParentIndex: pi}, VlanId: id, VlanProtocol: netlink.VLAN_PROTOCOL_8021Q}
	if err := v.ops.LinkAdd(nv); err != nil {
		return "", false, 0, fmt.Errorf("create %s: %w", name, err)
	}
	// Find it again for its index (the double and the kernel both list it).
	now, err := v.ops.LinkList()
	if err != nil {
		return name, true, 0, fmt.Errorf("list links: %w", err)
	}
	for _, l := range now {
		if vl, ok := l.(*netlink.Vlan); ok && vl.Attrs().Name == name {
			return name, true, vl.Attrs().Index, v.prepare(vl)
		}
	}
	return name, true, 0, fmt.Errorf("created %s, but it is not listed", name)
}

// prepare marks an owned sub-interface, sets its sysctls and brings it up.
func (v *VLANs) prepare(l *netlink.Vlan) error {
	if l.Attrs().Alias != VLANAlias {
		if err := v.ops.LinkSetAlias(l, VLANAlias); err != nil {
			return fmt.Errorf("mark %s as egressip's (alias): %w", l.Attrs().Name, err)
		}
	}
	if err := v.ops.SetIPv4Conf(l.Attrs().Index, VLANSysctls); err != nil {
		return fmt.Errorf("sysctls of %s: %w", l.Attrs().Name, err)
	}
	if err := v.ops.LinkSetUp(l); err != nil {
		return fmt.Errorf("set %s up: %w", l.Attrs().Name, err)
	}
	return nil
}
