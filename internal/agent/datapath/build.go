package datapath

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
)

// IDs is a Node-local Egress ID assignment: Egress name -> ID in
// 1..Config.maxID(). IDs live only on one Node and only in marks; they are
// never published.
type IDs map[string]uint16

// ErrTooManyEgresses is returned (wrapped) by Build when more Egresses need
// an ID than IDMask can number; the Egresses left without an ID are named in
// the error and get no datapath.
var ErrTooManyEgresses = errors.New("more Egresses than Node-local IDs")

// Plan is everything Build derived from a State: the ID assignment and the
// kernel objects, as plain sorted data. Two Builds of equal inputs give
// equal Plans (compare with go-cmp).
type Plan struct {
	// IDs is the ID of every Egress that has a datapath on this Node.
	IDs IDs
	// Roles is the effective role of every Egress in IDs: RoleSource or
	// RoleEgress need an egress IP, without one the Egress counts as
	// RoleFailed.
	Roles map[string]Role
	// EIPs is the egress IP of every Egress whose role here is RoleEgress.
	EIPs map[string]netip.Addr
	// Members maps every member IP classified on this Node (the local and
	// remote maps of the table) to the connection-mark bits it gets: the
	// Egress's ID mark, with FromTunnel for remote members.
	Members map[netip.Addr]uint32
	// Splits maps every member IP classified by destination (a Split of
	// the State) to the connection-mark bits its flows can get, sorted.
	Splits map[netip.Addr][]uint32
	// NFT is the content of the nftables table.
	NFT Ruleset
	// Routes are the encapsulating routes, sorted by table then prefix.
	Routes []EncapRoute
	// Rules are the policy-routing rules, sorted by family then priority
	// then mark.
	Rules []PolicyRule
}

// Ruleset is the content of the datapath's nftables table.
type Ruleset struct {
	// Sets are sets and maps, sorted by name; Set.Table is nil and Set.ID
	// is the set's 1-based position (a batch-local reference).
	Sets []SetContent
	// Counters are the names of the named counter objects, sorted.
	Counters []string
	// Chains are the chains in the order they are added (jump targets
	// first); Chain.Table is nil.
	Chains []ChainContent
}

// SetContent is one set or map and its elements in key order.
type SetContent struct {
	Set      nftables.Set
	Elements []nftables.SetElement
}

// ChainContent is one chain and its rules' expressions, in order.
type ChainContent struct {
	Chain nftables.Chain
	Rules []Rule
}

// EncapRoute is a route whose packets the tunnel device encapsulates
// toward an outer destination (lightweight tunnel, LWTUNNEL_ENCAP_IP/IP6).
type EncapRoute struct {
	// Table is the routing table.
	Table int
	// Dst is the inner destination: the default route of one family in a
	// source table, or a member's /32 or /128 in the return table.
	Dst netip.Prefix
	// Outer is the outer destination: the egress IP, or the member's Node IP.
	Outer netip.Addr
	// MTU is the route MTU in bytes; 0 means the device's (IPv4 outer).
	MTU int
}

// PolicyRule is one `ip rule` the datapath owns.
type PolicyRule struct {
	// Family is unix.AF_INET or unix.AF_INET6.
	Family int
	// Priority is the rule's preference.
	Priority int
	// Mark and Mask select packets by fwmark (mark & Mask == Mark); Mask 0
	// means no fwmark match.
	Mark, Mask uint32
	// Table is the routing table looked up (0 with Goto or Nop).
	Table int
	// Goto is the priority jumped to (0: none).
	Goto int
	// Nop marks a rule that does nothing (FR_ACT_NOP), a Goto target.
	Nop bool
}

// egressPlan is one Egress with its ID and effective role, during Build.
type egressPlan struct {
	Egress
	id   uint16
	role Role
	v6   bool
	// drains are the flows of members that left it, still on its path.
	drains []drain
	// multi is set for the parts of an Egress with several IPs
	// (expandMulti); picks are a picker's choices, the ID marks of its
	// usable IPs' parts.
	multi multiPart
	picks []uint32
}

// family reports whether an Egress is IPv6, from its IP or else from its
// first member; ok is false when neither is known.
func family(e Egress) (v6, ok bool) {
	if e.IP.IsValid() {
		return e.IP.Unmap().Is6(), true
	}
	for _, x := range e.IPs {
		if x.IP.IsValid() {
			return x.IP.Unmap().Is6(), true
		}
	}
	if len(e.Local) > 0 {
		return e.Local[0].Unmap().Is6(), true
	}
	return false, false
}

