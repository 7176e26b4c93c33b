package controller

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/report"
)

// TestAcquireHolds is acquireHolds as a table: only a move of a
// single-IP Egress off a dead Node to an answering Node that takes
// acquire instructions, still Binding there, is held, and only until the
// timeout.
func TestAcquireHolds(t *testing.T) {
	now := time.Unix(1000, 0)
	agents := func(n string) AgentState {
		switch n {
		case "dead":
			return AgentState{Known: true, Dead: true}
		case "new":
			return AgentState{Known: true, Report: report.Report{Node: n, Acquires: true}}
		case "old-agent":
			return AgentState{Known: true, Report: report.Report{Node: n}}
		case "live":
			return AgentState{Known: true, Report: report.Report{Node: n, Acquires: true}}
		}
		return AgentState{}
	}
	conds := func(assigned, ready string) []metav1.Condition {
		return []metav1.Condition{
			{Type: v1.ConditionAssigned, Status: metav1.ConditionTrue, Reason: assigned},
			{Type: v1.ConditionReady, Status: metav1.ConditionFalse, Reason: ready},
		}
	}
	type tc struct {
		name  string
		from  string
		to    string
		toIP  string
		conds []metav1.Condition
		multi bool
		pool  string
		since time.Duration // how long ago the hold began; 0: new
		held  bool
	}
	for _, c := range []tc{
		{name: "failover", from: "dead", to: "new", held: true},
		{name: "failover, held 900ms", from: "dead", to: "new", since: 900 * time.Millisecond, held: true},
		{name: "failover, hold timed out", from: "dead", to: "new", since: time.Second},
		{name: "planned move off a live Node", from: "live", to: "new"},
		{name: "to an agent without acquires", from: "dead", to: "old-agent"},
		{name: "to an unknown agent", from: "dead", to: "unknown"},
		{name: "new address", from: "dead", to: "new", toIP: "192.0.2.9"},
		{name: "already announced", from: "dead", to: "new", conds: []metav1.Condition{{Type: v1.ConditionAssigned, Status: metav1.ConditionTrue, Reason: v1.ReasonScheduled}, {Type: v1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1.ReasonAnnounced}}},
		{name: "bind refused", from: "dead", to: "new", conds: conds(v1.ReasonScheduled, v1.ReasonBindRefused)},
		{name: "attaching", from: "dead", to: "new", conds: conds(v1.ReasonAttaching, v1.ReasonBinding)},
		{name: "spec.ips", from: "dead", to: "new", multi: true},
		{name: "cloud-backed pool", from: "dead", to: "new", pool: "cloud"},
		{name: "unassigned", from: "dead", to: ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := v1.Egress{ObjectMeta: metav1.ObjectMeta{Name: "e", UID: types.UID("u1"), ResourceVersion: "41"},
				Status: v1.EgressStatus{EgressIP: "192.0.2.5", EgressNode: c.from}}
			e.Spec.ExternalIPPool = c.pool
			if c.multi {
				e.Spec.IPs = []v1.EgressIPSource{{}}
			}
			st := v1.EgressStatus{EgressIP: "192.0.2.5", EgressNode: c.to, Conditions: conds(v1.ReasonScheduled, v1.ReasonBinding)}
			if c.toIP != "" {
				st.EgressIP = c.toIP
			}
			if c.conds != nil {
				st.Conditions = c.conds
			}
			since := func(acquireKey) (time.Time, bool) { return time.Time{}, false }
			if c.since > 0 {
				since = func(k acquireKey) (time.Time, bool) { return now.Add(-c.since), k == acquireKey{"u1", c.to} }
			}
			got := acquireHolds([]v1.Egress{e}, map[string]egressChange{"e": {Status: st}}, map[string]bool{"cloud": true}, agents, since, now, time.Second)
			var want []heldMove
			if c.held {
				want = []heldMove{{index: 0, key: acquireKey{"u1", "new"}, acquire: report.Acquire{IP: netip.MustParseAddr("192.0.2.5"), UID: "u1", ResourceVersion: "41", Egress: "e"}}}
			}
			if diff := cmp.Diff(want, got, cmp.AllowUnexported(heldMove{}), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
				t.Errorf("holds (-want +got):\n%s", diff)
			}
			if none := acquireHolds([]v1.Egress{e}, map[string]egressChange{"e": {Status: st}}, nil, agents, since, now, 0); len(none) != 0 {
				t.Errorf("timeout 0 held %v", none)
			}
		})
	}
}

