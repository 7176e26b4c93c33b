package controller

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strconv"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/report"
	"github.com/egressip/egressip/internal/scheduler"
)

// passBenchScenario is one cluster shape of BenchmarkPass.
type passBenchScenario struct {
	name            string
	egresses, nodes int
}

// passBenchScenarios are issue 22's shapes (goal 4).
var passBenchScenarios = []passBenchScenario{
	{"5kEgress_1kNode", 5000, 1000},
	{"50kEgress_5kNode", 50000, 5000},
}

// passBenchPoolCIDR is RFC 2544's benchmarking range (198.18.0.0/15):
// 131,072 addresses, room for the 50,000 Egresses of the largest scenario.
const passBenchPoolCIDR = "198.18.0.0/15"

// passBenchInput builds a scenario as the reconciler reads it from the
// cache: one IPv4 pool over every Node, Nodes Ready with an InternalIP
// outside the pool, Egresses created one second apart without an address
// or a status (cold), and every agent known and alive. Slices are shuffled
// (the cache lists in no useful order); the same scenario always gives the
// same input.
func passBenchInput(sc passBenchScenario) passInput {
	rng := rand.New(rand.NewPCG(uint64(sc.egresses), uint64(sc.nodes)))
	epoch := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	in := passInput{
		Pools: []v1.ExternalIPPool{{ObjectMeta: metav1.ObjectMeta{Name: "bench", Generation: 1, CreationTimestamp: metav1.NewTime(epoch)},
			Spec: v1.ExternalIPPoolSpec{IPRanges: []v1.IPRange{{CIDR: passBenchPoolCIDR}}}}},
		Config: PassConfig{DefaultCapacity: 255, BalanceFactor: scheduler.DefaultBalanceFactor, ReleaseTimeout: DefaultReleaseTimeout},
		Now:    epoch.Add(time.Duration(sc.egresses+1) * time.Second),
	}
	for i := range sc.nodes {
		n := planNode(fmt.Sprintf("node-%05d", i))
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}).String()}}
		in.Nodes = append(in.Nodes, n)
	}
	for i := range sc.egresses {
		in.Egresses = append(in.Egresses, v1.Egress{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("egress-%06d", i), Generation: 1, UID: types.UID(fmt.Sprintf("uid-%06d", i)), ResourceVersion: "1",
				CreationTimestamp: metav1.NewTime(epoch.Add(time.Duration(i) * time.Second))},
			Spec: v1.EgressSpec{ExternalIPPool: "bench", AppliedTo: v1.AppliedTo{
				PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app-%d", i)}}}},
		})
	}
	rng.Shuffle(len(in.Nodes), func(i, j int) { in.Nodes[i], in.Nodes[j] = in.Nodes[j], in.Nodes[i] })
	rng.Shuffle(len(in.Egresses), func(i, j int) { in.Egresses[i], in.Egresses[j] = in.Egresses[j], in.Egresses[i] })
	in.Agents = benchAgents(nil)
	return in
}

// benchAgents answers for every Node as known and alive, reporting bound
// and announced the addresses bound lists for it.
func benchAgents(bound map[string][]report.BoundIP) func(string) AgentState {
	return func(node string) AgentState {
		return AgentState{Known: true, Report: report.Report{Node: node, Bound: bound[node]}}
	}
}

// applyPass writes out's statuses into in's Egresses, as the API server
// would hold them after the pass's patches (a new resource version for
// each status that changes), and makes every agent report the addresses
// now assigned to its Node bound and announced.
func applyPass(in passInput, out passOutput) passInput {
	in.Egresses = cloneEgresses(in.Egresses)
	bound := map[string][]report.BoundIP{}
	for i := range in.Egresses {
		e := &in.Egresses[i]
		if ch, ok := out.Egresses[e.Name]; ok && !egressStatusEqual(&e.Status, &ch.Status) {
			e.Status = ch.Status
			rv, _ := strconv.Atoi(e.ResourceVersion)
			e.ResourceVersion = strconv.Itoa(rv + 1)
		}
		if e.Status.EgressNode != "" {
			bound[e.Status.EgressNode] = append(bound[e.Status.EgressNode], report.BoundIP{IP: netip.MustParseAddr(e.Status.EgressIP), Interface: "eth0", Announced: true})
		}
	}
	in.Pools = append([]v1.ExternalIPPool(nil), in.Pools...)
	for i := range in.Pools {
		if st, ok := out.Pools[in.Pools[i].Name]; ok {
			in.Pools[i].Status = st
		}
		if out.Finalize[in.Pools[i].Name] {
			in.Pools[i].Finalizers = []string{PoolFinalizer}
		}
	}
	in.Agents = benchAgents(bound)
	return in
}