// effectiveRole is the role the datapath implements for e: RoleSource and
// RoleEgress without an egress IP fall back to RoleFailed, and RoleFailed
// with FailurePolicyIgnore (or a Source without members) needs nothing.
func effectiveRole(e Egress) Role {
	r := e.Role
	if (r == RoleSource || r == RoleEgress) && !e.IP.IsValid() {
		r = RoleFailed
	}
	if r == RoleFailed && e.FailurePolicy == FailurePolicyIgnore {
		return RoleNone
	}
	return r
}

// AssignIDs gives every named Egress a Node-local ID in 1..max: names in
// prev keep their ID, the others take the lowest free IDs in name order.
// It returns the assignment and the names left without an ID (when more
// than max names are given). The result does not depend on input order.
func AssignIDs(names []string, prev IDs, max uint16) (IDs, []string) {
	names = slices.Clone(names)
	slices.Sort(names)
	names = slices.Compact(names)
	out := make(IDs, len(names))
	used := make(map[uint16]bool, len(names))
	for _, n := range names {
		if id, ok := prev[n]; ok && id >= 1 && id <= max && !used[id] {
			out[n], used[id] = id, true
		}
	}
	var next uint16 = 1
	var left []string
	for _, n := range names {
		if _, ok := out[n]; ok {
			continue
		}
		for next <= max && used[next] {
			next++
		}
		if next > max {
			left = append(left, n)
			continue
		}
		out[n], used[next] = next, true
	}
	return out, left
}

// Build derives the Plan of one Node from st. prev is the previous ID
// assignment (from the last Plan, or read back from the kernel after a
// restart; nil on a fresh Node): surviving Egresses keep their IDs and
// freed IDs are reused lowest first. Build is pure and deterministic.
// It fails on an invalid cfg, on duplicate Egress names, and (wrapping
// ErrTooManyEgresses, with a usable Plan for the others) when IDs run out.
func Build(cfg Config, st State, prev IDs) (Plan, error) {
	return buildPlan(cfg, st, prev, nil)
}

// buildPlan is Build with the drains in progress (see planDrains): a
// draining Egress keeps its ID (RoleDrain when it has no other part here),
// a local member's drain keeps the source route and rule of its Egress,
// a remote member's drain its return route.
func buildPlan(cfg Config, st State, prev IDs, drains []drain) (Plan, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return Plan{}, err
	}
	egs := slices.Clone(st.Egresses)
	slices.SortFunc(egs, func(a, b Egress) int { return cmp.Compare(a.Name, b.Name) })
	for i, e := range egs {
		if i > 0 && egs[i-1].Name == e.Name {
			return Plan{}, fmt.Errorf("build datapath: Egress %q listed twice", e.Name)
		}
	}
	egs, parts := expandMulti(egs)
	slices.SortFunc(egs, func(a, b Egress) int { return cmp.Compare(a.Name, b.Name) })
	role := func(e Egress) Role {
		if parts[e.Name].picker && e.Role == RoleSource {
			return RolePick
		}
		return effectiveRole(e)
	}
	var names []string
	for _, e := range egs {
		if _, ok := family(e); ok && role(e) != RoleNone {
			names = append(names, e.Name)
		}
	}
	// Drains by Egress; a draining Egress without another part here is
	// programmed as RoleDrain.
	drainsOf := map[string][]drain{}
	for _, dr := range drains {
		drainsOf[dr.Egress] = append(drainsOf[dr.Egress], dr)
	}
	named := map[string]bool{}
	for _, n := range names {
		named[n] = true
	}
	drainOnly := map[string]netip.Addr{}
	for n, ds := range drainsOf {
		if !named[n] {
			names = append(names, n)
			drainOnly[n] = ds[0].EIP
		}
	}
	ids, left := AssignIDs(names, prev, cfg.maxID())
	var plans []egressPlan
	for _, e := range egs {
		id, ok := ids[e.Name]
		if !ok || drainOnly[e.Name].IsValid() {
			continue
		}
		v6, _ := family(e)
		plans = append(plans, egressPlan{Egress: e, id: id, role: role(e), v6: v6, drains: drainsOf[e.Name], multi: parts[e.Name]})
	}
	for i := range plans {
		if plans[i].role != RolePick {
			continue
		}
		for _, n := range plans[i].multi.usable {
			if id, ok := ids[n]; ok {
				plans[i].picks = append(plans[i].picks, cfg.Mark(id))
			}
		}
		if len(plans[i].picks) == 0 { // every usable part lacks an ID (IDs ran out)
			plans[i].role = effectiveRole(Egress{Role: RoleFailed, FailurePolicy: plans[i].FailurePolicy})
		}
	}
	for n, eip := range drainOnly {
		if id, ok := ids[n]; ok {
			plans = append(plans, egressPlan{Egress: Egress{Name: n, IP: eip}, id: id, role: RoleDrain, v6: eip.Is6(), drains: drainsOf[n]})
		}
	}
	slices.SortFunc(plans, func(a, b egressPlan) int { return cmp.Compare(a.Name, b.Name) })
	p := Plan{IDs: ids, Roles: map[string]Role{}, EIPs: map[string]netip.Addr{}}
	for _, e := range plans {
		p.Roles[e.Name] = e.role
		if e.role == RoleEgress {
			p.EIPs[e.Name] = e.IP.Unmap()
		}
	}
	p.NFT = buildRuleset(cfg, st, plans)
	p.Members = membersOf(p.NFT.Sets)
	p.Splits = splitMarksOf(p.NFT.Sets)
	p.Routes, p.Rules = buildRouting(cfg, st, plans)
	if len(left) > 0 {
		return p, fmt.Errorf("build datapath: %w: %d left without a datapath: %v", ErrTooManyEgresses, len(left), left)
	}
	return p, nil
}

