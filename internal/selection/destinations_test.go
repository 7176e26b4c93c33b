package selection

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/destinations"
)

func withCIDRs(e v1.Egress, dst, exc []string) v1.Egress {
	for _, c := range dst {
		e.Spec.DestinationCIDRs = append(e.Spec.DestinationCIDRs, v1.DestinationCIDR(c))
	}
	for _, c := range exc {
		e.Spec.ExcludedCIDRs = append(e.Spec.ExcludedCIDRs, v1.DestinationCIDR(c))
	}
	return e
}

// TestDestinationsSelect: the scenario through Select. Pod P is
// selected by A (destinations 198.51.100.0/24 and 2001:db8:100::/48, newer)
// and B (every destination but 203.0.113.0/25 and 2001:db8:203::/49); both
// carry some of P's destinations, so P is a member of both in each family,
// and the division says which takes what.
func TestDestinationsSelect(t *testing.T) {
	for _, fam := range []struct {
		name, eip               string
		toA, toB, toNode, podIP string
	}{
		{"IPv4", "192.0.2.1", "198.51.100.10", "203.0.113.200", "203.0.113.10", "10.0.0.5"},
		{"IPv6", "2001:db8::e1", "2001:db8:100::10", "2001:db8:203:8000::200", "2001:db8:203::10", "fd00::5"},
	} {
		t.Run(fam.name, func(t *testing.T) {
			a := withCIDRs(eg("a", 5, fam.eip, nil, map[string]string{"app": "p"}), []string{"198.51.100.0/24", "2001:db8:100::/48"}, nil)
			b := withCIDRs(eg("b", 1, fam.eip, nil, nil), nil, []string{"203.0.113.0/25", "2001:db8:203::/49"})
			other := pod("ns", "q", "n1", map[string]string{"app": "q"}, "10.0.0.6", "fd00::6")
			p := pod("ns", "p", "n1", map[string]string{"app": "p"}, "10.0.0.5", "fd00::5")
			res := Select(Input{Egresses: []v1.Egress{a, b}, Pods: []corev1.Pod{p, other}})
			podIP := netip.MustParseAddr(fam.podIP)
			for _, name := range []string{"a", "b"} {
				if !slices.ContainsFunc(res.Members[name], func(m Member) bool { return m.PodIP == podIP }) {
					t.Errorf("%s is no member of %s: %v", podIP, name, names(res))
				}
			}
			spans, ok := res.Destinations[podIP]
			if !ok {
				t.Fatalf("no division for %s: %v", podIP, res.Destinations)
			}
			for d, want := range map[string]string{fam.toA: "a", fam.toB: "b", fam.toNode: ""} {
				if got := destinations.Lookup(spans, netip.MustParseAddr(d)); got != want {
					t.Errorf("%s -> %s uses %q, want %q", podIP, d, got, want)
				}
			}
			// q: only B, with an exclusion: a division, all B's.
			q := netip.MustParseAddr(map[string]string{"IPv4": "10.0.0.6", "IPv6": "fd00::6"}[fam.name])
			if got := destinations.Egresses(res.Destinations[q]); !slices.Equal(got, []string{"b"}) {
				t.Errorf("q's division names %v, want [b]", got)
			}
			if slices.ContainsFunc(res.Members["a"], func(m Member) bool { return m.PodIP == q }) {
				t.Errorf("q is a member of a, whose selector it does not match")
			}
		})
	}
}

