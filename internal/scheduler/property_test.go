package scheduler

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	v1 "github.com/egressip/egressip/api/v1alpha1"

	"pgregory.net/rapid"
)

// genSize bounds a random cluster.
type genSize struct{ nodes, pools, egresses, ips int }

var (
	small = genSize{nodes: 10, pools: 3, egresses: 25, ips: 12}
	large = genSize{nodes: 60, pools: 3, egresses: 300, ips: 400}
)

// genInput draws a random cluster: Nodes with random eligibility and
// capacity (some repeated), pools over random subsets of them (some
// repeated, some of an unknown family, some naming unknown Nodes), and
// Egresses with random ages (many ties), pools, IPs (often shared, sometimes
// missing or of the wrong family), current Nodes (sometimes unknown) and
// Preferred Nodes (sometimes unknown).
func genInput(t *rapid.T, sz genSize) Input {
	var in Input
	nn := rapid.IntRange(0, sz.nodes).Draw(t, "nodes")
	var names []string
	for i := range nn {
		name := fmt.Sprintf("n%d", i)
		if i > 0 && rapid.IntRange(0, 9).Draw(t, "dupNode") == 0 {
			name = names[rapid.IntRange(0, len(names)-1).Draw(t, "dupOf")]
		} else {
			names = append(names, name)
		}
		n := Node{Name: name, Eligible: rapid.IntRange(0, 5).Draw(t, "eligible") > 0, Capacity: rapid.IntRange(-1, 5).Draw(t, "capacity")}
		if !n.Eligible {
			n.Reason = rapid.SampledFrom([]string{"", "NotReady", "Cordoned", "AgentDead"}).Draw(t, "reason")
		}
		in.Nodes = append(in.Nodes, n)
	}
	np := rapid.IntRange(1, sz.pools).Draw(t, "pools")
	var pools []string
	for i := range np {
		p := Pool{Name: fmt.Sprintf("p%d", i), Family: IPv4}
		if i > 0 && rapid.IntRange(0, 19).Draw(t, "dupPool") == 0 {
			p.Name = pools[0]
		} else {
			pools = append(pools, p.Name)
		}
		switch rapid.IntRange(0, 9).Draw(t, "family") {
		case 0, 1:
			p.Family = IPv6
		case 2:
			if rapid.IntRange(0, 4).Draw(t, "badFamily") == 0 {
				p.Family = 0
			}
		}
		for _, n := range names {
			if rapid.IntRange(0, 3).Draw(t, "member") > 0 {
				p.EligibleNodes = append(p.EligibleNodes, n)
			}
		}
		if rapid.IntRange(0, 9).Draw(t, "ghostMember") == 0 {
			p.EligibleNodes = append(p.EligibleNodes, "ghost")
		}
		in.Pools = append(in.Pools, p)
	}
	family := map[string]Family{}
	for _, p := range in.Pools {
		if _, ok := family[p.Name]; !ok {
			family[p.Name] = p.Family
		}
	}
	ne := rapid.IntRange(0, sz.egresses).Draw(t, "egresses")
	for i := range ne {
		e := Egress{Name: fmt.Sprintf("e%d", i)}
		if i > 0 && rapid.IntRange(0, 29).Draw(t, "dupEgress") == 0 {
			e.Name = fmt.Sprintf("e%d", rapid.IntRange(0, i-1).Draw(t, "dupOf"))
		}
		e.Created = epoch.Add(time.Duration(rapid.IntRange(0, 15).Draw(t, "created")) * time.Second)
		if rapid.IntRange(0, 9).Draw(t, "nanos") == 0 {
			e.Created = e.Created.Add(time.Duration(rapid.IntRange(1, 999).Draw(t, "nanos")))
		}
		e.Pool = rapid.SampledFrom(pools).Draw(t, "pool")
		if rapid.IntRange(0, 29).Draw(t, "missingPool") == 0 {
			e.Pool = "missing"
		}
		x := rapid.IntRange(0, sz.ips-1).Draw(t, "ip")
		v6 := family[e.Pool] == IPv6
		switch rapid.IntRange(0, 29).Draw(t, "ipKind") {
		case 0:
			// not allocated yet
		case 1:
			v6 = !v6
			fallthrough
		default:
			if v6 {
				e.IP = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 14: byte(x >> 8), 15: byte(x)})
			} else {
				e.IP = netip.AddrFrom4([4]byte{10, 0, byte(x >> 8), byte(x)})
			}
		}
		switch k := rapid.IntRange(0, 9).Draw(t, "current"); {
		case k < 5 || len(names) == 0:
		case k == 5:
			e.CurrentNode = "gone"
		default:
			e.CurrentNode = rapid.SampledFrom(names).Draw(t, "currentNode")
		}
		switch k := rapid.IntRange(0, 9).Draw(t, "preferred"); {
		case k < 7 || len(names) == 0:
		case k == 7:
			e.Preferred = "gone"
		default:
			e.Preferred = rapid.SampledFrom(names).Draw(t, "preferredNode")
		}
		in.Egresses = append(in.Egresses, e)
	}
	in.BalanceFactor = rapid.SampledFrom([]float64{0, 1, 1.25, 1.5, 3, math.Inf(1)}).Draw(t, "c")
	return in
}

