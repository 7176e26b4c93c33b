// Package selection decides which Egress, if any, each Pod uses. It is pure:
// the controller (to publish members in EgressMemberSlices) and every agent
// (for its own Node's Pods) call it on what their caches hold and get the
// same answer for the same Pod, whatever the order of the inputs.
//
// The rule: a Pod is a candidate when it is not in the host network, has been
// given an IP (status.podIPs) and a Node, and has not terminated (phase
// Succeeded or Failed). A candidate uses an Egress when its namespace's
// labels match spec.appliedTo.namespaceSelector (absent: every namespace) and
// its own labels match spec.appliedTo.podSelector (absent: every Pod). The
// Egress's IP family decides which of the Pod's IPs is the member, and the
// choice is made per family: when several Egresses of a family select a
// Pod, the oldest wins, the lowest metadata.creationTimestamp, then the
// lowest name (the order the scheduling pass gives Egresses priority in).
// So a dual-stack workload uses one IPv4 and one IPv6 Egress (a pool is
// single-family; see "Dual-stack" in the design notes). An Egress whose
// family is not known yet (no IP, pool unknown) competes in both families.
//
// Destinations (spec.destinationCIDRs, spec.excludedCIDRs, issue 21): the
// oldest-wins rule above is the case where no Egress names destinations.
// In general the Egresses of a family that select a Pod share its
// destinations as package destinations decides (longest prefix, then the
// oldest), and the Pod's IP is a member of every Egress that carries at
// least one of its destinations.
package selection

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/destinations"
)

// Family is an IP family: 4, 6, or Any (0) when the Egress's family is not
// known yet (no IP named, allocated or derivable from its pool).
type Family int

// IP families.
const (
	Any  Family = 0
	IPv4 Family = 4
	IPv6 Family = 6
)

func familyOf(a netip.Addr) Family {
	if a.Is4() {
		return IPv4
	}
	return IPv6
}

// Matches reports whether a is of family f (Any matches every address).
func (f Family) Matches(a netip.Addr) bool { return f == Any || familyOf(a.Unmap()) == f }

// EgressFamily returns the IP family of e: that of status.egressIP, else of
// spec.egressIP, else of the first status.ips entry with an IP, else of
// the first range of its pool (spec.externalIPPool, or the pool of the
// first spec.ips entry: pools are single family, a CEL rule of
// ExternalIPPool, and the webhook keeps an Egress's pools of one family),
// else Any. pools maps pool names to
// pools; it may be nil.
func EgressFamily(e *v1.Egress, pools map[string]*v1.ExternalIPPool) Family {
	for _, s := range []string{e.Status.EgressIP, e.Spec.EgressIP} {
		if a, err := netip.ParseAddr(s); err == nil {
			return familyOf(a.Unmap())
		}
	}
	for _, x := range e.Status.IPs { // an Egress with spec.ips: one family
		if a, err := netip.ParseAddr(x.IP); err == nil {
			return familyOf(a.Unmap())
		}
	}
	poolName := e.Spec.ExternalIPPool
	if len(e.Spec.IPs) > 0 {
		poolName = e.Spec.IPs[0].Pool
	}
	if p := pools[poolName]; p != nil && len(p.Spec.IPRanges) > 0 {
		r := p.Spec.IPRanges[0]
		if pr, err := netip.ParsePrefix(r.CIDR); err == nil {
			return familyOf(pr.Addr().Unmap())
		}
		if a, err := netip.ParseAddr(r.Start); err == nil {
			return familyOf(a.Unmap())
		}
	}
	return Any
}

// Member is one Pod IP that uses an Egress, with the IP of the Pod's Node of
// the same family (invalid when the Pod's status has none).
type Member struct {
	PodIP  netip.Addr
	HostIP netip.Addr
	// Pod is the Pod's namespace/name, for logs.
	Pod string
	// Node is the Pod's spec.nodeName.
	Node string
}

// Input is what Select decides from.
type Input struct {
	Egresses   []v1.Egress
	Namespaces []corev1.Namespace
	Pods       []corev1.Pod
	// Family returns the family of an Egress; nil means EgressFamily with
	// no pools.
	Family func(*v1.Egress) Family
}