func cloneEgresses(egs []v1.Egress) []v1.Egress {
	c := make([]v1.Egress, len(egs))
	for i := range egs {
		egs[i].DeepCopyInto(&c[i])
	}
	return c
}

// passPatches is the part of a reconcile BenchmarkPass times: plan, with
// what r remembers across passes, then the Egress and pool patches that
// differ from what was read (built, not sent: the reconciler's client is
// never called here).
func passPatches(r *PassReconciler, in passInput) int {
	in.Selectors, in.Memo = &r.selectors, &r.statuses
	out := plan(in)
	r.selectors.endPass()
	ew := r.egressWrites(in.Egresses, &out)
	r.statuses.endPass()
	return len(ew.writes) + len(r.poolWrites(in.Pools, &out))
}

// benchSchedInput is the scheduler's input the pass over in builds (the
// phases before scheduling, then what schedule() hands
// scheduler.Schedule), so that the scheduler alone can be timed on the
// same input.
func benchSchedInput(in passInput) scheduler.Input {
	p := newPass(&in)
	p.buildPools()
	p.allocate()
	nodes, _ := p.schedNodes()
	pools, _ := p.schedPools()
	return scheduler.Input{Pools: pools, Nodes: nodes, Egresses: p.schedEgresses(), BalanceFactor: in.Config.BalanceFactor}
}

// passBenchStates are the cold input (no Egress has an address or a
// status) and the warm one (every status and report as a previous pass
// left them: the pass changes nothing). It fails b when the warm pass
// would write anything, or the cold one leaves an Egress unplaced.
func passBenchStates(b *testing.B, sc passBenchScenario) (cold, warm passInput) {
	b.Helper()
	cold = passBenchInput(sc)
	out := plan(cold)
	for name, ch := range out.Egresses {
		if ch.Status.EgressNode == "" {
			b.Fatalf("%s: %s unplaced in the cold pass: %+v", sc.name, name, ch.Status.Conditions)
		}
	}
	// First apply: assigned, not yet announced; second: the agents
	// report the bindings, the Egresses turn Ready.
	warm = applyPass(cold, out)
	warm = applyPass(warm, plan(warm))
	if n := passPatches(&PassReconciler{}, warm); n != 0 {
		b.Fatalf("%s: the warm pass still writes %d objects", sc.name, n)
	}
	return cold, warm
}

// passBenchCache keeps each scenario's inputs across -count repetitions
// (building the 50k one takes three passes).
var passBenchCache = map[string][2]passInput{}

// BenchmarkPass times one scheduling pass (issue 22 goal 4) from the
// objects read from the cache to the list of patches: pools, allocation,
// scheduling, statuses and their diff against what was read. Per scenario
// it runs cold (5k or 50k Egresses without status: all allocated and
// placed, every Egress patched) and warm (the statuses and agent reports a
// previous pass left: nothing is written), and beside each, "schedule",
// scheduler.Schedule alone on the scheduler input that pass builds (the
// issue's target: pass at most 3 x schedule).
func BenchmarkPass(b *testing.B) {
	for _, sc := range passBenchScenarios {
		st := cachedPassBenchStates(b, sc)
		cold, warm := st[0], st[1]
		b.Run(sc.name, func(b *testing.B) {
			for _, c := range []struct {
				name string
				in   passInput
			}{{"cold", cold}, {"warm", warm}} {
				b.Run(c.name+"/pass", func(b *testing.B) {
					b.ReportAllocs()
					var n int
					// A cold pass is a controller's first: nothing
					// remembered. A warm one follows passes over the
					// same objects.
					r := &PassReconciler{}
					if c.name == "warm" {
						passPatches(r, c.in)
					}
					cpu := processCPU(b)
					for b.Loop() {
						if c.name == "cold" {
							r = &PassReconciler{}
						}
						n = passPatches(r, c.in)
					}
					reportCPU(b, cpu)
					b.ReportMetric(float64(n), "patches")
				})
				si := benchSchedInput(c.in)
				b.Run(c.name+"/schedule", func(b *testing.B) {
					b.ReportAllocs()
					cpu := processCPU(b)
					for b.Loop() {
						scheduler.Schedule(si)
					}
					reportCPU(b, cpu)
				})
			}
		})
	}
}