// TestDestinationsSelectOldestWins: without destinations nothing changes,
// the oldest Egress wins every destination and no division is recorded;
// a younger default Egress behind an older one with an exclusion carries
// what the older excludes; an Egress whose destinations are all of the
// other family carries nothing and is shadowed by nobody.
func TestDestinationsSelectOldestWins(t *testing.T) {
	p := pod("ns", "p", "n1", nil, "10.0.0.5")
	res := Select(Input{Egresses: []v1.Egress{eg("old", 1, "192.0.2.1", nil, nil), eg("young", 2, "192.0.2.2", nil, nil)}, Pods: []corev1.Pod{p}})
	if diff := cmp.Diff(map[string][]string{"old": {"ns/p=10.0.0.5@192.0.2.11"}}, names(res)); diff != "" {
		t.Errorf("members (-want +got):\n%s", diff)
	}
	if len(res.Destinations) != 0 || !slices.Equal(res.ShadowedBy["young"], []string{"old"}) {
		t.Errorf("divisions %v, young shadowed by %v; want none and [old]", res.Destinations, res.ShadowedBy["young"])
	}

	res = Select(Input{Egresses: []v1.Egress{withCIDRs(eg("old", 1, "192.0.2.1", nil, nil), nil, []string{"203.0.113.0/25"}), eg("young", 2, "192.0.2.2", nil, nil)}, Pods: []corev1.Pod{p}})
	spans := res.Destinations[netip.MustParseAddr("10.0.0.5")]
	if destinations.Lookup(spans, netip.MustParseAddr("203.0.113.10")) != "young" || destinations.Lookup(spans, netip.MustParseAddr("203.0.113.200")) != "old" {
		t.Errorf("division %v: want 203.0.113.0/25 to young, the rest to old", spans)
	}
	if len(res.Members["old"]) != 1 || len(res.Members["young"]) != 1 {
		t.Errorf("members %v: want p in both", names(res))
	}

	// C names only A's network and is newer: A took what C would carry,
	// B (which carries the rest of P's destinations) did not.
	res = Select(Input{Egresses: []v1.Egress{
		eg("b", 1, "192.0.2.1", nil, nil),
		withCIDRs(eg("a", 2, "192.0.2.2", nil, nil), []string{"198.51.100.0/24"}, nil),
		withCIDRs(eg("c", 3, "192.0.2.3", nil, nil), []string{"198.51.100.0/24"}, nil),
	}, Pods: []corev1.Pod{p}})
	if len(res.Members["c"]) != 0 || !slices.Equal(res.ShadowedBy["c"], []string{"a"}) {
		t.Errorf("c: members %v, shadowed by %v; want none, [a]", names(res), res.ShadowedBy["c"])
	}

	res = Select(Input{Egresses: []v1.Egress{withCIDRs(eg("v6dst", 1, "192.0.2.1", nil, nil), []string{"2001:db8::/32"}, nil)}, Pods: []corev1.Pod{p}})
	if len(res.Members) != 0 || len(res.ShadowedBy) != 0 {
		t.Errorf("an IPv4 Egress with IPv6 destinations only: members %v, shadowed %v; want none", names(res), res.ShadowedBy)
	}
}

// destOracle is the per-destination rule the slow way for Pod p and
// destination d of family fam: among the Egresses that select p, the
// longest matching prefix wins (no destinationCIDRs: /0), the oldest on
// a tie, an exclusion removes only its own Egress.
func destOracle(w world, p *corev1.Pod, fam Family, d netip.Addr) string {
	nsl := map[string]map[string]string{}
	for _, n := range w.nss {
		nsl[n.Name] = n.Labels
	}
	var best *v1.Egress
	bits := -1
	for i := range w.egs {
		e := &w.egs[i]
		if f := EgressFamily(e, nil); f != Any && f != fam {
			continue
		}
		if s := e.Spec.AppliedTo.NamespaceSelector; s != nil {
			l, ok := nsl[p.Namespace]
			sel, _ := metav1.LabelSelectorAsSelector(s)
			if !ok || !sel.Matches(labels.Set(l)) {
				continue
			}
		}
		if s := e.Spec.AppliedTo.PodSelector; s != nil {
			sel, _ := metav1.LabelSelectorAsSelector(s)
			if !sel.Matches(labels.Set(p.Labels)) {
				continue
			}
		}
		b := -1
		if len(e.Spec.DestinationCIDRs) == 0 {
			b = 0
		}
		for _, c := range e.Spec.DestinationCIDRs {
			if pr := netip.MustParsePrefix(string(c)); pr.Contains(d) && pr.Bits() > b {
				b = pr.Bits()
			}
		}
		for _, c := range e.Spec.ExcludedCIDRs {
			if netip.MustParsePrefix(string(c)).Contains(d) {
				b = -1
			}
		}
		if b > bits || (b == bits && b >= 0 && Older(e, best) < 0) {
			best, bits = e, b
		}
	}
	if best == nil || bits < 0 {
		return ""
	}
	return best.Name
}

