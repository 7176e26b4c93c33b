package scheduler

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"
)

// diffReference returns "" when Schedule and referenceSchedule
// (reference_test.go) give the same Result for in, down to the last field
// and nil slice, and their difference (-reference +Schedule) otherwise.
func diffReference(in Input) string {
	want, got := referenceSchedule(in), Schedule(in)
	if reflect.DeepEqual(want, got) { // the same test as cmp.Diff's, faster
		return ""
	}
	return cmp.Diff(want, got)
}

// warmInput is the cluster after the controller wrote out's placements,
// with every third Node's capacity halved and every fifth made ineligible:
// the next pass has units to keep, units that must leave and units to
// place beside kept ones.
func warmInput(in Input, out Result) Input {
	w := applyResult(in, out)
	for i := range w.Nodes {
		switch {
		case i%5 == 4:
			w.Nodes[i].Eligible, w.Nodes[i].Reason = false, "NotReady"
		case i%3 == 0:
			w.Nodes[i].Capacity /= 2
		}
	}
	return w
}

// differentialSeeds is how many inputs of each generator
// TestDifferentialRandom draws (each is scheduled cold, then warm).
var differentialSeeds = []struct {
	name  string
	sz    genSize
	seeds int
}{{"small", small, 3000}, {"large", large, 400}}

// TestDifferentialRandom: Schedule and the reference agree on random inputs
// of the property generator (genInput, property_test.go), each scheduled
// cold and then warm (warmInput). Seeds are numbered, so a failure names
// the seed that reproduces it.
func TestDifferentialRandom(t *testing.T) {
	for _, g := range differentialSeeds {
		t.Run(g.name, func(t *testing.T) {
			gen := rapid.Custom(func(t *rapid.T) Input { return genInput(t, g.sz) })
			seeds := g.seeds
			if testing.Short() {
				seeds /= 10
			}
			inputs := 0
			for seed := range seeds {
				in := gen.Example(seed)
				for _, phase := range []string{"cold", "warm"} {
					if phase == "warm" {
						in = warmInput(in, Schedule(in))
					}
					inputs++
					if d := diffReference(in); d != "" {
						t.Fatalf("seed %d, %s: Schedule and the reference differ (-reference +Schedule):\n%s\ninput: %+v", seed, phase, d, in)
					}
				}
			}
			t.Logf("%d random inputs (%d seeds, cold and warm): Schedule and the reference agree", inputs, seeds)
		})
	}
}

// TestDifferentialShrinking is TestDifferentialRandom under rapid.Check,
// which shrinks a disagreement to a minimal input; -rapid.checks sets how
// many inputs it draws. Some inputs are shuffled (every slice permuted):
// the reference does not depend on input order, so Schedule must not
// either.
func TestDifferentialShrinking(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		in := genInput(t, small)
		if rapid.Bool().Draw(t, "warm") {
			in = warmInput(in, Schedule(in))
		}
		if rapid.Bool().Draw(t, "shuffled") {
			in = shuffle(t, in)
		}
		if d := diffReference(in); d != "" {
			t.Fatalf("Schedule and the reference differ (-reference +Schedule):\n%s\ninput: %+v", d, in)
		}
	})
}

// TestDifferentialWide: the same on the inputs of wideInput, which reach
// thousands of Nodes (rings long enough for the scheduler's segment tree),
// long Node names, Preferred Nodes, and pools filled by other pools.
func TestDifferentialWide(t *testing.T) {
	seeds := uint64(200)
	if testing.Short() {
		seeds = 20
	}
	for seed := range seeds {
		in := wideInput(seed)
		for _, phase := range []string{"cold", "warm"} {
			if phase == "warm" {
				in = warmInput(in, Schedule(in))
			}
			if d := diffReference(in); d != "" {
				t.Fatalf("seed %d, %s: Schedule and the reference differ (-reference +Schedule):\n%s", seed, phase, d)
			}
		}
	}
	t.Logf("%d wide inputs (%d seeds, cold and warm): Schedule and the reference agree", 2*seeds, seeds)
}