// processCPU is the CPU time (user and system, every thread, the garbage
// collector's included) this process has used so far (getrusage(2),
// RUSAGE_SELF).
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the CPU time per iteration since start ("cpu-ns/op"):
// on a machine shared with other work, wall time per iteration (ns/op)
// grows with the load, CPU time much less.
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64(processCPU(b)-start)/float64(b.N), "cpu-ns/op")
}

// cachedPassBenchStates is passBenchStates of sc (cold, then warm), built
// once per test binary run and kept in passBenchCache.
func cachedPassBenchStates(b *testing.B, sc passBenchScenario) [2]passInput {
	st, ok := passBenchCache[sc.name]
	if !ok {
		cold, warm := passBenchStates(b, sc)
		st = [2]passInput{cold, warm}
		passBenchCache[sc.name] = st
	}
	return st
}

// BenchmarkColdStatusFloor times the least work any cold pass does per
// Egress, whatever its design, on BenchmarkPass's scenarios: with each
// Egress's address and Node already decided (from the cold pass's
// output, so allocation and scheduling cost nothing here), build its
// status as the pass writes it: the address as text, the three
// conditions IPAllocated, Assigned and Ready (Binding) with their
// messages, one transition time, into a slice indexed like the input (no
// map, no diff: every status of a cold pass is new). It is a floor for
// the target, not a pass: a cold pass costs at least this plus
// allocation and scheduling.
func BenchmarkColdStatusFloor(b *testing.B) {
	for _, sc := range passBenchScenarios {
		st := cachedPassBenchStates(b, sc)
		cold := st[0]
		out := plan(cold)
		type decided struct {
			ip         netip.Addr
			node, pool string
			gen        int64
		}
		in := make([]decided, len(cold.Egresses))
		for i := range cold.Egresses {
			e := &cold.Egresses[i]
			s := out.Egresses[e.Name].Status
			in[i] = decided{ip: netip.MustParseAddr(s.EgressIP), node: s.EgressNode, pool: e.Spec.ExternalIPPool, gen: e.Generation}
		}
		b.Run(sc.name, func(b *testing.B) {
			b.ReportAllocs()
			cpu := processCPU(b)
			for b.Loop() {
				now := metav1.NewTime(cold.Now)
				sts := make([]v1.EgressStatus, len(in))
				for i := range in {
					d := &in[i]
					ip := d.ip.String()
					sts[i] = v1.EgressStatus{EgressIP: ip, EgressNode: d.node, Conditions: []metav1.Condition{
						{Type: v1.ConditionIPAllocated, Status: metav1.ConditionTrue, Reason: v1.ReasonAllocated,
							Message: allocatedMsg(d.ip, d.pool), ObservedGeneration: d.gen, LastTransitionTime: now},
						{Type: v1.ConditionAssigned, Status: metav1.ConditionTrue, Reason: v1.ReasonScheduled,
							Message: ip + " is assigned to Node " + d.node, ObservedGeneration: d.gen, LastTransitionTime: now},
						{Type: v1.ConditionReady, Status: metav1.ConditionFalse, Reason: v1.ReasonBinding,
							Message: "waiting for the agent on Node " + d.node + " to bind and announce " + ip, ObservedGeneration: d.gen, LastTransitionTime: now},
					}}
				}
				if len(sts) != len(in) {
					b.Fatal("lost statuses")
				}
			}
			reportCPU(b, cpu)
		})
	}
}