// genValid draws a cluster without the invalid entries: every Node
// distinct, every pool valid, every Egress with a distinct name and an IP of
// its pool's family.
func genValid(t *rapid.T, sz genSize) Input {
	in := genInput(t, sz)
	var v Input
	v.BalanceFactor = in.BalanceFactor
	seen := map[string]bool{}
	for _, n := range in.Nodes {
		if !seen[n.Name] {
			seen[n.Name] = true
			v.Nodes = append(v.Nodes, n)
		}
	}
	ck := newChecker(in, Result{})
	for _, p := range in.Pools {
		if ck.poolCount[p.Name] == 1 && p.Family != 0 {
			v.Pools = append(v.Pools, p)
		}
	}
	v.Pools = append(v.Pools, Pool{Name: "last", Family: IPv4}) // never empty
	ck = newChecker(v, Result{})
	for _, e := range in.Egresses {
		e.Name = fmt.Sprintf("%s-%d", e.Name, len(v.Egresses))
		if ck.staticReason(&e) == "" {
			v.Egresses = append(v.Egresses, e)
		}
	}
	return v
}

// shuffle permutes every slice of in, EligibleNodes included.
func shuffle(t *rapid.T, in Input) Input {
	out := in
	out.Nodes = rapid.Permutation(in.Nodes).Draw(t, "nodeOrder")
	out.Egresses = rapid.Permutation(in.Egresses).Draw(t, "egressOrder")
	out.Pools = rapid.Permutation(in.Pools).Draw(t, "poolOrder")
	for i := range out.Pools {
		out.Pools[i].EligibleNodes = rapid.Permutation(out.Pools[i].EligibleNodes).Draw(t, "memberOrder")
	}
	return out
}

func schedule(t *rapid.T, in Input) Result {
	before := cloneInput(in)
	out := Schedule(in)
	if !sameInput(before, in) {
		t.Fatalf("Schedule modified its input")
	}
	return out
}

// Each rule of the pass, checked on random clusters by the independent
// checker of check_test.go. Every subtest runs the checks a rule builds on.
func TestPropertyRules(t *testing.T) {
	rules := []struct {
		name  string
		steps func(ck *checker) []func() error
	}{
		{"placements", func(ck *checker) []func() error { return []func() error{ck.checkPlacements} }},
		{"sharedIP", func(ck *checker) []func() error { return []func() error{ck.checkPlacements, ck.checkUnits} }},
		{"capacity", func(ck *checker) []func() error {
			return []func() error{ck.checkPlacements, ck.checkUnits, ck.checkCapacity}
		}},
		{"maximal", func(ck *checker) []func() error {
			return []func() error{ck.checkPlacements, ck.checkUnits, ck.checkMaximal}
		}},
		{"moves", func(ck *checker) []func() error {
			return []func() error{ck.checkPlacements, ck.checkUnits, ck.checkMoves}
		}},
		{"stickyInPriorityOrder", func(ck *checker) []func() error {
			return []func() error{ck.checkPlacements, ck.checkUnits, ck.checkKeep}
		}},
		{"priority", func(ck *checker) []func() error {
			return []func() error{ck.checkPlacements, ck.checkUnits, ck.checkPriority}
		}},
		{"boundedLoads", func(ck *checker) []func() error {
			return []func() error{ck.checkPlacements, ck.checkUnits, ck.checkBalance}
		}},
	}
	for _, sz := range []struct {
		name string
		sz   genSize
	}{{"small", small}, {"large", large}} {
		for _, rule := range rules {
			t.Run(sz.name+"/"+rule.name, rapid.MakeCheck(func(t *rapid.T) {
				in := genInput(t, sz.sz)
				ck := newChecker(in, schedule(t, in))
				for _, step := range rule.steps(ck) {
					if err := step(); err != nil {
						t.Fatal(err)
					}
				}
			}))
		}
	}
}

