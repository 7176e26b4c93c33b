package selection

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func eg(name string, age int, ip string, ns, pod map[string]string) v1.Egress {
	e := v1.Egress{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(t0.Add(time.Duration(age) * time.Second))}}
	if ns != nil {
		e.Spec.AppliedTo.NamespaceSelector = &metav1.LabelSelector{MatchLabels: ns}
	}
	if pod != nil {
		e.Spec.AppliedTo.PodSelector = &metav1.LabelSelector{MatchLabels: pod}
	}
	e.Status.EgressIP = ip
	return e
}

func ns(name string, l map[string]string) corev1.Namespace {
	return corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}}
}

func pod(namespace, name, node string, l map[string]string, ips ...string) corev1.Pod {
	p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: l}, Spec: corev1.PodSpec{NodeName: node}}
	p.Status.Phase = corev1.PodRunning
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	p.Status.HostIPs = []corev1.HostIP{{IP: "192.0.2.11"}, {IP: "2001:db8::11"}}
	return p
}

// names returns Egress name -> pod names of its members.
func names(r Result) map[string][]string {
	out := map[string][]string{}
	for e, ms := range r.Members {
		for _, m := range ms {
			out[e] = append(out[e], fmt.Sprintf("%s=%s@%s", m.Pod, m.PodIP, m.HostIP))
		}
	}
	return out
}