// TestFailoverOneWritePerEgress: with --acquire-timeout set and agents
// that take acquire instructions, the Egresses of a crashed Node move with
// one status write each, which already says Ready on the new Node (the new
// Node bound the address on the poll's instruction first); with agents
// that say they take them but never bind, the hold times out and the
// moves are written as before (the move, then Ready), so a lost
// instruction costs the timeout and nothing else.
func TestFailoverOneWritePerEgress(t *testing.T) {
	for _, lazy := range []bool{false, true} {
		t.Run(fmt.Sprintf("lazy=%v", lazy), func(t *testing.T) {
			prefix := "acq"
			if lazy {
				prefix = "acqlazy"
			}
			cl := newNodes(t, env, prefix, 3, 10)
			cl.opts.Pass.AcquireTimeout = time.Second
			for _, a := range cl.agents {
				a.mu.Lock()
				a.acquires, a.lazy = true, lazy
				a.mu.Unlock()
			}
			cl.startController()
			cl.pool(prefix, nil)
			egs := names(prefix, 6)
			for _, e := range egs {
				cl.egress(e, prefix, "")
			}
			cl.waitReady(egs...)
			before := cl.placements(egs)
			victim := before[egs[0]]
			var moving []string
			for _, e := range egs {
				if before[e] == victim {
					moving = append(moving, e)
				}
			}

			wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
			if err != nil {
				t.Fatal(err)
			}
			wctx, cancel := context.WithCancel(cl.ctx)
			defer cancel()
			w, err := wc.Watch(wctx, &v1.EgressList{})
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			seen := map[string][]v1.EgressStatus{}
			go func() {
				for ev := range w.ResultChan() {
					if e, ok := ev.Object.(*v1.Egress); ok && ev.Type == watch.Modified {
						mu.Lock()
						seen[e.Name] = append(seen[e.Name], *e.Status.DeepCopy())
						mu.Unlock()
					}
				}
			}()
			time.Sleep(300 * time.Millisecond) // the watch is established
			mu.Lock()
			clear(seen)
			mu.Unlock()
			cl.crash(victim)
			for _, e := range moving {
				cl.eventually(e+" Ready elsewhere", func() (bool, string) {
					g := cl.get(e)
					return g.Status.EgressNode != victim && ready(g), describe(g)
				})
			}
			time.Sleep(500 * time.Millisecond) // late writes would show
			mu.Lock()
			defer mu.Unlock()
			want := 1
			if lazy {
				want = 2
			}
			for _, e := range moving {
				sts := seen[e]
				if len(sts) != want {
					t.Errorf("%s: %d status writes after the crash, want %d: %+v", e, len(sts), want, sts)
					continue
				}
				first := sts[0]
				if first.EgressNode == victim || first.EgressNode == "" {
					t.Errorf("%s: first write names Node %q, want the new Node", e, first.EgressNode)
				}
				if got := conditionStatus(first.Conditions, v1.ConditionReady); (got == metav1.ConditionTrue) == lazy {
					t.Errorf("%s: the move's write has Ready %s (lazy agents: %v)", e, got, lazy)
				}
			}
			for _, e := range egs {
				if before[e] != victim && len(seen[e]) != 0 {
					t.Errorf("%s (on a healthy Node) was written %d times: %+v", e, len(seen[e]), seen[e])
				}
			}
			polled := 0
			for _, a := range cl.agents {
				a.mu.Lock()
				polled += a.acquirePolls
				a.mu.Unlock()
			}
			if polled == 0 {
				t.Error("no poll carried an acquire instruction")
			}
		})
	}
}
