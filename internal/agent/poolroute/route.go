// Package poolroute makes the traffic of an egress IP leave through the
// interface that holds the address, toward its pool's own gateway, rather
// than along the Node's main routing table (issue 19), and keeps the VLAN
// sub-interfaces the agent creates for pools with subnetInfo.vlan.
//
// # Routing
//
// For every link other than the default-route link of a family that
// holds an egress IP this Node SNATs to, the Router keeps one policy
// routing table (numbers Config.TableBase .. TableBase+MaxTables-1,
// default 49900..49963) holding the pool's subnet on that link and, when
// the pool names a gateway, a default route through it (onlink). Two kinds
// of rules lead into it, per family:
//
//   - priority Config.RulePriority (default 1110):
//     fwmark <Egress ID>/<ID mask> lookup <table>, one per Egress whose
//     egress IP is on that link. The datapath copies the ID of every
//     original-direction packet of an Egress's connections into the packet
//     mark at the end of prerouting (package datapath, chain classify), so
//     the forwarded packets of selected Pods, local or tunnelled, choose
//     their route by Egress before the SNAT in postrouting gives them the
//     egress IP. A rule by source address could not do that: at routing
//     time a forwarded packet still carries the Pod's address.
//   - priority RulePriority+1: from <egress IP> lookup <table>, for what the
//     Node itself sends from the egress IP (echo replies, TCP resets of
//     the input guard's established flows, ICMP errors about packets sent
//     to it).
//
// Both come after the datapath's own rules (1100..1102): unmarked traffic
// takes the datapath's "goto 1102" and then crosses these two priorities,
// whose rules match only marks and sources of egress IPs held here. The
// main table is never written. Routes and rules carry Config.Protocol
// (default 101, the number bind marks addresses with) where the kernel
// keeps it: routes always, rules since Linux 4.17 (FRA_PROTOCOL). A rule
// at these priorities is ours when it carries the protocol, or carries none
// (a kernel that drops the attribute) and looks up a table of the range;
// any other is foreign and left alone. Routes are ours when their table is in the range and their
// protocol is Config.Protocol; a table number in the range that holds
// anything else is never used.
//
// A Router keeps no state across processes: every Sync reads the kernel,
// so a restarted agent finds the tables and rules of the one before,
// keeps those still needed (table numbers by the link their routes use)
// and deletes the rest.
package poolroute

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Defaults of Config.
const (
	// DefaultTableBase is the first routing table number: 49900, below
	// the datapath's 49999 (return routes) and 50000+ID (source tables)
	// and apart from the kernel probe's scratch table 49998.
	DefaultTableBase = 49900
	// DefaultMaxTables bounds the links with a table: 64.
	DefaultMaxTables = 64
	// DefaultRulePriority is the fwmark rules' priority; the source rules
	// take the next one.
	DefaultRulePriority = 1110
	// DefaultProtocol marks our routes and rules (rtm_protocol,
	// FRA_PROTOCOL): 101, as package bind marks addresses, a number no
	// RTPROT_* of linux/rtnetlink.h uses.
	DefaultProtocol uint8 = 101
	// DefaultIDMask is the datapath's default ID mask.
	DefaultIDMask uint32 = 0x0fff0000
)

// Config numbers what the Router owns. Zero fields take the defaults.
type Config struct {
	TableBase    int
	MaxTables    int
	RulePriority int
	Protocol     uint8
	// IDMask is the datapath's Config.IDMask: the mask of the fwmark rules.
	IDMask uint32
}