func TestSelect(t *testing.T) {
	pay := map[string]string{"team": "pay"}
	web := map[string]string{"app": "web"}
	nss := []corev1.Namespace{ns("pay", pay), ns("other", nil)}
	hostNet := pod("pay", "hostnet", "n1", web, "192.0.2.11")
	hostNet.Spec.HostNetwork = true
	done := pod("pay", "done", "n1", web, "10.0.0.9")
	done.Status.Phase = corev1.PodSucceeded
	failed := pod("pay", "failed", "n1", web, "10.0.0.8")
	failed.Status.Phase = corev1.PodFailed
	pending := pod("pay", "pending", "n1", web)
	unscheduled := pod("pay", "unscheduled", "", web, "10.0.0.7")
	legacy := pod("pay", "legacy", "n2", web)
	legacy.Status.PodIP, legacy.Status.HostIPs, legacy.Status.HostIP = "10.0.0.6", nil, "192.0.2.12"

	cases := []struct {
		name string
		egs  []v1.Egress
		pods []corev1.Pod
		want map[string][]string
	}{
		{"namespace and pod selector",
			[]v1.Egress{eg("a", 0, "203.0.113.1", pay, web)},
			[]corev1.Pod{pod("pay", "w", "n1", web, "10.0.0.1"), pod("pay", "db", "n1", nil, "10.0.0.2"), pod("other", "w", "n1", web, "10.0.0.3")},
			map[string][]string{"a": {"pay/w=10.0.0.1@192.0.2.11"}}},
		{"absent namespaceSelector means every namespace",
			[]v1.Egress{eg("a", 0, "203.0.113.1", nil, web)},
			[]corev1.Pod{pod("pay", "w", "n1", web, "10.0.0.1"), pod("other", "w", "n1", web, "10.0.0.3"), pod("unknown-ns", "w", "n1", web, "10.0.0.4")},
			map[string][]string{"a": {"pay/w=10.0.0.1@192.0.2.11", "other/w=10.0.0.3@192.0.2.11", "unknown-ns/w=10.0.0.4@192.0.2.11"}}},
		{"empty podSelector matches every Pod of the namespace",
			[]v1.Egress{eg("a", 0, "203.0.113.1", pay, map[string]string{})},
			[]corev1.Pod{pod("pay", "w", "n1", web, "10.0.0.1"), pod("pay", "db", "n1", nil, "10.0.0.2")},
			map[string][]string{"a": {"pay/w=10.0.0.1@192.0.2.11", "pay/db=10.0.0.2@192.0.2.11"}}},
		{"a namespaceSelector never matches an unknown namespace",
			[]v1.Egress{eg("a", 0, "203.0.113.1", map[string]string{}, nil)},
			[]corev1.Pod{pod("gone", "w", "n1", web, "10.0.0.1"), pod("other", "w", "n1", web, "10.0.0.3")},
			map[string][]string{"a": {"other/w=10.0.0.3@192.0.2.11"}}},
		{"host network, terminated, IP-less and unscheduled Pods never",
			[]v1.Egress{eg("a", 0, "203.0.113.1", pay, nil)},
			[]corev1.Pod{hostNet, done, failed, pending, unscheduled, legacy},
			map[string][]string{"a": {"pay/legacy=10.0.0.6@192.0.2.12"}}},
		{"the oldest Egress wins",
			[]v1.Egress{eg("young", 10, "203.0.113.2", pay, nil), eg("old", 5, "203.0.113.1", nil, web)},
			[]corev1.Pod{pod("pay", "w", "n1", web, "10.0.0.1"), pod("pay", "db", "n1", nil, "10.0.0.2"), pod("other", "w", "n2", web, "10.0.0.3")},
			map[string][]string{"old": {"pay/w=10.0.0.1@192.0.2.11", "other/w=10.0.0.3@192.0.2.11"}, "young": {"pay/db=10.0.0.2@192.0.2.11"}}},
		{"same age: the lower name wins",
			[]v1.Egress{eg("b", 0, "203.0.113.2", pay, nil), eg("a", 0, "203.0.113.1", pay, nil)},
			[]corev1.Pod{pod("pay", "w", "n1", web, "10.0.0.1")},
			map[string][]string{"a": {"pay/w=10.0.0.1@192.0.2.11"}}},
		{"the family decides the Pod IP",
			[]v1.Egress{eg("v6", 0, "2001:db8:e::1", pay, web), eg("v4", 1, "", nil, web)},
			[]corev1.Pod{pod("pay", "w", "n1", web, "10.0.0.1", "fd00::1"), pod("other", "w", "n1", web, "10.0.0.3", "fd00::3")},
			// "v4" has no IP and no pool: family unknown, every Pod IP
			// that no older Egress of its family took.
			map[string][]string{"v6": {"pay/w=fd00::1@2001:db8::11"}, "v4": {"pay/w=10.0.0.1@192.0.2.11", "other/w=10.0.0.3@192.0.2.11", "other/w=fd00::3@2001:db8::11"}}},
		{"each family has its own oldest winner",
			[]v1.Egress{eg("old6", 0, "2001:db8:e::1", pay, nil), eg("young4", 1, "203.0.113.1", pay, nil), eg("younger4", 2, "203.0.113.2", pay, nil)},
			[]corev1.Pod{pod("pay", "v4only", "n1", nil, "10.0.0.1"), pod("pay", "dual", "n1", nil, "10.0.0.2", "fd00::2")},
			map[string][]string{"young4": {"pay/v4only=10.0.0.1@192.0.2.11", "pay/dual=10.0.0.2@192.0.2.11"}, "old6": {"pay/dual=fd00::2@2001:db8::11"}}},
		{"an Egress of unknown family competes in both",
			[]v1.Egress{eg("any", 0, "", pay, nil), eg("v6", 1, "2001:db8:e::1", pay, nil)},
			[]corev1.Pod{pod("pay", "dual", "n1", nil, "10.0.0.2", "fd00::2")},
			map[string][]string{"any": {"pay/dual=10.0.0.2@192.0.2.11", "pay/dual=fd00::2@2001:db8::11"}}},
		{"an invalid selector selects nothing",
			[]v1.Egress{func() v1.Egress {
				e := eg("bad", 0, "203.0.113.1", nil, nil)
				e.Spec.AppliedTo.PodSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Near"}}}
				return e
			}(), eg("good", 1, "203.0.113.2", pay, nil)},
			[]corev1.Pod{pod("pay", "w", "n1", web, "10.0.0.1")},
			map[string][]string{"good": {"pay/w=10.0.0.1@192.0.2.11"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := Select(Input{Egresses: tc.egs, Namespaces: nss, Pods: tc.pods})
			got := names(r)
			// Members are sorted by IP; compare as sets of strings in IP order.
			want := map[string][]string{}
			for e, l := range tc.want {
				want[e] = sortedByIP(l)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("members (-want +got):\n%s", diff)
			}
			if tc.name == "an invalid selector selects nothing" && r.Invalid["bad"] == nil {
				t.Errorf("Invalid = %v, want an error for bad", r.Invalid)
			}
		})
	}
}

func sortedByIP(l []string) []string {
	out := append([]string(nil), l...)
	ipOf := func(s string) netip.Addr {
		var a, b string
		for i := range s {
			if s[i] == '=' {
				a = s[i+1:]
			}
		}
		for i := range a {
			if a[i] == '@' {
				b = a[:i]
			}
		}
		return netip.MustParseAddr(b)
	}
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && ipOf(out[j]).Less(ipOf(out[j-1])); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

func TestEgressFamily(t *testing.T) {
	pools := map[string]*v1.ExternalIPPool{
		"v6": {Spec: v1.ExternalIPPoolSpec{IPRanges: []v1.IPRange{{CIDR: "2001:db8::/120"}}}},
		"v4": {Spec: v1.ExternalIPPoolSpec{IPRanges: []v1.IPRange{{Start: "192.0.2.1", End: "192.0.2.9"}}}},
	}
	for _, tc := range []struct {
		status, spec, pool string
		want               Family
	}{
		{"192.0.2.5", "", "v6", IPv4}, // status wins
		{"", "2001:db8::5", "v4", IPv6},
		{"", "", "v6", IPv6},
		{"", "", "v4", IPv4},
		{"", "", "missing", Any},
	} {
		e := v1.Egress{Spec: v1.EgressSpec{EgressIP: tc.spec, ExternalIPPool: tc.pool}, Status: v1.EgressStatus{EgressIP: tc.status}}
		if got := EgressFamily(&e, pools); got != tc.want {
			t.Errorf("EgressFamily(status %q, spec %q, pool %q) = %v, want %v", tc.status, tc.spec, tc.pool, got, tc.want)
		}
	}
}

// world is a random cluster for the property tests.
type world struct {
	egs  []v1.Egress
	nss  []corev1.Namespace
	pods []corev1.Pod
}

func randomWorld(r *rand.Rand, nEg, nNS, nPods int) world {
	vals := []string{"a", "b", "c"}
	pick := func() map[string]string {
		m := map[string]string{}
		for _, k := range []string{"x", "y"} {
			if r.IntN(2) == 0 {
				m[k] = vals[r.IntN(len(vals))]
			}
		}
		return m
	}
	var w world
	for i := range nNS {
		w.nss = append(w.nss, ns(fmt.Sprintf("ns%d", i), pick()))
	}
	for i := range nEg {
		var nsSel, podSel map[string]string
		if r.IntN(4) > 0 {
			nsSel = pick()
		}
		if r.IntN(4) > 0 {
			podSel = pick()
		}
		ip := "203.0.113.1"
		if r.IntN(3) == 0 {
			ip = "2001:db8:e::1"
		}
		w.egs = append(w.egs, eg(fmt.Sprintf("e%d", i), r.IntN(5), ip, nsSel, podSel))
	}
	for i := range nPods {
		p := pod(fmt.Sprintf("ns%d", r.IntN(nNS+1)), fmt.Sprintf("p%d", i), fmt.Sprintf("n%d", r.IntN(3)), pick(),
			fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255), fmt.Sprintf("fd00::%x", i+1))
		if r.IntN(10) == 0 {
			p.Spec.HostNetwork = true
		}
		w.pods = append(w.pods, p)
	}
	return w
}

// oracle is the rule written the slow, obvious way: "pod/family" -> the
// oldest selecting Egress of that family.
func oracle(w world) map[string]string {
	nsl := map[string]map[string]string{}
	for _, n := range w.nss {
		nsl[n.Name] = n.Labels
	}
	out := map[string]string{} // pod -> egress
	for _, p := range w.pods {
		if !Candidate(&p) {
			continue
		}
		for _, fam := range []Family{IPv4, IPv6} {
			var best *v1.Egress
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
				if best == nil || Older(e, best) < 0 {
					best = e
				}
			}
			if best != nil {
				out[fmt.Sprintf("%s/%s/%d", p.Namespace, p.Name, fam)] = best.Name
			}
		}
	}
	return out
}