// TestDestinationsSelectProperties: on random clusters whose Egresses name
// destinations and exclusions, every Pod IP's destinations (probed at
// random and at the CIDRs' edges) use what the slow rule says, every
// Egress that carries one has the IP as a member and no other does, and
// shuffling the inputs changes nothing.
func TestDestinationsSelectProperties(t *testing.T) {
	cidrs4 := []string{"198.51.100.0/24", "198.51.100.0/25", "198.51.100.64/26", "203.0.113.0/24", "203.0.113.128/25", "0.0.0.0/1"}
	cidrs6 := []string{"2001:db8::/32", "2001:db8:1::/48", "2001:db8:1::/64", "2001:db8:2::/48", "::/1"}
	for seed := range uint64(200) {
		r := rand.New(rand.NewPCG(seed, 21))
		w := randomWorld(r, 1+r.IntN(6), 1+r.IntN(3), r.IntN(30))
		for i := range w.egs {
			pickSome := func() []string {
				var out []string
				for range r.IntN(3) {
					out = append(out, cidrs4[r.IntN(len(cidrs4))], cidrs6[r.IntN(len(cidrs6))])
				}
				slices.Sort(out)
				return slices.Compact(out)
			}
			w.egs[i] = withCIDRs(w.egs[i], pickSome(), pickSome())
		}
		got := Select(Input{Egresses: w.egs, Namespaces: w.nss, Pods: w.pods})
		var probes4, probes6 []netip.Addr
		for _, c := range slices.Concat(cidrs4, cidrs6) {
			pr := netip.MustParsePrefix(c)
			b := pr.Addr().AsSlice()
			for i := pr.Bits(); i < len(b)*8; i++ {
				b[i/8] |= 0x80 >> (i % 8)
			}
			l, _ := netip.AddrFromSlice(b)
			for _, a := range []netip.Addr{pr.Addr(), pr.Addr().Prev(), l, l.Next()} {
				if a.IsValid() && a.Is4() {
					probes4 = append(probes4, a)
				} else if a.IsValid() {
					probes6 = append(probes6, a)
				}
			}
		}
		probes4 = append(probes4, netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("198.51.100.255"), netip.MustParseAddr("203.0.113.127"))
		probes6 = append(probes6, netip.MustParseAddr("2001:db8:1:0:ffff::1"), netip.MustParseAddr("8000::1"))
		memberOf := map[netip.Addr][]string{}
		for e, ms := range got.Members {
			for _, m := range ms {
				memberOf[m.PodIP] = append(memberOf[m.PodIP], e)
			}
		}
		for i := range w.pods {
			p := &w.pods[i]
			if !Candidate(p) {
				continue
			}
			for _, ip := range PodIPs(p) {
				fam, probes := IPv4, probes4
				if ip.Is6() {
					fam, probes = IPv6, probes6
				}
				want := map[string]bool{}
				for _, d := range probes {
					w := destOracle(w, p, fam, d)
					var have string
					if spans, ok := got.Destinations[ip]; ok {
						have = destinations.Lookup(spans, d)
					} else if len(memberOf[ip]) == 1 {
						have = memberOf[ip][0]
					}
					if have != w {
						t.Fatalf("seed %d: %s/%s (%s) -> %s uses %q, the rule says %q", seed, p.Namespace, p.Name, ip, d, have, w)
					}
					if w != "" {
						want[w] = true
					}
				}
				// Every Egress that carries a probed destination is a
				// member; members carry some destination (probes may
				// miss one, so only the first direction is exact).
				for e := range want {
					if !slices.Contains(memberOf[ip], e) {
						t.Fatalf("seed %d: %s carries destinations of %s but is no member of %s (%v)", seed, e, ip, e, memberOf[ip])
					}
				}
				if spans, ok := got.Destinations[ip]; ok && !slices.Equal(destinations.Egresses(spans), sortedCopy(memberOf[ip])) {
					t.Fatalf("seed %d: %s: division names %v, members of %v", seed, ip, destinations.Egresses(spans), memberOf[ip])
				}
			}
		}
		sh := world{egs: slices.Clone(w.egs), nss: slices.Clone(w.nss), pods: slices.Clone(w.pods)}
		r.Shuffle(len(sh.egs), func(i, j int) { sh.egs[i], sh.egs[j] = sh.egs[j], sh.egs[i] })
		r.Shuffle(len(sh.pods), func(i, j int) { sh.pods[i], sh.pods[j] = sh.pods[j], sh.pods[i] })
		again := Select(Input{Egresses: sh.egs, Namespaces: sh.nss, Pods: sh.pods})
		opt := cmp.Comparer(func(a, b netip.Addr) bool { return a == b })
		if diff := cmp.Diff(got.Members, again.Members, opt); diff != "" {
			t.Fatalf("seed %d: shuffled inputs changed the members (-first +shuffled):\n%s", seed, diff)
		}
		if diff := cmp.Diff(got.Destinations, again.Destinations, opt); diff != "" {
			t.Fatalf("seed %d: shuffled inputs changed the divisions (-first +shuffled):\n%s", seed, diff)
		}
		if diff := cmp.Diff(got.ShadowedBy, again.ShadowedBy); diff != "" {
			t.Fatalf("seed %d: shuffled inputs changed ShadowedBy (-first +shuffled):\n%s", seed, diff)
		}
	}
}

func sortedCopy(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}