func (c Config) withDefaults() (Config, error) {
	if c.TableBase == 0 {
		c.TableBase = DefaultTableBase
	}
	if c.MaxTables == 0 {
		c.MaxTables = DefaultMaxTables
	}
	if c.RulePriority == 0 {
		c.RulePriority = DefaultRulePriority
	}
	if c.Protocol == 0 {
		c.Protocol = DefaultProtocol
	}
	if c.IDMask == 0 {
		c.IDMask = DefaultIDMask
	}
	var errs []error
	if c.TableBase < 256 || c.TableBase+c.MaxTables > 1<<31-1 || c.MaxTables < 1 {
		errs = append(errs, fmt.Errorf("tables %d..%d: out of 256..2^31-1", c.TableBase, c.TableBase+c.MaxTables-1))
	}
	if c.RulePriority < 1 || c.RulePriority > 32000 {
		errs = append(errs, fmt.Errorf("rule priority %d: out of 1..32000", c.RulePriority))
	}
	if c.Protocol <= unix.RTPROT_STATIC {
		errs = append(errs, fmt.Errorf("protocol %d: 0..4 belong to the kernel and iproute2", c.Protocol))
	}
	if err := errors.Join(errs...); err != nil {
		return c, fmt.Errorf("pool routing config: %w", err)
	}
	return c, nil
}

// Egress is one egress IP this Node holds and SNATs to, as the Router
// needs it.
type Egress struct {
	// IP is the egress IP.
	IP netip.Addr
	// Marks are the packet-mark values (ID << shift, within IDMask) of the
	// Egresses that SNAT to IP here.
	Marks []uint32
	// Gateway is the pool's subnetInfo.gateway (invalid: none).
	Gateway netip.Addr
	// PrefixLen is subnetInfo.prefixLength (0: none).
	PrefixLen int
}

// Handle is the slice of *netlink.Handle the Router uses.
type Handle interface {
	LinkList() ([]netlink.Link, error)
	AddrList(link netlink.Link, family int) ([]netlink.Addr, error)
	RouteListFiltered(family int, filter *netlink.Route, filterMask uint64) ([]netlink.Route, error)
	RouteReplace(route *netlink.Route) error
	RouteDel(route *netlink.Route) error
	RuleList(family int) ([]netlink.Rule, error)
	RuleAdd(rule *netlink.Rule) error
	RuleDel(rule *netlink.Rule) error
}

// Router programs the pool routing tables and rules of one network
// namespace.
type Router struct {
	cfg Config
	h   Handle
}

// New returns a Router on h. It fails on an invalid cfg.
func New(h Handle, cfg Config) (*Router, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Router{cfg: cfg, h: h}, nil
}

// Config returns the effective configuration.
func (r *Router) Config() Config { return r.cfg }

// Route is one egress IP's outcome of a Sync.
type Route struct {
	IP netip.Addr
	// Link is the interface holding IP ("" when it is not bound yet).
	Link string
	// Table is the routing table its traffic uses; 0: the main table
	// (IP on the default-route link, or not bound yet).
	Table int
	// Err says why IP has no table although it needs one.
	Err error
}

// Result is what a Sync programmed.
type Result struct {
	Routes []Route
}

// Err joins the per-IP errors.
func (r Result) Err() error {
	var errs []error
	for _, x := range r.Routes {
		if x.Err != nil {
			errs = append(errs, x.Err)
		}
	}
	return errors.Join(errs...)
}

// ErrTablesExhausted is wrapped when more links need a table than the range
// holds.
var ErrTablesExhausted = errors.New("no free pool routing table")

// route is one wanted route, compared by what identifies it.
type routeKey struct {
	table  int
	family int
	dst    netip.Prefix
}

type wantRoute struct {
	key  routeKey
	link int
	gw   netip.Addr
}

// ruleKey is one wanted (or found) rule.
type ruleKey struct {
	family int
	prio   int
	mark   uint32
	src    netip.Prefix
	table  int
}

// Plan is the kernel state Sync aims at (exported for tests and reports).
type Plan struct {
	Routes []wantRoute
	Rules  []ruleKey
	Result Result
}

