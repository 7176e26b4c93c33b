package scheduler

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"
)

// benchScenario is one cluster shape of BenchmarkSchedule.
type benchScenario struct {
	name                      string
	egresses, nodes, capacity int
	// ips is the number of IPs per Egress: 0 or 1 for single-IP Egresses,
	// more for multi-IP ones (Egress.Slots), each slot of the one pool.
	ips int
}

// The reference figures (cold, on the reference design) are in the comments.
var benchScenarios = []benchScenario{
	{"1kEgress_1kNode_cap10", 1000, 1000, 10, 0},    // ~1.9 ms, 9,200 allocs
	{"1kEgress_100Node_cap5", 1000, 100, 5, 0},      // ~15.5 ms; half cannot be placed
	{"10kEgress_1kNode_cap10", 10000, 1000, 10, 0},  // ~72 ms; exactly full
	{"10kEgress_5kNode_cap10", 10000, 5000, 10, 0},  // two IPs per Node on average
	{"50kEgress_5kNode_cap10", 50000, 5000, 10, 0},  // exactly full
	{"1kEgress3IP_1kNode_cap10", 1000, 1000, 10, 3}, // 3,000 IPs, each Egress's on 3 distinct Nodes
}

// benchInput builds a scenario: one IPv4 pool over all Nodes, every Node
// eligible with the same capacity, Egresses with distinct random IPs created
// one second apart, no current Nodes. Slices are shuffled so that no sort
// starts from sorted input. The same scenario always gives the same Input.
func benchInput(sc benchScenario) Input {
	rng := rand.New(rand.NewPCG(uint64(sc.egresses), uint64(sc.nodes)))
	in := Input{Pools: []Pool{{Name: "bench", Family: IPv4}}}
	for i := 0; i < sc.nodes; i++ {
		name := fmt.Sprintf("node-%05d", i)
		in.Nodes = append(in.Nodes, Node{Name: name, Eligible: true, Capacity: sc.capacity})
		in.Pools[0].EligibleNodes = append(in.Pools[0].EligibleNodes, name)
	}
	seen := map[uint32]bool{}
	for i := 0; i < sc.egresses; i++ {
		var ip uint32
		for ip == 0 || seen[ip] {
			ip = rng.Uint32()
		}
		seen[ip] = true
		e := Egress{
			Name:    fmt.Sprintf("egress-%06d", i),
			Created: epoch.Add(time.Duration(i) * time.Second),
			Pool:    "bench",
			IP:      netip.AddrFrom4([4]byte{byte(ip >> 24), byte(ip >> 16), byte(ip >> 8), byte(ip)}),
		}
		for k := 0; sc.ips > 1 && k < sc.ips; k++ {
			if k > 0 {
				for ip == 0 || seen[ip] {
					ip = rng.Uint32()
				}
				seen[ip] = true
			}
			e.Slots = append(e.Slots, Slot{Pool: "bench",
				IP: netip.AddrFrom4([4]byte{byte(ip >> 24), byte(ip >> 16), byte(ip >> 8), byte(ip)})})
		}
		if e.Slots != nil {
			e.Pool, e.IP = "", netip.Addr{}
		}
		in.Egresses = append(in.Egresses, e)
	}
	rng.Shuffle(len(in.Nodes), func(i, j int) { in.Nodes[i], in.Nodes[j] = in.Nodes[j], in.Nodes[i] })
	rng.Shuffle(len(in.Pools[0].EligibleNodes), func(i, j int) {
		in.Pools[0].EligibleNodes[i], in.Pools[0].EligibleNodes[j] = in.Pools[0].EligibleNodes[j], in.Pools[0].EligibleNodes[i]
	})
	rng.Shuffle(len(in.Egresses), func(i, j int) { in.Egresses[i], in.Egresses[j] = in.Egresses[j], in.Egresses[i] })
	return in
}

// maxLoadRatio is the busiest Node's IP count over the average count per
// eligible Node, counting placed IPs (each IP is distinct here).
func maxLoadRatio(r Result, nodes int) float64 {
	load := map[string]int{}
	placed, busiest := 0, 0
	for _, p := range r.Placements {
		if _, multi := r.Slots[p.Egress]; !multi && p.Node != "" {
			placed++
			load[p.Node]++
			busiest = max(busiest, load[p.Node])
		}
		for _, s := range r.Slots[p.Egress] {
			if s.Node != "" {
				placed++
				load[s.Node]++
				busiest = max(busiest, load[s.Node])
			}
		}
	}
	if placed == 0 {
		return 0
	}
	return float64(busiest) / (float64(placed) / float64(nodes))
}

// BenchmarkSchedule times one pass per scenario: cold (no Egress has a Node
// yet) and warm (every Egress on the Node the cold pass gave it, so nothing
// is placed anew). It reports maxload/avg, the busiest Node's load over the
// average.
func BenchmarkSchedule(b *testing.B) {
	for _, sc := range benchScenarios {
		in := benchInput(sc)
		warm := applyResult(in, Schedule(in))
		b.Run(sc.name, func(b *testing.B) {
			for _, c := range []struct {
				name string
				in   Input
			}{{"cold", in}, {"warm", warm}} {
				b.Run(c.name, func(b *testing.B) {
					b.ReportAllocs()
					var r Result
					for b.Loop() {
						r = Schedule(c.in)
					}
					b.ReportMetric(maxLoadRatio(r, sc.nodes), "maxload/avg")
				})
			}
		})
	}
}

// The allocation budget is at most 2 per Egress in every scenario; this
// counts allocations (not time), so it is exact and can run as a test.
func TestAllocsPerEgress(t *testing.T) {
	for _, sc := range benchScenarios[:3] {
		in := benchInput(sc)
		warm := applyResult(in, Schedule(in))
		for _, c := range []struct {
			name string
			in   Input
		}{{"cold", in}, {"warm", warm}} {
			allocs := testing.AllocsPerRun(3, func() { Schedule(c.in) })
			if per := allocs / float64(sc.egresses); per > 2 {
				t.Errorf("%s/%s: %.0f allocations, %.2f per Egress; budget 2", sc.name, c.name, allocs, per)
			}
		}
	}
}

// The scenarios themselves obey every rule, and the warm pass keeps
// everything.
func TestBenchScenarios(t *testing.T) {
	for _, sc := range benchScenarios[:3] {
		in := benchInput(sc)
		cold := run(t, in)
		warm := run(t, applyResult(in, cold))
		if warm.Moves != nil {
			t.Errorf("%s: warm pass moves %d Egresses", sc.name, len(warm.Moves))
		}
		placed := 0
		for _, p := range cold.Placements {
			if p.Node != "" {
				placed++
			}
		}
		if want := min(sc.egresses, sc.nodes*sc.capacity); placed != want {
			t.Errorf("%s: %d placed, want %d", sc.name, placed, want)
		}
	}
}
