package controller

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/report"
)

// memoWorld is a small cluster that changes between passes, for
// TestIncrementalPassMatchesReference: what the API server holds
// (Egresses with resource versions, pools, Nodes), what each agent
// reports, and the clock.
type memoWorld struct {
	rng    *rand.Rand
	pools  []v1.ExternalIPPool
	nodes  []corev1.Node
	egs    []v1.Egress
	agents map[string]*memoAgent
	now    time.Time
	since  map[releaseKey]time.Time
	rv     int
	nextEg int
	// releaseTimeout is the pass's ReleaseTimeout (its messages quote it).
	releaseTimeout time.Duration
}

// memoAgent is one Node's agent as the poller sees it.
type memoAgent struct {
	known, dead  bool
	bound        map[netip.Addr]bool // IP -> announced
	refusedIPs   map[netip.Addr]string
	refusedEgs   map[string]string
	conflicts    map[netip.Addr]bool
	ownershipBad bool
	// iface is the interface the agent reports its addresses bound on
	// ("" for eth0); ownershipAlt picks the other unhealthy finding.
	iface        string
	ownershipAlt bool
}

func (a *memoAgent) state(node string) AgentState {
	st := AgentState{Known: a.known, Dead: a.dead, Report: report.Report{Node: node, MACs: []string{"02:00:00:00:00:" + node[len(node)-2:]}}}
	iface := a.iface
	if iface == "" {
		iface = "eth0"
	}
	for ip, ann := range a.bound {
		st.Report.Bound = append(st.Report.Bound, report.BoundIP{IP: ip, Interface: iface, Announced: ann})
	}
	for ip, msg := range a.refusedIPs {
		st.Report.Refused = append(st.Report.Refused, report.RefusedIP{IP: ip, Message: msg})
	}
	for ip := range a.conflicts {
		st.Report.Conflicts = append(st.Report.Conflicts, report.ConflictIP{IP: ip, Interface: "eth0", MACs: []string{"02:00:00:00:00:01", "0a:0b:0c:0d:0e:0f"},
			Since: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)})
	}
	for eg, msg := range a.refusedEgs {
		st.Report.RefusedEgresses = append(st.Report.RefusedEgresses, report.RefusedEgress{Egress: eg, Message: msg})
	}
	slices.SortFunc(st.Report.RefusedEgresses, func(x, y report.RefusedEgress) int { return strings.Compare(x.Egress, y.Egress) })
	switch {
	case a.ownershipBad && a.ownershipAlt:
		st.Report.Ownership = &report.OwnershipStatus{Mode: "protocol", Healthy: false, Reason: "ProtocolUnsupported", Message: "no IFA_PROTO"}
	case a.ownershipBad:
		st.Report.Ownership = &report.OwnershipStatus{Mode: "record", Healthy: false, Reason: "RecordUnwritable", Message: "read-only /run"}
	}
	st.Report.Sort()
	return st
}

func newMemoWorld(seed uint64) *memoWorld {
	w := &memoWorld{rng: rand.New(rand.NewPCG(seed, 22)), agents: map[string]*memoAgent{}, since: map[releaseKey]time.Time{},
		now: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC), releaseTimeout: 2 * time.Second}
	w.pools = []v1.ExternalIPPool{l2PoolOf("10.0.0.0/28", 1), l2PoolOf("10.1.0.0/29", 2), l2PoolOf("10.2.0.0/30", 3)}
	w.pools[0].Name, w.pools[1].Name, w.pools[2].Name = "a", "b", "c"
	w.pools[1].Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"zone": "x"}}
	for i := range 6 {
		name := fmt.Sprintf("node-%02d", i)
		n := planNode(name)
		ip := fmt.Sprintf("192.168.0.%d", i+1)
		if i == 5 {
			ip = "10.0.0.9" // inside pool a: never handed out, a conflict when named
		}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}
		if i%2 == 0 {
			n.Labels["zone"] = "x"
		}
		w.nodes = append(w.nodes, n)
		w.agents[name] = &memoAgent{known: i != 4, bound: map[netip.Addr]bool{}, refusedIPs: map[netip.Addr]string{}, refusedEgs: map[string]string{},
			conflicts: map[netip.Addr]bool{}}
	}
	for range 22 {
		w.addEgress()
	}
	return w
}

func (w *memoWorld) bumpRV(e *v1.Egress) {
	w.rv++
	e.ResourceVersion = strconv.Itoa(w.rv)
}

func (w *memoWorld) addEgress() {
	i := w.nextEg
	w.nextEg++
	e := v1.Egress{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("eg-%03d", i), UID: types.UID(fmt.Sprintf("uid-%03d", i)), Generation: 1,
		CreationTimestamp: metav1.NewTime(time.Unix(int64(1000+i), 0))},
		Spec: v1.EgressSpec{ExternalIPPool: "a", AppliedTo: v1.AppliedTo{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}}}}}
	w.respec(&e)
	w.bumpRV(&e)
	w.egs = append(w.egs, e)
}