func family(a netip.Addr) int {
	if a.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

func toNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func fromNet(n *net.IPNet, fam int) netip.Prefix {
	if n == nil {
		if fam == unix.AF_INET6 {
			return netip.PrefixFrom(netip.IPv6Unspecified(), 0)
		}
		return netip.PrefixFrom(netip.IPv4Unspecified(), 0)
	}
	a, _ := netip.AddrFromSlice(n.IP)
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones)
}

// ownedRoutes lists our routes (table in range, our protocol) and every
// table number in the range that holds anything else.
func (r *Router) ownedRoutes() (ours []netlink.Route, foreign map[int]bool, err error) {
	foreign = map[int]bool{}
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		rs, err := r.h.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return nil, nil, fmt.Errorf("list routes: %w", err)
		}
		for _, rt := range rs {
			if !r.inRange(rt.Table) {
				continue
			}
			if int(rt.Protocol) == int(r.cfg.Protocol) {
				ours = append(ours, rt)
			} else {
				foreign[rt.Table] = true
			}
		}
	}
	return ours, foreign, nil
}

func (r *Router) inRange(t int) bool {
	return t >= r.cfg.TableBase && t < r.cfg.TableBase+r.cfg.MaxTables
}

// ownedRule tells a rule of ours: at our priorities, with our protocol,
// or without one (a kernel before 4.17 drops FRA_PROTOCOL) when it leads
// into a table of our range. iproute2 (6.1) adds rules with protocol 0
// ("unspec"), so protocol 0 alone says nothing: a hand-made rule at our
// priority that looks up any other table is never touched.
func (r *Router) ownedRule(x netlink.Rule) bool {
	if x.Priority != r.cfg.RulePriority && x.Priority != r.cfg.RulePriority+1 {
		return false
	}
	return x.Protocol == r.cfg.Protocol || x.Protocol == 0 && r.inRange(x.Table)
}

func (r *Router) ownedRules() ([]netlink.Rule, error) {
	var out []netlink.Rule
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		rs, err := r.h.RuleList(fam)
		if err != nil {
			return nil, fmt.Errorf("list rules: %w", err)
		}
		for _, x := range rs {
			if r.ownedRule(x) {
				x.Family = fam
				out = append(out, x)
			}
		}
	}
	return out, nil
}

func keyOfRule(x netlink.Rule) ruleKey {
	k := ruleKey{family: x.Family, prio: x.Priority, mark: x.Mark, table: x.Table}
	if x.Src != nil {
		k.src = fromNet(x.Src, x.Family)
	}
	return k
}

// Sync makes the pool routing tables and rules exactly what egresses
// need: it reads the links, addresses and main-table default routes,
// finds the link of every egress IP, adds or replaces the routes of the
// tables needed, adds the missing rules, then deletes our rules and
// routes nothing needs (so a marked flow never meets a rule without its
// table). An egress IP not bound yet, or bound on the default-route link
// of its family, gets no table. Per-IP problems are in the Result; the
// error is for kernel operations that failed.
func (r *Router) Sync(egresses []Egress) (Result, error) {
	return r.apply(egresses, true)
}

// Add is the first half of Sync: it adds or replaces the routes and adds
// the rules egresses need, and deletes nothing. The datapath calls it
// before its nftables table starts marking flows for a new Egress
// (datapath.SetBeforeTable), so that no marked packet meets the main
// table; the Sync after the Apply removes what is stale.
func (r *Router) Add(egresses []Egress) (Result, error) {
	return r.apply(egresses, false)
}

