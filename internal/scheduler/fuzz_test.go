package scheduler

import (
	"encoding/binary"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"testing"
	"time"
)

// bytesReader turns fuzz data into values; past the end it yields zeros.
type bytesReader struct{ b []byte }

func (r *bytesReader) byte() byte {
	if len(r.b) == 0 {
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *bytesReader) u16() uint16 { return uint16(r.byte())<<8 | uint16(r.byte()) }

func (r *bytesReader) u64() uint64 {
	var b [8]byte
	for i := range b {
		b[i] = r.byte()
	}
	return binary.BigEndian.Uint64(b[:])
}

// str is a short name from a small set (so names repeat), or now and then
// any bytes at all.
func (r *bytesReader) str(prefix string, n byte) string {
	b := r.byte()
	if b >= 250 {
		s := make([]byte, r.byte()%8)
		for i := range s {
			s[i] = r.byte()
		}
		return string(s)
	}
	return fmt.Sprintf("%s%d", prefix, b%n)
}

// decodeInput builds an Input from fuzz data. Every field can take odd
// values: repeated and empty names, negative and huge capacities, unknown
// families, missing pools, zero, zoned and wrong-family IPs, current and
// Preferred Nodes (known or not), any balance factor.
func decodeInput(data []byte) Input {
	r := &bytesReader{data}
	var in Input
	switch k := r.byte(); k % 8 {
	case 0:
	case 1:
		in.BalanceFactor = 1
	case 2:
		in.BalanceFactor = math.Inf(1)
	case 3:
		in.BalanceFactor = math.NaN()
	case 4:
		in.BalanceFactor = math.Float64frombits(r.u64())
	default:
		in.BalanceFactor = 1 + float64(k)/64
	}
	for n := r.byte() % 12; n > 0; n-- {
		nd := Node{Name: r.str("n", 14)}
		flags := r.byte()
		nd.Eligible = flags&7 != 0
		nd.Reason = []string{"", "NotReady", "Cordoned", "AgentDead"}[flags>>3&3]
		nd.Capacity = int(int8(r.byte())) % 8
		if flags&0x80 != 0 {
			nd.Capacity = int(r.u64() >> 1)
		}
		in.Nodes = append(in.Nodes, nd)
	}
	for n := r.byte() % 4; n > 0; n-- {
		p := Pool{Name: r.str("p", 5), Family: Family(r.byte() % 8)}
		if p.Family < 4 {
			p.Family = IPv4
		} else if p.Family == 5 || p.Family == 7 {
			p.Family = IPv6
		}
		mask := r.u16()
		for i := range 16 {
			if mask&(1<<i) != 0 {
				p.EligibleNodes = append(p.EligibleNodes, fmt.Sprintf("n%d", i%14))
			}
		}
		in.Pools = append(in.Pools, p)
	}
	for n := r.byte() % 40; n > 0; n-- {
		e := Egress{Name: r.str("e", 48), Pool: r.str("p", 6)}
		e.Created = epoch.Add(time.Duration(int16(r.u16())) * time.Second)
		if b := r.byte(); b < 16 {
			e.Created = e.Created.Add(time.Duration(b))
		}
		switch k, x := r.byte(), r.byte(); k % 8 {
		case 0:
		case 1, 2:
			e.IP = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: x % 32})
		case 3:
			e.IP = netip.AddrFrom16([16]byte{0xfe, 0x80, 15: x % 4}).WithZone("eth0")
		default:
			e.IP = netip.AddrFrom4([4]byte{10, 0, 0, x % 32})
		}
		b := r.byte()
		if b%3 != 0 {
			e.CurrentNode = r.str("n", 15) // n14 is never a Node name above
		}
		if b&0x80 != 0 {
			e.Preferred = r.str("n", 15)
		}
		in.Egresses = append(in.Egresses, e)
	}
	return in
}