// Result is the outcome of Select.
type Result struct {
	// Members maps an Egress name to its members sorted by PodIP; Egresses
	// with no members are absent.
	Members map[string][]Member
	// Invalid maps the names of Egresses whose selectors cannot be parsed
	// to the error; they select nothing.
	Invalid map[string]error
	// ShadowedBy maps the name of an Egress that has no members although
	// its selectors match Pods to the older Egresses that won those Pods,
	// sorted (at most MaxShadowedBy names).
	ShadowedBy map[string][]string
	// Destinations maps a member Pod IP whose destinations are divided
	// among several Egresses, or partly left to its Node's IP, to that
	// division (destinations.Resolve over the Egresses of its family that
	// select it). A member IP not in the map uses its one Egress for every
	// destination outside the cluster.
	Destinations map[netip.Addr][]destinations.Span
}

// MaxShadowedBy bounds the names in one Result.ShadowedBy entry.
const MaxShadowedBy = 3

// Older orders Egresses by priority: the lowest creationTimestamp first,
// then the lowest name.
func Older(a, b *v1.Egress) int {
	if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
		return c
	}
	return strings.Compare(a.Name, b.Name)
}

// Candidate reports whether p can use an Egress at all: not host-network,
// scheduled, with an IP, not terminated.
func Candidate(p *corev1.Pod) bool {
	if p.Spec.HostNetwork || p.Spec.NodeName == "" {
		return false
	}
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return false
	}
	return len(p.Status.PodIPs) > 0 || p.Status.PodIP != ""
}

type compiled struct {
	eg     *v1.Egress
	ns     labels.Selector // nil: every namespace
	pod    labels.Selector // nil: every Pod
	family Family
	claim  destinations.Claim
}

// ClaimOf returns e's destinations as package destinations takes them.
func ClaimOf(e *v1.Egress) destinations.Claim {
	return destinations.Claim{
		Egress: e.Name, Created: e.CreationTimestamp.Time,
		Destinations: destinations.Parse(e.Spec.DestinationCIDRs), Some: len(e.Spec.DestinationCIDRs) > 0,
		Excluded: destinations.Parse(e.Spec.ExcludedCIDRs),
	}
}

func selector(s *metav1.LabelSelector) (labels.Selector, error) {
	if s == nil {
		return nil, nil
	}
	return metav1.LabelSelectorAsSelector(s)
}

