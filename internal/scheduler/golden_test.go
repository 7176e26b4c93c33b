package scheduler

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"
)

// updateGolden rewrites testdata/golden.txt from the code under test. It is
// meant to be run once, on the commit whose results are the reference.
var updateGolden = flag.Bool("update-golden", false, "rewrite testdata/golden.txt from the current Schedule")

// goldenCases is how many random inputs TestGoldenResults replays.
const goldenCases = 1500

// goldenInput draws the seed-th random input of TestGoldenResults. Sizes
// range from a handful of Nodes to a few thousand, so both small rings and
// rings with long runs of Nodes at the load bound (or full) come up; every
// oddity the scheduler handles appears now and then: repeated Nodes, pools
// and Egress names, ineligible and zero-capacity Nodes, unknown pools and
// families, shared, missing and wrong-family IPs, current and preferred
// Nodes (known, unknown, unfit), creation-time ties, all balance factors.
func goldenInput(seed uint64) Input {
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

// goldenDigest is the SHA-256 of every field of r in order, each string
// followed by a zero byte, with a marker telling a nil Moves from an empty
// one.
func goldenDigest(r Result) string {
	h := sha256.New()
	put := func(ss ...string) {
		for _, s := range ss {
			h.Write([]byte(s))
			h.Write([]byte{0})
		}
	}
	for _, p := range r.Placements {
		put("P", p.Egress, p.Node, p.Reason, referenceMessage(p.Message))
	}
	if r.Moves == nil {
		put("nil")
	}
	for _, m := range r.Moves {
		put("M", m.Egress, m.From, m.To, m.Reason)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// referenceMessage maps today's wording of a message back to the
// reference implementation's where only the wording changed, so that the
// recorded digests still check everything else: a pool with one eligible
// Node at capacity read "all 1 eligible Nodes of pool %q are at capacity"
// there and "the only eligible Node of pool %q is at capacity" since
// issue 15.
func referenceMessage(m string) string {
	if rest, ok := strings.CutPrefix(m, "the only eligible Node of pool "); ok {
		if pool, ok := strings.CutSuffix(rest, " is at capacity"); ok {
			return "all 1 eligible Nodes of pool " + pool + " are at capacity"
		}
	}
	return m
}

// TestGoldenResults replays random inputs (cold, then warm: each Egress on
// the Node of the cold pass, with the pass repeated after some Nodes lose
// capacity) and compares the digest of every Result with the one recorded
// in testdata/golden.txt by the reference implementation (commit ea86086,
// before the scheduler's performance rework). Any change in placements,
// reasons, messages, moves or order shows up as a mismatch.
func TestGoldenResults(t *testing.T) {
	const path = "testdata/golden.txt"
	cases := uint64(goldenCases)
	if testing.Short() && !*updateGolden {
		cases = 200 // -short: the first cases only
	}
	var got []string
	for seed := uint64(0); seed < cases; seed++ {
		in := goldenInput(seed)
		cold := Schedule(in)
		warm := applyResult(in, cold)
		for i := range warm.Nodes {
			if i%7 == 0 {
				warm.Nodes[i].Capacity /= 2
			}
		}
		got = append(got, fmt.Sprintf("%d %s %s", seed, goldenDigest(cold), goldenDigest(Schedule(warm))))
	}
	if *updateGolden {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(strings.Join(got, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		want = append(want, sc.Text())
	}
	if err := errors.Join(sc.Err(), f.Close()); err != nil {
		t.Fatal(err)
	}
	if len(want) != goldenCases {
		t.Fatalf("%s has %d cases, want %d", path, len(want), goldenCases)
	}
	bad := 0
	for i := range got {
		if got[i] != want[i] {
			bad++
			if bad <= 5 {
				t.Errorf("seed %d: got %s, want %s", i, got[i], want[i])
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d cases differ from the reference", bad, len(got))
	}
}