// reorder reverses and rotates every slice of in.
func reorder(in Input, k int) Input {
	rot := func(n int) int {
		if n == 0 {
			return 0
		}
		return k % n
	}
	out := cloneInput(in)
	slices.Reverse(out.Nodes)
	slices.Reverse(out.Egresses)
	slices.Reverse(out.Pools)
	out.Nodes = append(out.Nodes[rot(len(out.Nodes)):], out.Nodes[:rot(len(out.Nodes))]...)
	out.Egresses = append(out.Egresses[rot(len(out.Egresses)):], out.Egresses[:rot(len(out.Egresses))]...)
	for i := range out.Pools {
		slices.Reverse(out.Pools[i].EligibleNodes)
	}
	return out
}

// FuzzSchedule checks every rule of the pass (checkResult), that Schedule
// agrees with the reference scheduler (reference_test.go), leaves its input
// alone, is idempotent on its own result, and that its result does not
// depend on input order, on inputs decoded from arbitrary bytes.
func FuzzSchedule(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("\x00\x03n0\x01\x02n1\x01\x02n2\x01\x02\x01p0\x00\xff\xff\x05e0p0\x00\x01\x00\x04\x01\x00"))
	f.Add([]byte{
		0, 4, // c default; 4 Nodes
		0, 1, 1, 1, 1, 1, 2, 1, 2, 3, 0x09, 5, // n0..n2 capacity 1, n3 NotReady
		2,              // 2 pools
		0, 0, 0x00, 15, // p0 IPv4 on n0..n3
		1, 5, 0x00, 6, // p1 IPv6 on n1, n2
		6,                          // 6 Egresses
		0, 0, 0, 0, 99, 4, 1, 1, 0, // e0 p0 10.0.0.1 on n0
		1, 0, 0, 0, 99, 4, 1, 1, 3, // e1 p0 10.0.0.1 on n3 (shares e0's IP)
		2, 0, 0, 1, 99, 4, 2, 0, // e2 p0 10.0.0.2
		3, 1, 0, 1, 99, 1, 3, 1, 1, // e3 p1 2001:db8::3 on n1
		3, 0, 0, 2, 99, 4, 4, 0, // e3 again: duplicate name
		4, 5, 0, 2, 99, 0, 0, 1, 14, // e4 missing pool, no IP, on a removed Node
	})
	f.Add([]byte{3, 11, 250, 0, 0x80, 1, 2, 3, 4, 5, 6, 7, 8, 1, 1, 1, 3, 0, 4, 0xff, 0xff, 39})
	f.Add([]byte{
		0, 3, // c default; 3 Nodes
		0, 1, 5, 1, 1, 5, 2, 1, 5, // n0..n2 capacity 5
		1,             // 1 pool
		0, 0, 0x00, 7, // p0 IPv4 on n0..n2
		3,                             // 3 Egresses
		0, 0, 0, 0, 99, 4, 1, 0x81, 2, // e0 p0 10.0.0.1, preferring n2
		1, 0, 0, 1, 99, 4, 2, 0x80, 0, 2, // e1 p0 10.0.0.2 on n0, preferring n2 (kept: ignored)
		2, 0, 0, 2, 99, 4, 3, 0x81, 14, // e2 p0 10.0.0.3, preferring n14 (no such Node)
	})
	f.Add([]byte{4, 0x3f, 0xf4, 0, 0, 0, 0, 0, 0, 5, 0, 1, 3, 1, 2, 1, 3, 1, 4, 1, 2, 0, 4, 0xff, 0xff, 20})
	f.Fuzz(func(t *testing.T, data []byte) {
		in := decodeInput(data)
		before := cloneInput(in)
		out := Schedule(in)
		if !sameInput(before, in) {
			t.Fatal("Schedule modified its input")
		}
		if err := checkResult(in, out); err != nil {
			t.Fatalf("%v\ninput: %+v\nresult: %+v", err, in, out)
		}
		checkReference(t, in)
		want := dump(out)
		if got := dump(Schedule(reorder(in, len(data)))); got != want {
			t.Fatalf("reordered input changed the result:\n got %s\nwant %s", got, want)
		}
		again := Schedule(applyResult(in, out))
		if again.Moves != nil || dump(Result{Placements: again.Placements}) != dump(Result{Placements: out.Placements}) {
			t.Fatalf("second pass over the result changed it: %+v", again)
		}
	})
}