// namedCases are the named cases of schedule_test.go. Each schedules its
// inputs through run, which compares Schedule with the reference on every
// one of them (besides checking the rules); TestDifferentialNamedCases
// lists them so that a -run TestDifferential selects them too.
var namedCases = []struct {
	name string
	test func(*testing.T)
}{
	{"TwoCapacityOneNodesSameSecond", TestTwoCapacityOneNodesSameSecond},
	{"NewerEgressLeavesOlderPlacements", TestNewerEgressLeavesOlderPlacements},
	{"SharedIPIsOneUnit", TestSharedIPIsOneUnit},
	{"SharedIPPriorityIsOldestMember", TestSharedIPPriorityIsOldestMember},
	{"PriorityWhenCapacityShort", TestPriorityWhenCapacityShort},
	{"InvalidEgresses", TestInvalidEgresses},
	{"NoEligibleNodeAndCapacityExhausted", TestNoEligibleNodeAndCapacityExhausted},
	{"CapacityExhaustedMessageCountsNodes", TestCapacityExhaustedMessageCountsNodes},
	{"StickyKeepsCurrentNode", TestStickyKeepsCurrentNode},
	{"RecoveredNodeTakesNothingBack", TestRecoveredNodeTakesNothingBack},
	{"MoveReasons", TestMoveReasons},
	{"CapacityAcrossPools", TestCapacityAcrossPools},
	{"CapacityChangeAtRuntime", TestCapacityChangeAtRuntime},
	{"BalanceFactor", TestBalanceFactor},
	{"DuplicateNodesMergeConservatively", TestDuplicateNodesMergeConservatively},
	{"EmptyInput", TestEmptyInput},
	{"FullPoolRefusesEveryLaterUnit", TestFullPoolRefusesEveryLaterUnit},
	{"PastTheBoundGoesToTheLeastLoaded", TestPastTheBoundGoesToTheLeastLoaded},
	{"BalanceTenNodes", TestBalanceTenNodes},
	{"PreferredNodeWithinTheBound", TestPreferredNodeWithinTheBound},
	{"GoldenPlacements", TestGoldenPlacements},
}

func TestDifferentialNamedCases(t *testing.T) {
	for _, c := range namedCases {
		t.Run(c.name, c.test)
	}
}

// TestDifferentialBenchmarkInputs: the inputs of BenchmarkSchedule, cold
// and warm, agree too, up to 10,000 Egresses (the reference takes minutes on
// the 50,000: it scans a pool's members for room at every unit).
func TestDifferentialBenchmarkInputs(t *testing.T) {
	for _, sc := range benchScenarios {
		if sc.egresses > 10000 || (testing.Short() && sc.egresses > 1000) {
			continue
		}
		t.Run(sc.name, func(t *testing.T) {
			in := benchInput(sc)
			for _, phase := range []string{"cold", "warm"} {
				if phase == "warm" {
					in = warmInput(in, Schedule(in))
				}
				if d := diffReference(in); d != "" {
					t.Fatalf("%s: Schedule and the reference differ (-reference +Schedule):\n%s", phase, d)
				}
			}
		})
	}
}

// checkReference fails t when Schedule and the reference differ on in.
func checkReference(t testing.TB, in Input) {
	t.Helper()
	if d := diffReference(in); d != "" {
		t.Fatalf("Schedule and the reference differ (-reference +Schedule):\n%s\ninput: %+v", d, in)
	}
}