func (r *Router) apply(egresses []Egress, prune bool) (Result, error) {
	plan, err := r.plan(egresses)
	if err != nil {
		return Result{}, err
	}
	ours, _, err := r.ownedRoutes()
	if err != nil {
		return plan.Result, err
	}
	rules, err := r.ownedRules()
	if err != nil {
		return plan.Result, err
	}
	var errs []error
	wantR := map[routeKey]bool{}
	for _, w := range plan.Routes {
		wantR[w.key] = true
		if err := r.h.RouteReplace(r.netlinkRoute(w)); err != nil {
			errs = append(errs, fmt.Errorf("route %s table %d: %w", w.key.dst, w.key.table, err))
		}
	}
	have := map[ruleKey]bool{}
	for _, x := range rules {
		have[keyOfRule(x)] = true
	}
	wantRules := map[ruleKey]bool{}
	for _, k := range plan.Rules {
		wantRules[k] = true
		if have[k] {
			continue
		}
		if err := r.h.RuleAdd(r.netlinkRule(k)); err != nil && !errors.Is(err, unix.EEXIST) {
			errs = append(errs, fmt.Errorf("add rule pref %d table %d: %w", k.prio, k.table, err))
		}
	}
	if len(errs) > 0 || !prune {
		// Keep what is in place until the wanted state is complete.
		return plan.Result, errors.Join(errs...)
	}
	for i := range rules {
		if wantRules[keyOfRule(rules[i])] {
			continue
		}
		if err := r.h.RuleDel(&rules[i]); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("delete rule pref %d table %d: %w", rules[i].Priority, rules[i].Table, err))
		}
	}
	for i := range ours {
		rt := ours[i]
		fam := rt.Family
		if wantR[routeKey{table: rt.Table, family: fam, dst: fromNet(rt.Dst, fam)}] {
			continue
		}
		if err := r.h.RouteDel(&rt); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("delete route table %d: %w", rt.Table, err))
		}
	}
	return plan.Result, errors.Join(errs...)
}

func (r *Router) netlinkRoute(w wantRoute) *netlink.Route {
	nr := &netlink.Route{
		LinkIndex: w.link, Table: w.key.table, Dst: toNet(w.key.dst), Family: w.key.family,
		Protocol: netlink.RouteProtocol(r.cfg.Protocol),
	}
	if w.gw.IsValid() {
		nr.Gw = w.gw.AsSlice()
		nr.Flags = int(netlink.FLAG_ONLINK)
	} else if w.key.family == unix.AF_INET {
		nr.Scope = netlink.SCOPE_LINK
	}
	return nr
}

func (r *Router) netlinkRule(k ruleKey) *netlink.Rule {
	x := netlink.NewRule()
	x.Family, x.Priority, x.Table, x.Protocol = k.family, k.prio, k.table, r.cfg.Protocol
	if k.src.IsValid() {
		x.Src = toNet(k.src)
	} else {
		mask := r.cfg.IDMask
		x.Mark, x.Mask = k.mark, &mask
	}
	return x
}

// linkInfo is what plan reads about one link.
type linkInfo struct {
	index int
	name  string
	// connected are its prefixes with a prefix route, by family.
	connected []netip.Prefix
}

// kernelView is what plan reads from the kernel.
type kernelView struct {
	info     map[int]*linkInfo
	holder   map[netip.Addr]int   // egress IP -> index of the link holding it
	defaults map[int]map[int]bool // family -> links of main-table default routes
	tableOf  map[int]int          // link index -> our table in place
	used     map[int]bool         // table numbers of the range in use
}