// Property 1: the same cluster in any order gives a byte-identical result.
func TestPropertyDeterministic(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		in := genInput(t, small)
		want := dump(schedule(t, in))
		if got := dump(schedule(t, shuffle(t, in))); got != want {
			t.Fatalf("shuffled input changed the result:\n got %s\nwant %s", got, want)
		}
	})
}

// A pass over its own result changes nothing: every placed Egress keeps its
// Node, every unplaced one stays unplaced, nothing moves.
func TestPropertyIdempotent(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		in := genInput(t, small)
		first := schedule(t, in)
		second := schedule(t, applyResult(in, first))
		if second.Moves != nil {
			t.Fatalf("second pass moves %+v", second.Moves)
		}
		if dump(Result{Placements: second.Placements}) != dump(Result{Placements: first.Placements}) {
			t.Fatalf("second pass differs:\n%+v\n%+v", second.Placements, first.Placements)
		}
	})
}

// Property 5: removing or disqualifying one Node moves only the Egresses it
// held; every other placed Egress keeps its Node.
func TestPropertyRemovingANodeMovesOnlyItsEgresses(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		in := genValid(t, small)
		if len(in.Nodes) == 0 {
			return
		}
		cur := applyResult(in, schedule(t, in))
		before := nodesOf(schedule(t, cur))
		x := rapid.IntRange(0, len(cur.Nodes)-1).Draw(t, "node")
		name := cur.Nodes[x].Name
		after := cloneInput(cur)
		switch how := rapid.IntRange(0, 3).Draw(t, "how"); how {
		case 0: // deleted
			after.Nodes = slices.Delete(after.Nodes, x, x+1)
		case 1: // not ready, cordoned, ...
			after.Nodes[x].Eligible, after.Nodes[x].Reason = false, "NotReady"
		case 2: // capacity 0
			after.Nodes[x].Capacity = 0
		case 3: // no longer matches any pool's nodeSelector
			for i := range after.Pools {
				after.Pools[i].EligibleNodes = slices.DeleteFunc(after.Pools[i].EligibleNodes, func(n string) bool { return n == name })
			}
		}
		out := schedule(t, after)
		if err := checkResult(after, out); err != nil {
			t.Fatal(err)
		}
		for _, m := range out.Moves {
			if m.From != name {
				t.Fatalf("removing %s moved %+v", name, m)
			}
		}
		for e, n := range nodesOf(out) {
			if was := before[e]; was != "" && was != name && n != was {
				t.Fatalf("removing %s moved %s from %s to %q", name, e, was, n)
			}
		}
	})
}

// Property 5 and 3: adding a Node moves nothing.
func TestPropertyAddingANodeMovesNothing(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		in := genValid(t, small)
		cur := applyResult(in, schedule(t, in))
		before := nodesOf(schedule(t, cur))
		after := cloneInput(cur)
		after.Nodes = append(after.Nodes, Node{Name: "added", Eligible: true, Capacity: rapid.IntRange(1, 5).Draw(t, "capacity")})
		for i := range after.Pools {
			if rapid.Bool().Draw(t, "inPool") {
				after.Pools[i].EligibleNodes = append(after.Pools[i].EligibleNodes, "added")
			}
		}
		out := schedule(t, after)
		if err := checkResult(after, out); err != nil {
			t.Fatal(err)
		}
		if out.Moves != nil {
			t.Fatalf("adding a Node moved %+v", out.Moves)
		}
		for e, n := range nodesOf(out) {
			if was := before[e]; was != "" && n != was {
				t.Fatalf("adding a Node moved %s from %s to %q", e, was, n)
			}
		}
	})
}

