package datapath

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// RoleDrain is the role of an Egress that has no other part on this Node
// than the flows of members that left it (see drain): its ID, policy rule
// and route are kept for those flows only; nothing classifies new flows
// into it. It is never part of a State; Plan.Roles and the ids set carry
// it.
const RoleDrain Role = 100

// DefaultDrainTimeout bounds a drain when Config.DrainTimeout is 0.
const DefaultDrainTimeout = time.Hour

// LocalPod is a Pod running on this Node, by one of its IPs.
type LocalPod struct {
	// IP is one of the Pod's IPs (status.podIPs, or the CNI plugin's).
	IP netip.Addr
	// UID is the Pod's metadata.uid: it tells the Pod that held an IP
	// before from another Pod given the same IP since.
	UID string
}

// drain is one member's flows under an Egress it left, kept on the path
// their first packet was given until they end (docs/datapath.md, "Flows
// that predate an Egress, or change Egress").
type drain struct {
	// Egress is the Egress the member left; IP the member's IP.
	Egress string
	IP     netip.Addr
	// Mark is the connection-mark bits of its entries: the Egress's ID
	// mark, with FromTunnel for a remote member.
	Mark uint32
	// EIP is the egress IP the flows use: where a source Node's route
	// sends them, or the address an egress Node holds and SNATs them to.
	EIP netip.Addr
	// Host is a remote member's Node IP (the return route's outer
	// destination); invalid for a member running here.
	Host netip.Addr
	// OnEgress is set for a member running on the Egress's own egress
	// Node (no route needed, only its entries).
	OnEgress bool
	// UID is the Pod of a member running here.
	UID string
	// Since is when the member left the Egress.
	Since time.Time
}

type drainKey struct {
	egress string
	ip     netip.Addr
}

// liveKey counts conntrack entries by original source and ID mark.
type liveKey struct {
	ip netip.Addr
	id uint32
}

// drainInput is what planDrains decides from: the State being applied,
// what was programmed before, and the live conntrack entries.
type drainInput struct {
	cfg Config
	st  State
	now time.Time
	// timeout bounds a drain (> 0).
	timeout time.Duration
	// prev* describe the last Apply (prevRoutes is nil after a restart:
	// no drain can start then, the outer destinations are unknown).
	prevMembers map[netip.Addr]uint32
	prevSplits  map[netip.Addr][]uint32
	prevIDs     IDs
	prevRoles   map[string]Role
	prevEIPs    map[string]netip.Addr
	prevUIDs    map[netip.Addr]string
	prevRoutes  []EncapRoute
	drains      map[drainKey]drain
	// live counts the entries of each (member IP, ID mark) that have not
	// ended (TCP TIME_WAIT and CLOSE excluded); nil when not counted.
	live map[liveKey]int
}

// planDrains decides which drains go on and which end (a pure step of
// Apply). A member that leaves an Egress here while it still runs (a local
// member: the same Pod, by UID, still holds the IP; a remote member: the
// egress Node cannot tell, the controller's slice only drops it) starts a
// drain when its old path can still serve its flows: on a source Node the
// Egress keeps its egress IP (or has no other part here), on the egress
// Node it still holds the same IP. A drain ends when no entry of it is
// live any more, when the path stops being servable (the Egress lost its
// IP or its role here, the Pod went away or its IP went to another Pod),
// or after the timeout; the entries of an ended drain are deleted. A
// member that rejoins the Egress is no longer draining.
func planDrains(in drainInput) (keep map[drainKey]drain, ended []drain) {
	keep = map[drainKey]drain{}
	v := newDrainView(in.st)
	for k, dr := range in.drains {
		switch {
		case v.member(dr.Egress, dr.IP):
			// A member again: its entries are its Egress's as before.
		case !v.servable(dr), in.now.Sub(dr.Since) >= in.timeout,
			in.live != nil && in.live[liveKey{dr.IP, dr.Mark & in.cfg.IDMask}] == 0:
			ended = append(ended, dr)
		default:
			keep[k] = dr
		}
	}
	if in.prevRoutes == nil {
		return keep, ended
	}
	byMark := make(map[uint32]string, len(in.prevIDs))
	for n, id := range in.prevIDs {
		byMark[in.cfg.Mark(id)] = n
	}
	for ip, marks := range memberMarks(in.prevMembers, in.prevSplits) {
		for _, mark := range marks {
			name := byMark[mark&in.cfg.IDMask]
			k := drainKey{name, ip}
			if _, ok := keep[k]; name == "" || ok || v.member(name, ip) {
				continue
			}
			if in.live != nil && in.live[liveKey{ip, mark & in.cfg.IDMask}] == 0 {
				continue // no open flow: nothing to drain
			}
			if dr, ok := in.startDrain(v, name, ip, mark); ok {
				keep[k] = dr
			}
		}
	}
	return keep, ended
}