// read lists links, addresses, main-table default routes and the tables
// of the range in use.
func (r *Router) read() (*kernelView, error) {
	links, err := r.h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	k := &kernelView{info: map[int]*linkInfo{}, holder: map[netip.Addr]int{}, defaults: map[int]map[int]bool{}, tableOf: map[int]int{}, used: map[int]bool{}}
	for _, l := range links {
		k.info[l.Attrs().Index] = &linkInfo{index: l.Attrs().Index, name: l.Attrs().Name}
	}
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		addrs, err := r.h.AddrList(nil, fam)
		if err != nil {
			return nil, fmt.Errorf("list addresses: %w", err)
		}
		for _, a := range addrs {
			k.addAddr(a)
		}
		k.defaults[fam] = map[int]bool{}
		rs, err := r.h.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return nil, fmt.Errorf("list routes: %w", err)
		}
		for _, rt := range rs {
			if rt.Dst != nil {
				if ones, _ := rt.Dst.Mask.Size(); ones != 0 {
					continue
				}
			}
			k.defaults[fam][rt.LinkIndex] = true
			for _, nh := range rt.MultiPath {
				k.defaults[fam][nh.LinkIndex] = true
			}
		}
	}
	ours, foreign, err := r.ownedRoutes()
	if err != nil {
		return nil, err
	}
	for t := range foreign {
		k.used[t] = true
	}
	for _, rt := range ours {
		if _, ok := k.tableOf[rt.LinkIndex]; !ok && !k.used[rt.Table] {
			k.tableOf[rt.LinkIndex] = rt.Table
			k.used[rt.Table] = true
		}
	}
	return k, nil
}

func (k *kernelView) addAddr(a netlink.Addr) {
	ip, ok := netip.AddrFromSlice(a.IP)
	if !ok {
		return
	}
	ip = ip.Unmap()
	k.holder[ip] = a.LinkIndex
	ones, bits := a.Mask.Size()
	li := k.info[a.LinkIndex]
	if li == nil || a.Flags&unix.IFA_F_NOPREFIXROUTE != 0 || ones == bits || ip.IsLinkLocalUnicast() {
		return
	}
	li.connected = append(li.connected, netip.PrefixFrom(ip, ones).Masked())
}

// famLink is one family on one link.
type famLink struct{ link, fam int }

// planner accumulates plan's decisions.
type planner struct {
	r        *Router
	k        *kernelView
	p        Plan
	gwOf     map[famLink]netip.Addr
	gwBy     map[famLink]netip.Addr
	routes   map[routeKey]wantRoute
	rules    map[ruleKey]bool
	assigned map[int]int
}

// plan decides tables, routes and rules from the kernel's links,
// addresses, default routes and our tables in place.
func (r *Router) plan(egresses []Egress) (Plan, error) {
	k, err := r.read()
	if err != nil {
		return Plan{}, err
	}
	pl := &planner{r: r, k: k, gwOf: map[famLink]netip.Addr{}, gwBy: map[famLink]netip.Addr{},
		routes: map[routeKey]wantRoute{}, rules: map[ruleKey]bool{}, assigned: map[int]int{}}
	sorted := slices.Clone(egresses)
	slices.SortFunc(sorted, func(a, b Egress) int { return a.IP.Compare(b.IP) })
	for _, e := range sorted {
		pl.p.Result.Routes = append(pl.p.Result.Routes, pl.egress(e))
	}
	p := pl.p
	for _, w := range pl.routes {
		p.Routes = append(p.Routes, w)
	}
	slices.SortFunc(p.Routes, func(a, b wantRoute) int {
		return cmp.Or(cmp.Compare(a.key.table, b.key.table), cmp.Compare(a.key.family, b.key.family),
			cmp.Compare(a.key.dst.Bits(), b.key.dst.Bits()), a.key.dst.Addr().Compare(b.key.dst.Addr()))
	})
	for k := range pl.rules {
		p.Rules = append(p.Rules, k)
	}
	slices.SortFunc(p.Rules, func(a, b ruleKey) int {
		return cmp.Or(cmp.Compare(a.family, b.family), cmp.Compare(a.prio, b.prio), cmp.Compare(a.mark, b.mark),
			a.src.Addr().Compare(b.src.Addr()), cmp.Compare(a.table, b.table))
	})
	return p, nil
}