// Property 8: a capacity change applies in the next pass. On a decrease
// exactly the excess leaves, from that Node only, newest first (the checker
// verifies that the ones staying are older); on an increase nothing moves.
func TestPropertyCapacityChange(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		in := genValid(t, small)
		if len(in.Nodes) == 0 {
			return
		}
		cur := applyResult(in, schedule(t, in))
		x := rapid.IntRange(0, len(cur.Nodes)-1).Draw(t, "node")
		name := cur.Nodes[x].Name
		held := map[unitID]bool{}
		for _, e := range cur.Egresses {
			if e.CurrentNode == name {
				held[unitID{e.Pool, e.IP}] = true
			}
		}
		after := cloneInput(cur)
		after.Nodes[x].Capacity = rapid.IntRange(0, 6).Draw(t, "capacity")
		out := schedule(t, after)
		if err := checkResult(after, out); err != nil {
			t.Fatal(err)
		}
		left := map[unitID]bool{}
		for _, m := range out.Moves {
			if m.From != name || m.Reason != v1.MoveCapacityReduced {
				t.Fatalf("capacity change on %s gave move %+v", name, m)
			}
			for _, e := range after.Egresses {
				if e.Name == m.Egress {
					left[unitID{e.Pool, e.IP}] = true
				}
			}
		}
		if want := max(0, len(held)-max(after.Nodes[x].Capacity, 0)); len(left) != want {
			t.Fatalf("%s held %d IPs, capacity now %d: %d left, want %d", name, len(held), after.Nodes[x].Capacity, len(left), want)
		}
	})
}

// Named case (b) on random clusters: adding an Egress newer than all others
// leaves every other placement as it was.
func TestPropertyNewerEgressLeavesOthers(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		in := genInput(t, small)
		before := schedule(t, in)
		if rapid.Bool().Draw(t, "warm") {
			in = applyResult(in, before)
			before = schedule(t, in)
		}
		var newest time.Time
		pools := []string{"missing"}
		for _, e := range in.Egresses {
			if e.Created.After(newest) {
				newest = e.Created
			}
		}
		for _, p := range in.Pools {
			pools = append(pools, p.Name)
		}
		e := Egress{
			Name:    "zz-newest",
			Created: newest.Add(time.Second),
			Pool:    rapid.SampledFrom(pools).Draw(t, "pool"),
		}
		if rapid.Bool().Draw(t, "shared") && len(in.Egresses) > 0 {
			e.IP = rapid.SampledFrom(in.Egresses).Draw(t, "shareWith").IP
		} else {
			e.IP = netip.AddrFrom4([4]byte{10, 9, 9, byte(rapid.IntRange(0, 255).Draw(t, "ip"))})
		}
		after := cloneInput(in)
		after.Egresses = append(after.Egresses, e)
		out := schedule(t, after)
		got := map[string]Placement{}
		for _, p := range out.Placements {
			got[p.Egress] = p
		}
		for _, p := range before.Placements {
			if got[p.Egress] != p {
				t.Fatalf("a newer Egress changed %+v into %+v", p, got[p.Egress])
			}
		}
	})
}

// Passes reuse pooled working memory (statePool). A pass must not see
// anything of an earlier one: results of many random inputs, computed
// concurrently and in reverse order after a sequential run has left the
// pool full of bigger and smaller states, are byte-identical to the
// sequential ones.
func TestPropertyPooledMemoryLeaksNothing(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ins := make([]Input, rapid.IntRange(2, 8).Draw(t, "inputs"))
		for i := range ins {
			sz := small
			if rapid.Bool().Draw(t, "large") {
				sz = large
			}
			ins[i] = genInput(t, sz)
		}
		want := make([]string, len(ins))
		for i := range ins {
			want[i] = dump(Schedule(ins[i]))
		}
		got := make([]string, len(ins))
		var wg sync.WaitGroup
		for i := len(ins) - 1; i >= 0; i-- {
			wg.Go(func() {
				got[i] = dump(Schedule(ins[i]))
			})
		}
		wg.Wait()
		for i := range ins {
			if got[i] != want[i] {
				t.Fatalf("input %d: concurrent pass differs from the sequential one:\n%s\nvs\n%s", i, got[i], want[i])
			}
		}
	})
}