// respec gives e a random spec: a pool (or a missing one, or several IPs),
// maybe a named address, a selector valid or not, a failure policy.
func (w *memoWorld) respec(e *v1.Egress) {
	e.Spec.EgressIP, e.Spec.IPs, e.Spec.ExternalIPPool = "", nil, ""
	switch r := w.rng.IntN(10); {
	case r < 5:
		e.Spec.ExternalIPPool = "a"
	case r < 7:
		e.Spec.ExternalIPPool = "b"
	case r < 8:
		e.Spec.ExternalIPPool = []string{"c", "missing"}[w.rng.IntN(2)]
	default:
		e.Spec.IPs = []v1.EgressIPSource{{Pool: "a", Count: new(int32(2))}}
	}
	if e.Spec.ExternalIPPool == "a" && w.rng.IntN(4) == 0 {
		e.Spec.EgressIP = []string{"10.0.0.3", "10.0.0.9", "10.0.0.12", "10.3.0.1"}[w.rng.IntN(4)]
	}
	e.Spec.AppliedTo.PodSelector.MatchLabels = map[string]string{"app": "x"}
	if w.rng.IntN(8) == 0 {
		e.Spec.AppliedTo.PodSelector.MatchLabels = map[string]string{"bad key": "x"}
	}
	e.Spec.FailurePolicy = []v1.FailurePolicy{"", v1.FailurePolicyFail, v1.FailurePolicyIgnore}[w.rng.IntN(3)]
}

// input is the pass's input as the reconciler builds it.
func (w *memoWorld) input() passInput {
	agents := map[string]AgentState{}
	for name, a := range w.agents {
		agents[name] = a.state(name)
	}
	since := maps.Clone(w.since)
	return passInput{
		Pools: w.pools, Egresses: cloneEgresses(w.egs), Nodes: w.nodes, Now: w.now,
		Agents:       func(n string) AgentState { return agents[n] },
		Config:       PassConfig{DefaultCapacity: 3, ReleaseTimeout: w.releaseTimeout},
		ReleaseSince: func(k releaseKey) time.Time { return since[k] },
	}
}

// apply writes most of the pass's changed statuses (a new resource
// version each; the others are left as if deferred or failed), keeps the
// release waits as trackReleases does, and moves the agents some way
// toward what the statuses say.
func (w *memoWorld) apply(out *passOutput) {
	for i := range w.egs {
		e := &w.egs[i]
		if ch, ok := out.Egresses[e.Name]; ok && w.rng.IntN(5) != 0 && !egressStatusEqual(&e.Status, &ch.Status) {
			e.Status = *ch.Status.DeepCopy()
			w.bumpRV(e)
		}
	}
	for i := range w.pools {
		if st, ok := out.Pools[w.pools[i].Name]; ok {
			w.pools[i].Status = *st.DeepCopy()
		}
	}
	next := map[releaseKey]time.Time{}
	for _, k := range out.Waits {
		next[k] = w.now
		if t, ok := w.since[k]; ok {
			next[k] = t
		}
	}
	w.since = next
	want := map[string]map[netip.Addr]bool{}
	for i := range w.egs {
		for ip, node := range heldIPs(&w.egs[i]) {
			if node != "" {
				if want[node] == nil {
					want[node] = map[netip.Addr]bool{}
				}
				want[node][ip] = true
			}
		}
	}
	for name, a := range w.agents {
		if a.dead || !a.known {
			continue
		}
		for ip := range a.bound {
			if !want[name][ip] && w.rng.IntN(2) == 0 {
				delete(a.bound, ip) // released
			}
		}
		for ip := range want[name] {
			if _, ok := a.bound[ip]; !ok && w.rng.IntN(3) != 0 {
				a.bound[ip] = w.rng.IntN(4) != 0
			} else if ok && w.rng.IntN(2) == 0 {
				a.bound[ip] = true
			}
		}
	}
}

