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
// spec.egressIP, else of the first range of its pool (pools are single
// family, a CEL rule of ExternalIPPool), else Any. pools maps pool names to
// pools; it may be nil.
func EgressFamily(e *v1.Egress, pools map[string]*v1.ExternalIPPool) Family {
	for _, s := range []string{e.Status.EgressIP, e.Spec.EgressIP} {
		if a, err := netip.ParseAddr(s); err == nil {
			return familyOf(a.Unmap())
		}
	}
	if p := pools[e.Spec.ExternalIPPool]; p != nil && len(p.Spec.IPRanges) > 0 {
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
	res := Result{Members: map[string][]Member{}, Invalid: map[string]error{}, ShadowedBy: map[string][]string{}}
	winners := make([][2]string, len(in.Pods)) // per Pod, the Egress of each family
	fam := in.Family
	if fam == nil {
		fam = func(e *v1.Egress) Family { return EgressFamily(e, nil) }
	}
	egs := make([]compiled, 0, len(in.Egresses))
	for i := range in.Egresses {
		e := &in.Egresses[i]
		c := compiled{eg: e, family: fam(e)}
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

	for i := range in.Pods {
		p := &in.Pods[i]
		if !Candidate(p) {
			continue
		}
		// Each family of the Pod's IPs goes to the oldest selecting
		// Egress of that family (or of a family not known yet): a
		// dual-stack workload uses one IPv4 and one IPv6 Egress.
		var won [2]bool // IPv4, IPv6
		for _, c := range forNS(p.Namespace) {
			if won[0] && won[1] {
				break
			}
			if c.pod != nil && !c.pod.Matches(labels.Set(p.Labels)) {
				continue
			}
			for _, m := range members(p, c.family) {
				k := 0
				if m.PodIP.Is6() {
					k = 1
				}
				if !won[k] {
					won[k] = true
					winners[i][k] = c.eg.Name
					res.Members[c.eg.Name] = append(res.Members[c.eg.Name], m)
				}
			}
		}
	}
	// Egresses left without members: which older Egresses won the Pods
	// they match (a second scan for those only; they are few).
	for ci := range egs {
		c := &egs[ci]
		if len(res.Members[c.eg.Name]) > 0 {
			continue
		}
		by := map[string]bool{}
		for i := range in.Pods {
			p := &in.Pods[i]
			if winners[i] == [2]string{} || !slices.Contains(forNS(p.Namespace), c) || (c.pod != nil && !c.pod.Matches(labels.Set(p.Labels))) {
				continue
			}
			for _, m := range members(p, c.family) {
				k := 0
				if m.PodIP.Is6() {
					k = 1
				}
				if w := winners[i][k]; w != "" && w != c.eg.Name {
					by[w] = true
				}
			}
		}
		if len(by) > 0 {
			l := slices.Sorted(maps.Keys(by))
			res.ShadowedBy[c.eg.Name] = l[:min(len(l), MaxShadowedBy)]
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