// startDrain returns the drain of member ip (whose entries carry mark)
// that has just left Egress name, and whether it drains at all.
func (in drainInput) startDrain(v drainView, name string, ip netip.Addr, mark uint32) (drain, bool) {
	dr := drain{Egress: name, IP: ip, Mark: mark, Since: in.now}
	switch {
	case mark&in.cfg.FromTunnel != 0:
		if in.prevRoles[name] != RoleEgress {
			return dr, false
		}
		dr.EIP = in.prevEIPs[name]
		dr.Host = routeOuter(in.prevRoutes, in.cfg.ReturnTable(), netip.PrefixFrom(ip, ip.BitLen()))
		if !dr.Host.IsValid() {
			return dr, false
		}
	case in.prevUIDs[ip] == "" || v.uids[ip] != in.prevUIDs[ip]:
		return dr, false // the Pod went away, or another Pod has its IP
	case in.prevRoles[name] == RoleEgress:
		dr.UID, dr.OnEgress, dr.EIP = v.uids[ip], true, in.prevEIPs[name]
	case in.prevRoles[name] == RoleSource || in.prevRoles[name] == RoleDrain:
		dr.UID = v.uids[ip]
		def := netip.PrefixFrom(netip.IPv4Unspecified(), 0)
		if ip.Is6() {
			def = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
		}
		dr.EIP = routeOuter(in.prevRoutes, in.cfg.SourceTable(in.prevIDs[name]), def)
	default:
		return dr, false
	}
	return dr, dr.EIP.IsValid() && v.servable(dr)
}

// drainView is the State as planDrains reads it.
type drainView struct {
	egs  map[string]*Egress
	uids map[netip.Addr]string
}

func newDrainView(st State) drainView {
	v := drainView{egs: make(map[string]*Egress, len(st.Egresses)), uids: make(map[netip.Addr]string, len(st.Pods))}
	for i := range st.Egresses {
		v.egs[st.Egresses[i].Name] = &st.Egresses[i]
	}
	for _, p := range st.Pods {
		v.uids[p.IP.Unmap()] = p.UID
	}
	return v
}

// member reports whether ip is a member (local or remote) of Egress name.
func (v drainView) member(name string, ip netip.Addr) bool {
	e := v.egs[BaseName(name)] // a per-IP part's members are its Egress's
	if e == nil {
		return false
	}
	return slices.ContainsFunc(e.Local, func(a netip.Addr) bool { return a.Unmap() == ip }) ||
		slices.ContainsFunc(e.Remote, func(m Member) bool { return m.IP.Unmap() == ip })
}

// servable reports whether the old path of dr still exists.
func (v drainView) servable(dr drain) bool {
	e := v.egs[dr.Egress]
	if !dr.Host.IsValid() && (dr.UID == "" || v.uids[dr.IP] != dr.UID) {
		return false // the Pod is gone, or its IP is another Pod's
	}
	if dr.Host.IsValid() || dr.OnEgress {
		return e != nil && e.Role == RoleEgress && e.IP.Unmap() == dr.EIP
	}
	if e == nil {
		return true // no other part here: the drain keeps the route
	}
	// Sourced here (or nothing else here) with the same egress IP;
	// failed, held here, or moved to another IP: the old path is gone.
	return (e.Role == RoleSource || e.Role == RoleNone) && (e.IP.Unmap() == dr.EIP || (e.Role == RoleNone && !e.IP.IsValid()))
}