// egress decides one egress IP's table, routes and rules.
func (pl *planner) egress(e Egress) Route {
	r, k := pl.r, pl.k
	ip := e.IP.Unmap()
	out := Route{IP: ip}
	idx, bound := k.holder[ip]
	li := k.info[idx]
	fam := family(ip)
	if !bound || li == nil {
		return out
	}
	out.Link = li.name
	if k.defaults[fam][idx] {
		return out
	}
	gw := e.Gateway.Unmap()
	if gw.IsValid() && gw.Is4() != ip.Is4() {
		gw = netip.Addr{}
	}
	subnet := subnetOf(ip, gw, e.PrefixLen, li)
	if !subnet.IsValid() && !gw.IsValid() {
		out.Err = fmt.Errorf("egress IP %s on %s: no pool gateway and no connected subnet of %s holds it; its traffic follows the main table", ip, li.name, li.name)
		return out
	}
	fl := famLink{idx, fam}
	if prev, ok := pl.gwOf[fl]; ok && gw.IsValid() && prev != gw {
		out.Err = fmt.Errorf("egress IP %s on %s: its pool's gateway %s differs from %s, the gateway of egress IP %s on the same link; its traffic follows the main table",
			ip, li.name, gw, prev, pl.gwBy[fl])
		return out
	}
	t, ok := pl.table(idx)
	if !ok {
		out.Err = fmt.Errorf("egress IP %s on %s: %w (tables %d..%d in use)", ip, li.name, ErrTablesExhausted, r.cfg.TableBase, r.cfg.TableBase+r.cfg.MaxTables-1)
		return out
	}
	out.Table = t
	if subnet.IsValid() {
		rk := routeKey{table: t, family: fam, dst: subnet}
		pl.routes[rk] = wantRoute{key: rk, link: idx}
	}
	if gw.IsValid() {
		pl.gwOf[fl], pl.gwBy[fl] = gw, ip
		rk := routeKey{table: t, family: fam, dst: netip.PrefixFrom(unspecified(fam), 0)}
		pl.routes[rk] = wantRoute{key: rk, link: idx, gw: gw}
	}
	for _, m := range e.Marks {
		if m&r.cfg.IDMask != 0 && m&^r.cfg.IDMask == 0 {
			pl.rules[ruleKey{family: fam, prio: r.cfg.RulePriority, mark: m, table: t}] = true
		}
	}
	pl.rules[ruleKey{family: fam, prio: r.cfg.RulePriority + 1, src: netip.PrefixFrom(ip, ip.BitLen()), table: t}] = true
	return out
}

// subnetOf is the pool's subnet (gateway/prefixLen) or else the longest
// connected prefix of li holding ip; invalid when neither.
func subnetOf(ip, gw netip.Addr, prefixLen int, li *linkInfo) netip.Prefix {
	if gw.IsValid() && prefixLen > 0 && prefixLen <= gw.BitLen() {
		return netip.PrefixFrom(gw, prefixLen).Masked()
	}
	var subnet netip.Prefix
	for _, c := range li.connected {
		if c.Contains(ip) && (!subnet.IsValid() || c.Bits() > subnet.Bits()) {
			subnet = c
		}
	}
	return subnet
}

// table returns the table of link idx: the one in place, the one chosen
// earlier in this plan, or the lowest free number of the range.
func (pl *planner) table(idx int) (int, bool) {
	if t, ok := pl.k.tableOf[idx]; ok {
		return t, true
	}
	if t, ok := pl.assigned[idx]; ok {
		return t, true
	}
	for n := pl.r.cfg.TableBase; n < pl.r.cfg.TableBase+pl.r.cfg.MaxTables; n++ {
		if !pl.k.used[n] {
			pl.k.used[n] = true
			pl.assigned[idx] = n
			return n, true
		}
	}
	return 0, false
}

func unspecified(fam int) netip.Addr {
	if fam == unix.AF_INET6 {
		return netip.IPv6Unspecified()
	}
	return netip.IPv4Unspecified()
}

// String renders a Result for logs.
func (r Result) String() string {
	var b strings.Builder
	for i, x := range r.Routes {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s@%s:%d", x.IP, x.Link, x.Table)
	}
	return b.String()
}