// Select gives each IP family of each candidate Pod to the oldest Egress of
// that family that selects the Pod, and returns every Egress's members. A Pod whose namespace is not in
// in.Namespaces matches only Egresses without a namespaceSelector. A Pod
// with no IP of its Egress's family is no member (it keeps its Node's IP).
// With family Any every Pod IP is a member. The result does not depend on
// the order of the inputs.
func Select(in Input) Result {
	res := Result{Members: map[string][]Member{}, Invalid: map[string]error{}, ShadowedBy: map[string][]string{}, Destinations: map[netip.Addr][]destinations.Span{}}
	winners := make([][2][]string, len(in.Pods))         // per Pod, the Egresses of each family
	divs := make([][2][]destinations.Span, len(in.Pods)) // and how they divide it (nil: one takes all)
	fam := in.Family
	if fam == nil {
		fam = func(e *v1.Egress) Family { return EgressFamily(e, nil) }
	}
	egs := make([]compiled, 0, len(in.Egresses))
	for i := range in.Egresses {
		e := &in.Egresses[i]
		c := compiled{eg: e, family: fam(e), claim: ClaimOf(e)}
		var err error
		if c.ns, err = selector(e.Spec.AppliedTo.NamespaceSelector); err != nil {
			res.Invalid[e.Name] = fmt.Errorf("spec.appliedTo.namespaceSelector: %w", err)
			continue
		}
		if c.pod, err = selector(e.Spec.AppliedTo.PodSelector); err != nil {
			res.Invalid[e.Name] = fmt.Errorf("spec.appliedTo.podSelector: %w", err)
			continue
		}
		egs = append(egs, c)
	}
	slices.SortFunc(egs, func(a, b compiled) int { return Older(a.eg, b.eg) })

	nsLabels := make(map[string]labels.Set, len(in.Namespaces))
	for i := range in.Namespaces {
		nsLabels[in.Namespaces[i].Name] = in.Namespaces[i].Labels
	}
	// Per namespace, the Egresses whose namespaceSelector matches it,
	// oldest first; computed on first use.
	perNS := map[string][]*compiled{}
	forNS := func(ns string) []*compiled {
		if l, ok := perNS[ns]; ok {
			return l
		}
		set, known := nsLabels[ns]
		var l []*compiled
		for i := range egs {
			c := &egs[i]
			if c.ns == nil || (known && c.ns.Matches(set)) {
				l = append(l, c)
			}
		}
		perNS[ns] = l
		return l
	}

	cache := resolveCache{}
	type podSpans struct {
		pod   string
		spans []destinations.Span
	}
	division := map[netip.Addr]podSpans{}
	for i := range in.Pods {
		p := &in.Pods[i]
		if !Candidate(p) {
			continue
		}
		claims, byIP := claimsOf(p, forNS(p.Namespace))
		for k := range claims {
			var spans []destinations.Span
			switch cs := claims[k]; {
			case len(cs) == 0:
				continue
			case len(cs) == 1 && cs[0].claim.Whole():
				winners[i][k] = []string{cs[0].eg.Name}
			default:
				spans = cache.resolve(k == 1, cs)
				winners[i][k], divs[i][k] = destinations.Egresses(spans), spans
				if _, all := destinations.Everything(k == 1, spans); all {
					spans = nil
				}
			}
			for _, n := range winners[i][k] {
				res.Members[n] = append(res.Members[n], byIP[k])
			}
			// Two Pods claiming one IP (a stale status): the division
			// of the one the member lists keep (the lowest name).
			ip := byIP[k].PodIP
			if prev, ok := division[ip]; len(winners[i][k]) > 0 && (!ok || byIP[k].Pod < prev.pod) {
				division[ip] = podSpans{byIP[k].Pod, spans}
			}
		}
	}
	for ip, d := range division {
		if d.spans != nil {
			res.Destinations[ip] = d.spans
		}
	}
	for ci := range egs {
		c := &egs[ci]
		if len(res.Members[c.eg.Name]) > 0 {
			continue
		}
		if by := shadowersOf(c, in.Pods, winners, divs, forNS); len(by) > 0 {
			res.ShadowedBy[c.eg.Name] = by[:min(len(by), MaxShadowedBy)]
		}
	}
	for name, ms := range res.Members {
		slices.SortFunc(ms, func(a, b Member) int {
			return cmp.Or(a.PodIP.Compare(b.PodIP), strings.Compare(a.Pod, b.Pod))
		})
		// Two Pods claiming one IP (a stale status): keep the first by
		// namespace/name, so every reader keeps the same one.
		res.Members[name] = slices.CompactFunc(ms, func(a, b Member) bool { return a.PodIP == b.PodIP })
	}
	return res
}

// PodIPs returns p's IPs from status.podIPs (or status.podIP), unmapped.
func PodIPs(p *corev1.Pod) []netip.Addr {
	var out []netip.Addr
	add := func(s string) {
		if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" && !slices.Contains(out, a.Unmap()) {
			out = append(out, a.Unmap())
		}
	}
	for _, ip := range p.Status.PodIPs {
		add(ip.IP)
	}
	if len(out) == 0 {
		add(p.Status.PodIP)
	}
	return out
}

func hostIPs(p *corev1.Pod) []netip.Addr {
	var out []netip.Addr
	for _, ip := range p.Status.HostIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			out = append(out, a.Unmap())
		}
	}
	if a, err := netip.ParseAddr(p.Status.HostIP); err == nil {
		out = append(out, a.Unmap())
	}
	return out
}

// members returns p's members for family f: its first Pod IP of f, or with
// Any every Pod IP (an Egress whose family is unknown has no IP, so all of
// the Pod's external traffic follows its failurePolicy), each with the
// Pod's first host IP of the same family.
func members(p *corev1.Pod, f Family) []Member {
	var out []Member
	for _, ip := range PodIPs(p) {
		if !f.Matches(ip) {
			continue
		}
		m := Member{PodIP: ip, Pod: p.Namespace + "/" + p.Name, Node: p.Spec.NodeName}
		for _, h := range hostIPs(p) {
			if familyOf(h) == familyOf(ip) {
				m.HostIP = h
				break
			}
		}
		out = append(out, m)
		if f != Any {
			break
		}
	}
	return out
}

// resolveCache remembers destinations.Resolve per family and set of
// Egresses: Pods selected by the same Egresses share one division.
type resolveCache map[string][]destinations.Span