// perturb makes a few random changes: specs, deletions and new Egresses,
// the member publication's counts, agents dying, coming back or reporting
// refusals, conflicts and ownership problems, Nodes cordoned or not
// Ready, pools changing, and the clock advancing (past the release
// timeout at times).
func (w *memoWorld) perturb() {
	w.now = w.now.Add(time.Duration(w.rng.IntN(1500)) * time.Millisecond)
	for range w.rng.IntN(4) {
		switch w.rng.IntN(12) {
		case 0:
			e := &w.egs[w.rng.IntN(len(w.egs))]
			w.respec(e)
			e.Generation++
			w.bumpRV(e)
		case 1:
			if len(w.egs) > 5 {
				k := w.rng.IntN(len(w.egs))
				w.egs = slices.Delete(w.egs, k, k+1)
			}
		case 2:
			w.addEgress()
		case 3:
			// The member publication's counts: an overlay, no new
			// resource version.
			e := &w.egs[w.rng.IntN(len(w.egs))]
			switch {
			case w.rng.IntN(2) == 0:
				e.Status.SelectedPods = new(int32(w.rng.IntN(2)))
			case len(e.Status.ShadowedBy) > 0:
				e.Status.ShadowedBy = nil
			default:
				e.Status.ShadowedBy = []string{w.egs[w.rng.IntN(len(w.egs))].Name}
			}
		case 4:
			a := w.agents[w.nodes[w.rng.IntN(len(w.nodes))].Name]
			switch w.rng.IntN(6) {
			case 0:
				a.dead, a.known = !a.dead, true
			case 1:
				a.known = !a.known
			case 2:
				a.ownershipBad = !a.ownershipBad
			case 3:
				// The same finding's other form: mode, reason and message
				// change, health does not.
				a.ownershipAlt = !a.ownershipAlt
			case 4:
				if a.iface == "" {
					a.iface = "bond0"
				} else {
					a.iface = ""
				}
			default:
				// The release timeout (a flag) changes with a restart in
				// practice; the memo must not replay messages quoting the
				// old one.
				if w.releaseTimeout == 2*time.Second {
					w.releaseTimeout = 3 * time.Second
				} else {
					w.releaseTimeout = 2 * time.Second
				}
			}
		case 5:
			n := &w.nodes[w.rng.IntN(len(w.nodes))]
			if w.rng.IntN(2) == 0 {
				n.Spec.Unschedulable = !n.Spec.Unschedulable
			} else if n.Status.Conditions[0].Status == corev1.ConditionTrue {
				n.Status.Conditions[0].Status = corev1.ConditionFalse
			} else {
				n.Status.Conditions[0].Status = corev1.ConditionTrue
			}
		case 6:
			name := w.nodes[w.rng.IntN(len(w.nodes))].Name
			a := w.agents[name]
			for ip := range a.bound {
				switch w.rng.IntN(3) {
				case 0:
					a.refusedIPs[ip] = "EADDRINUSE " + ip.String()
					delete(a.bound, ip)
				case 1:
					// Still refused, for another reason.
					a.refusedIPs[ip] = "EPERM " + ip.String()
					delete(a.bound, ip)
				default:
					delete(a.refusedIPs, ip)
				}
				break
			}
		case 7:
			a := w.agents[w.nodes[w.rng.IntN(len(w.nodes))].Name]
			eg := w.egs[w.rng.IntN(len(w.egs))].Name
			if _, ok := a.refusedEgs[eg]; ok {
				delete(a.refusedEgs, eg)
			} else {
				a.refusedEgs[eg] = "nft: table full"
			}
		case 8:
			a := w.agents[w.nodes[w.rng.IntN(len(w.nodes))].Name]
			for ip := range a.bound {
				a.conflicts[ip] = !a.conflicts[ip]
				if !a.conflicts[ip] {
					delete(a.conflicts, ip)
				}
				break
			}
		case 9:
			p := &w.pools[w.rng.IntN(len(w.pools))]
			p.Generation++
			switch w.rng.IntN(3) {
			case 0:
				p.Spec.IPRanges = []v1.IPRange{{CIDR: []string{"10.1.0.0/29", "10.1.0.0/30", "10.4.0.0/29"}[w.rng.IntN(3)]}}
			case 1:
				if p.Spec.NodeSelector == nil {
					p.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"zone": "x"}}
				} else {
					p.Spec.NodeSelector = nil
				}
			default:
				p.Spec.IPRanges = []v1.IPRange{{CIDR: "10.0.0.0/28"}}
			}
		case 10:
			w.now = w.now.Add(3 * time.Second) // past the release timeout
		default:
			// Someone else edits a status (a new resource version).
			e := &w.egs[w.rng.IntN(len(w.egs))]
			e.Status.EgressNode = w.nodes[w.rng.IntN(len(w.nodes))].Name
			w.bumpRV(e)
		}
	}
}