// routeOuter is the outer destination of the route to dst in table t of
// routes; invalid when there is none.
func routeOuter(routes []EncapRoute, t int, dst netip.Prefix) netip.Addr {
	for _, r := range routes {
		if r.Table == t && r.Dst == dst {
			return r.Outer
		}
	}
	return netip.Addr{}
}

// sameRole reports whether a change of an Egress's role on this Node from
// a to b keeps its conntrack entries: only between sourcing it and
// draining it (the route and rule stay the same).
func sameRole(a, b Role) bool {
	if a == b {
		return true
	}
	src := func(r Role) bool { return r == RoleSource || r == RoleDrain }
	return src(a) && src(b)
}

// liveEntries counts the conntrack entries whose original source is one
// of ips by ID mark, leaving out TCP entries that have ended (TIME_WAIT,
// CLOSE).
func (d *Datapath) liveEntries(ips map[netip.Addr]bool) (map[liveKey]int, error) {
	live := map[liveKey]int{}
	for _, fam := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
		flows, err := d.nl.ConntrackTableList(netlink.ConntrackTable, fam)
		if err != nil {
			return nil, fmt.Errorf("list conntrack entries: %w", err)
		}
		for _, fl := range flows {
			a, ok := netip.AddrFromSlice(fl.Forward.SrcIP)
			if !ok || !ips[a.Unmap()] || fl.Mark&d.cfg.IDMask == 0 {
				continue
			}
			if tcp, ok := fl.ProtoInfo.(*netlink.ProtoInfoTCP); ok && (tcp.State == tcpConntrackTimeWait || tcp.State == tcpConntrackClose) {
				continue
			}
			live[liveKey{a.Unmap(), fl.Mark & d.cfg.IDMask}]++
		}
	}
	return live, nil
}

// TCP conntrack states (enum tcp_conntrack, include/uapi/linux/netfilter/
// nf_conntrack_tcp.h) after which a connection has ended.
const (
	tcpConntrackTimeWait = 7
	tcpConntrackClose    = 8
)

// Draining returns how many member flows' drains are in progress: while
// there are any, the caller should Apply again every few seconds (even an
// unchanged State) so that finished drains end and release their routes.
func (d *Datapath) Draining() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.drains)
}

// planDrains runs planDrains on the Datapath's memory, counting the live
// entries first when drains are in progress.
func (d *Datapath) planDrains(st State) (map[drainKey]drain, []drain, error) {
	if d.cfg.DrainTimeout < 0 {
		ended := make([]drain, 0, len(d.drains))
		for _, dr := range d.drains {
			ended = append(ended, dr)
		}
		return nil, ended, nil
	}
	in := drainInput{
		cfg: d.cfg, st: st, now: d.now(), timeout: d.cfg.DrainTimeout,
		prevMembers: d.members, prevSplits: d.splits, prevIDs: d.ids, prevRoles: d.roles, prevEIPs: d.eips, prevUIDs: d.uids, drains: d.drains,
	}
	if d.applied != nil {
		in.prevRoutes = d.applied.Routes
		if in.prevRoutes == nil {
			in.prevRoutes = []EncapRoute{}
		}
	}
	// A first pass finds the candidates; when there are any, the second
	// counts their live entries (a member without open flows under the
	// Egress it left has nothing to drain).
	keep, ended := planDrains(in)
	ips := map[netip.Addr]bool{}
	for _, dr := range keep {
		ips[dr.IP] = true
	}
	for _, dr := range d.drains {
		ips[dr.IP] = true
	}
	if len(ips) == 0 {
		return keep, ended, nil
	}
	live, err := d.liveEntries(ips)
	if err != nil {
		return nil, nil, err
	}
	in.live = live
	keep, ended = planDrains(in)
	return keep, ended, nil
}