// buildRouting derives the encapsulating routes and policy rules.
func buildRouting(cfg Config, st State, plans []egressPlan) ([]EncapRoute, []PolicyRule) {
	mtu6 := 0
	if cfg.UplinkMTU != 0 {
		mtu6 = cfg.UplinkMTU - overheadV6
	}
	var routes []EncapRoute
	var rules []PolicyRule
	ret := map[netip.Prefix]netip.Addr{}
	for _, e := range plans {
		switch e.role {
		case RoleSource, RoleDrain:
			if len(e.Local) == 0 && len(e.drains) == 0 && !e.multi.sub {
				continue
			}
			r := EncapRoute{Table: cfg.SourceTable(e.id), Outer: e.IP.Unmap()}
			fam := afInet
			if e.v6 {
				r.Dst, r.MTU, fam = netip.PrefixFrom(netip.IPv6Unspecified(), 0), mtu6, afInet6
			} else {
				r.Dst = netip.PrefixFrom(netip.IPv4Unspecified(), 0)
			}
			routes = append(routes, r)
			rules = append(rules, PolicyRule{Family: fam, Priority: cfg.RulePriority + 1, Mark: cfg.Mark(e.id), Mask: cfg.IDMask, Table: r.Table})
		case RoleEgress:
			for _, m := range e.Remote {
				ip, host := m.IP.Unmap(), m.HostIP.Unmap()
				if !ip.IsValid() || !host.IsValid() || ip.Is6() != e.v6 || host.Is6() != e.v6 {
					continue
				}
				ret[netip.PrefixFrom(ip, ip.BitLen())] = host
			}
			for _, dr := range e.drains {
				if k := netip.PrefixFrom(dr.IP, dr.IP.BitLen()); dr.Host.IsValid() && dr.IP.Is6() == e.v6 && !ret[k].IsValid() {
					ret[k] = dr.Host
				}
			}
		}
	}
	// An egress Node also routes replies to every peer's Pod CIDR back
	// to that peer: members admitted before their slice arrived (a
	// member's /32 or /128, when known, is more specific).
	if slices.ContainsFunc(plans, func(e egressPlan) bool { return e.role == RoleEgress }) {
		for _, pr := range st.Peers {
			ip := pr.IP.Unmap()
			for _, c := range pr.PodCIDRs {
				if !ip.IsValid() || !c.IsValid() || c.Addr().Unmap().Is6() != ip.Is6() || c.Addr().Is4In6() {
					continue
				}
				if c = c.Masked(); !ret[c].IsValid() {
					ret[c] = ip
				}
			}
		}
	}
	for dst, host := range ret {
		r := EncapRoute{Table: cfg.ReturnTable(), Dst: dst, Outer: host}
		if dst.Addr().Is6() {
			r.MTU = mtu6
		}
		routes = append(routes, r)
	}
	slices.SortFunc(routes, func(a, b EncapRoute) int {
		return cmp.Or(cmp.Compare(a.Table, b.Table), a.Dst.Addr().Compare(b.Dst.Addr()), cmp.Compare(a.Dst.Bits(), b.Dst.Bits()))
	})
	for _, fam := range []int{afInet, afInet6} {
		base := cfg.RulePriority
		rules = append(rules,
			PolicyRule{Family: fam, Priority: base, Mark: 0, Mask: cfg.IDMask | cfg.FromTunnel, Goto: base + 2},
			PolicyRule{Family: fam, Priority: base + 1, Mark: cfg.FromTunnel, Mask: cfg.FromTunnel, Table: cfg.ReturnTable()},
			PolicyRule{Family: fam, Priority: base + 2, Nop: true},
		)
	}
	slices.SortFunc(rules, func(a, b PolicyRule) int {
		return cmp.Or(cmp.Compare(a.Family, b.Family), cmp.Compare(a.Priority, b.Priority), cmp.Compare(a.Mark, b.Mark))
	})
	return routes, rules
}

// Address families as in golang.org/x/sys/unix (AF_INET, AF_INET6).
const (
	afInet  = 2
	afInet6 = 10
)