// freshTimes replaces, in out, each condition's lastTransitionTime that
// no condition of the same type in the status read carries (set from the
// clock by meta.SetStatusCondition, hence different between two runs of
// the same pass) with one fixed time.
func freshTimes(in *passInput, out passOutput) passOutput {
	read := map[string]*v1.Egress{}
	for i := range in.Egresses {
		read[in.Egresses[i].Name] = &in.Egresses[i]
	}
	fresh := metav1.NewTime(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC))
	chs := make(map[string]egressChange, len(out.Egresses))
	for name, ch := range out.Egresses {
		st := ch.Status.DeepCopy()
		for k := range st.Conditions {
			c := &st.Conditions[k]
			old := slices.IndexFunc(read[name].Status.Conditions, func(o metav1.Condition) bool {
				return o.Type == c.Type && o.LastTransitionTime.Equal(&c.LastTransitionTime)
			})
			if old < 0 {
				c.LastTransitionTime = fresh
			}
		}
		ch.Status = *st
		chs[name] = ch
	}
	out.Egresses = chs
	pools := make(map[string]v1.ExternalIPPoolStatus, len(out.Pools))
	for name, st := range out.Pools {
		st = *st.DeepCopy()
		k := slices.IndexFunc(in.Pools, func(p v1.ExternalIPPool) bool { return p.Name == name })
		for c := range st.Conditions {
			if k < 0 || !slices.ContainsFunc(in.Pools[k].Status.Conditions, func(o metav1.Condition) bool {
				return o.Type == st.Conditions[c].Type && o.LastTransitionTime.Equal(&st.Conditions[c].LastTransitionTime)
			}) {
				st.Conditions[c].LastTransitionTime = fresh
			}
		}
		pools[name] = st
	}
	out.Pools = pools
	return out
}

// writeSummary is what egressWrites decides, in a comparable form.
type writeSummary struct {
	Index int
	Prio  writePriority
}

func summarize(ws *egressWriteSet) []writeSummary {
	out := make([]writeSummary, 0, len(ws.writes))
	for _, w := range ws.writes {
		out = append(out, writeSummary{w.index, w.prio})
	}
	return out
}

// TestIncrementalPassMatchesReference runs, over randomized clusters that
// change between passes (specs, deletions, new Egresses, the member
// publication's counts, agents dying and reporting bindings, refusals,
// conflicts and ownership problems, Nodes, pools, the clock passing the
// release timeout, statuses written or left unwritten), the pass with an
// egressMemo kept across passes and the reference pass (no memo) on the
// same input, and requires the same output (statuses, Events, release
// waits, awaited Nodes, counts, pool statuses) and the same patches.
func TestIncrementalPassMatchesReference(t *testing.T) {
	opts := cmp.Options{
		cmpopts.IgnoreUnexported(egressChange{}),
		cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
		cmp.Comparer(func(a, b error) bool { return a.Error() == b.Error() }),
		cmpopts.EquateEmpty(),
	}
	hits, total := 0, 0
	for seed := range uint64(40) {
		w := newMemoWorld(seed)
		var memo egressMemo
		var sel selectorMemo
		for pass := range 30 {
			in := w.input()
			ref := plan(in)
			inc := in
			inc.Memo, inc.Selectors = &memo, &sel
			before := memo.hits
			got := plan(inc)
			sel.endPass()
			refW := (&PassReconciler{}).egressWrites(in.Egresses, &ref)
			gotW := (&PassReconciler{}).egressWrites(in.Egresses, &got)
			memo.endPass()
			hits += int(memo.hits - before)
			total += len(in.Egresses)
			if d := cmp.Diff(freshTimes(&in, ref), freshTimes(&in, got), opts); d != "" {
				t.Fatalf("seed %d pass %d: the incremental pass differs from the reference (-reference +incremental):\n%s", seed, pass, d)
			}
			if d := cmp.Diff(summarize(refW), summarize(gotW)); d != "" {
				t.Fatalf("seed %d pass %d: the incremental pass patches differently (-reference +incremental):\n%s", seed, pass, d)
			}
			w.apply(&got)
			w.perturb()
		}
	}
	// The memo must serve: a test where every Egress is recomputed would
	// compare the reference with itself.
	if hits < total/5 {
		t.Fatalf("the memo served %d of %d Egress statuses; want at least a fifth", hits, total)
	}
	t.Logf("the memo served %d of %d Egress statuses", hits, total)
}

// TestAgentSnapshot checks that a pass sees one view of each agent: the
// poller's state changing between two reads of a Node within a pass does
// not reach the second read, while other Nodes are still read when first
// asked for.
func TestAgentSnapshot(t *testing.T) {
	calls := map[string]int{}
	live := map[string]AgentState{"n1": {Known: true, Report: report.Report{Node: "n1"}}}
	snap := agentSnapshot(func(node string) AgentState {
		calls[node]++
		return live[node]
	})
	if got := snap("n1"); !got.Known {
		t.Fatalf("first read of n1: %+v, want known", got)
	}
	live["n1"] = AgentState{Known: true, Dead: true}
	live["n2"] = AgentState{Known: true}
	if got := snap("n1"); got.Dead {
		t.Errorf("second read of n1 within the pass: dead, want the first read's live state")
	}
	if got := snap("n2"); !got.Known {
		t.Errorf("first read of n2: %+v, want known", got)
	}
	if calls["n1"] != 1 || calls["n2"] != 1 {
		t.Errorf("reads of the poller's state: %v, want one per Node", calls)
	}
}