// TestSelectProperties checks on random clusters: every member agrees with
// the oracle, no Pod is in two Egresses, and shuffling the inputs changes
// nothing (so every Node decides the same).
func TestSelectProperties(t *testing.T) {
	for seed := range uint64(200) {
		r := rand.New(rand.NewPCG(seed, 7))
		w := randomWorld(r, 1+r.IntN(8), 1+r.IntN(4), r.IntN(60))
		got := Select(Input{Egresses: w.egs, Namespaces: w.nss, Pods: w.pods})
		want := oracle(w)
		seen := map[string]string{}
		for e, ms := range got.Members {
			for _, m := range ms {
				k := fmt.Sprintf("%s/%d", m.Pod, familyOf(m.PodIP))
				if prev, dup := seen[k]; dup {
					t.Fatalf("seed %d: %s in %s and %s", seed, k, prev, e)
				}
				seen[k] = e
				if want[k] != e {
					t.Fatalf("seed %d: %s in %s, oracle says %q", seed, k, e, want[k])
				}
			}
		}
		for k, e := range want {
			// Every test Pod has both families, so every oracle match is a member.
			if seen[k] != e {
				t.Fatalf("seed %d: %s should be in %s, got %q", seed, k, e, seen[k])
			}
		}
		sh := world{egs: append([]v1.Egress(nil), w.egs...), nss: append([]corev1.Namespace(nil), w.nss...), pods: append([]corev1.Pod(nil), w.pods...)}
		r.Shuffle(len(sh.egs), func(i, j int) { sh.egs[i], sh.egs[j] = sh.egs[j], sh.egs[i] })
		r.Shuffle(len(sh.nss), func(i, j int) { sh.nss[i], sh.nss[j] = sh.nss[j], sh.nss[i] })
		r.Shuffle(len(sh.pods), func(i, j int) { sh.pods[i], sh.pods[j] = sh.pods[j], sh.pods[i] })
		again := Select(Input{Egresses: sh.egs, Namespaces: sh.nss, Pods: sh.pods})
		if diff := cmp.Diff(got.Members, again.Members, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
			t.Fatalf("seed %d: shuffled inputs changed the result (-first +shuffled):\n%s", seed, diff)
		}
	}
}

// BenchmarkSelect: 1,000 Egresses (one namespace each, half with a pod
// selector) and 10,000 Pods in 1,000 namespaces.
func BenchmarkSelect(b *testing.B) {
	var w world
	for i := range 1000 {
		w.nss = append(w.nss, ns(fmt.Sprintf("ns%d", i), map[string]string{"team": fmt.Sprintf("t%d", i)}))
		var podSel map[string]string
		if i%2 == 0 {
			podSel = map[string]string{"app": "web"}
		}
		w.egs = append(w.egs, eg(fmt.Sprintf("e%d", i), i, "203.0.113.1", map[string]string{"team": fmt.Sprintf("t%d", i)}, podSel))
	}
	for i := range 10000 {
		app := "web"
		if i%3 == 0 {
			app = "db"
		}
		w.pods = append(w.pods, pod(fmt.Sprintf("ns%d", i%1000), fmt.Sprintf("p%d", i), "n1", map[string]string{"app": app}, fmt.Sprintf("10.0.%d.%d", i/250, i%250+1)))
	}
	b.ResetTimer()
	for b.Loop() {
		Select(Input{Egresses: w.egs, Namespaces: w.nss, Pods: w.pods})
	}
}