// wideInput draws the seed-th random input of TestDifferentialWide (it was
// the generator of the SHA-256 goldens that TestDifferentialWide replaces). Sizes
// range from a handful of Nodes to a few thousand, so both small rings and
// rings with long runs of Nodes at the load bound (or full) come up; every
// oddity the scheduler handles appears now and then: repeated Nodes, pools
// and Egress names, ineligible and zero-capacity Nodes, unknown pools and
// families, shared, missing and wrong-family IPs, current and preferred
// Nodes (known, unknown, unfit), creation-time ties, all balance factors.
func wideInput(seed uint64) Input {
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	var in Input
	scale := []int{4, 12, 60, 400, 1500, 3000}[rng.IntN(6)]
	nn := rng.IntN(scale + 1)
	var names []string
	for i := range nn {
		name := fmt.Sprintf("node-%d", i)
		if rng.IntN(5) == 0 {
			name = fmt.Sprintf("a-much-longer-node-name-%d.example", i)
		}
		if i > 0 && rng.IntN(25) == 0 {
			name = names[rng.IntN(len(names))]
		} else {
			names = append(names, name)
		}
		n := Node{Name: name, Eligible: rng.IntN(8) > 0, Capacity: rng.IntN(12) - 1}
		if rng.IntN(4) == 0 {
			n.Capacity = 1 + rng.IntN(3)
		}
		if !n.Eligible {
			n.Reason = []string{"", "NotReady", "Cordoned", "AgentDead"}[rng.IntN(4)]
		}
		in.Nodes = append(in.Nodes, n)
	}
	np := 1 + rng.IntN(3)
	var pools []string
	for i := range np {
		p := Pool{Name: fmt.Sprintf("pool-%d", i), Family: IPv4}
		if i > 0 && rng.IntN(20) == 0 {
			p.Name = pools[0]
		} else {
			pools = append(pools, p.Name)
		}
		switch rng.IntN(10) {
		case 0, 1:
			p.Family = IPv6
		case 2:
			if rng.IntN(5) == 0 {
				p.Family = 0
			}
		}
		keep := rng.IntN(4) // members: all, or about 3/4, 1/2, 1/4
		for _, n := range names {
			if keep == 0 || rng.IntN(4) < 4-keep {
				p.EligibleNodes = append(p.EligibleNodes, n)
			}
		}
		if rng.IntN(10) == 0 {
			p.EligibleNodes = append(p.EligibleNodes, "ghost")
		}
		rng.Shuffle(len(p.EligibleNodes), func(i, j int) {
			p.EligibleNodes[i], p.EligibleNodes[j] = p.EligibleNodes[j], p.EligibleNodes[i]
		})
		in.Pools = append(in.Pools, p)
	}
	family := map[string]Family{}
	for _, p := range in.Pools {
		if _, ok := family[p.Name]; !ok {
			family[p.Name] = p.Family
		}
	}
	ne := rng.IntN(3*scale + 2)
	ips := 1 + rng.IntN(2*ne+1)
	ties := 1 + rng.IntN(3*ne+1) // distinct creation seconds
	for i := range ne {
		e := Egress{Name: fmt.Sprintf("egress-%06d", i)}
		if rng.IntN(3) == 0 {
			e.Name = fmt.Sprintf("e%d", i)
		}
		if i > 0 && rng.IntN(40) == 0 {
			e.Name = in.Egresses[rng.IntN(i)].Name
		}
		e.Created = epoch.Add(time.Duration(rng.IntN(ties)) * time.Second)
		if rng.IntN(10) == 0 {
			e.Created = e.Created.Add(time.Duration(1 + rng.IntN(999)))
		}
		e.Pool = pools[rng.IntN(len(pools))]
		if rng.IntN(40) == 0 {
			e.Pool = "missing"
		}
		x := rng.IntN(ips)
		v6 := family[e.Pool] == IPv6
		switch rng.IntN(40) {
		case 0:
		case 1:
			v6 = !v6
			fallthrough
		default:
			if v6 {
				e.IP = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 13: byte(x >> 16), 14: byte(x >> 8), 15: byte(x)})
			} else {
				e.IP = netip.AddrFrom4([4]byte{10, byte(x >> 16), byte(x >> 8), byte(x)})
			}
		}
		if len(names) > 0 {
			switch k := rng.IntN(10); {
			case k < 5:
			case k == 5:
				e.CurrentNode = "gone"
			default:
				e.CurrentNode = names[rng.IntN(len(names))]
			}
			if rng.IntN(6) == 0 {
				e.Preferred = names[rng.IntN(len(names))]
			}
		}
		in.Egresses = append(in.Egresses, e)
	}
	rng.Shuffle(len(in.Nodes), func(i, j int) { in.Nodes[i], in.Nodes[j] = in.Nodes[j], in.Nodes[i] })
	rng.Shuffle(len(in.Egresses), func(i, j int) { in.Egresses[i], in.Egresses[j] = in.Egresses[j], in.Egresses[i] })
	in.BalanceFactor = []float64{0, 1, 1.25, 1.5, 3, math.Inf(1)}[rng.IntN(6)]
	return in
}