func (rc resolveCache) resolve(v6 bool, cs []*compiled) []destinations.Span {
	var key strings.Builder
	if v6 {
		key.WriteString("6")
	}
	claims := make([]destinations.Claim, len(cs))
	for i, c := range cs {
		key.WriteString("/" + c.eg.Name)
		claims[i] = c.claim
	}
	if spans, ok := rc[key.String()]; ok {
		return spans
	}
	spans := destinations.Resolve(v6, claims)
	rc[key.String()] = spans
	return spans
}

// covers reports whether claim c would carry some destination of span sp
// (the zero Span: any destination of the family) were it alone: one of
// its destinationCIDRs of the family (or, without any, every destination)
// overlaps sp, and no excludedCIDR holds all of sp.
func covers(c destinations.Claim, v6 bool, sp destinations.Span) bool {
	whole := !sp.First.IsValid()
	overlaps := func(p netip.Prefix) bool {
		if p.Addr().Is6() != v6 {
			return false
		}
		if whole {
			return true
		}
		last := destinations.Span{First: p.Masked().Addr(), Last: lastAddr(p)}
		return sp.First.Compare(last.Last) <= 0 && last.First.Compare(sp.Last) <= 0
	}
	if c.Some && !slices.ContainsFunc(c.Destinations, overlaps) {
		return false
	}
	return whole || !slices.ContainsFunc(c.Excluded, func(p netip.Prefix) bool {
		return p.Addr().Is6() == v6 && p.Contains(sp.First) && p.Contains(sp.Last)
	})
}

// lastAddr is the last address of prefix p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// claimsOf returns, per family of p's IPs (IPv4, IPv6), the Egresses of
// egs (those whose namespaceSelector matches p's namespace, oldest first)
// that select p and may carry one of its destinations, with p's member of
// that family. Each family of a Pod's IPs goes to the Egresses of that
// family (or of a family not known yet) that select it: all of them when
// one names destinations, else the oldest alone (a dual-stack workload
// uses one IPv4 and one IPv6 Egress); past an Egress that takes every
// destination, only Egresses with destinationCIDRs can win any.
func claimsOf(p *corev1.Pod, egs []*compiled) (claims [2][]*compiled, byIP [2]Member) {
	var whole [2]bool // a claim without destinationCIDRs or exclusions is in
	for _, c := range egs {
		if whole[0] && whole[1] && !c.claim.Some {
			continue // younger and covering every destination: it wins none
		}
		if c.pod != nil && !c.pod.Matches(labels.Set(p.Labels)) {
			continue
		}
		for _, m := range members(p, c.family) {
			k := 0
			if m.PodIP.Is6() {
				k = 1
			}
			if whole[k] && !c.claim.Some {
				continue
			}
			claims[k] = append(claims[k], c)
			byIP[k] = m
			whole[k] = whole[k] || c.claim.Whole()
		}
	}
	return claims, byIP
}

// shadowersOf returns, for an Egress c left without members, the
// Egresses that took the destinations c would carry of the Pods it
// matches, sorted: a second scan, for such Egresses only (they are few).
// winners and divs are, per Pod and family, the Egresses that carry its
// destinations and how they divide them (nil: one takes all).
func shadowersOf(c *compiled, pods []corev1.Pod, winners [][2][]string, divs [][2][]destinations.Span, forNS func(string) []*compiled) []string {
	by := map[string]bool{}
	for i := range pods {
		p := &pods[i]
		if (winners[i][0] == nil && winners[i][1] == nil) || !slices.Contains(forNS(p.Namespace), c) || (c.pod != nil && !c.pod.Matches(labels.Set(p.Labels))) {
			continue
		}
		for _, m := range members(p, c.family) {
			k := 0
			if m.PodIP.Is6() {
				k = 1
			}
			if divs[i][k] == nil {
				if w := winners[i][k]; len(w) == 1 && w[0] != c.eg.Name && covers(c.claim, k == 1, destinations.Span{}) {
					by[w[0]] = true
				}
				continue
			}
			for _, sp := range divs[i][k] {
				if sp.Egress != c.eg.Name && covers(c.claim, k == 1, sp) {
					by[sp.Egress] = true
				}
			}
		}
	}
	return slices.Sorted(maps.Keys(by))
}
