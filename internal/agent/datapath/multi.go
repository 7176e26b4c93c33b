package datapath

import (
	"net/netip"
	"reflect"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Several IPs per Egress (issue 20; docs/datapath.md, "Several IPs").
//
// An Egress with IPs (State's Egress.IPs) is programmed as several parts,
// each with its own Node-local ID:
//
//   - its own name, the picker (RolePick): the local maps give its local
//     members its ID mark, then one classify rule of its own replaces the
//     ID of every new connection by that of one of its usable IPs, chosen
//     by `numgen random mod pickModulus` through its pick map, an interval
//     map from [0, pickModulus) to ID marks. RoleFailed instead (its
//     failurePolicy) while none is usable;
//   - one part per IP (SubName): RoleEgress for the IP this Node holds
//     (SNAT to it, remote members and the peer hint as for a single-IP
//     Egress), RoleSource for each other IP while the Egress has local
//     members (the source route into the tunnel toward that IP).
//
// The parts exist for every allocated IP, Ready or not, so that an IP that
// stops or starts being usable changes only the picker's pick map (its
// elements, in one transaction: Datapath.writePicks), never a rule, a
// route or another Egress's element: connections on the other IPs keep
// their marks.

// RolePick is the role of the own part of an Egress with several IPs
// while one of them is usable: its local members' new connections take
// the ID of one of its per-IP parts. It is never part of a State; Plan.Roles
// and the ids set carry it.
const RolePick Role = 101

// pickModulus is the range of the random number that picks a connection's
// IP: 840 is the least common multiple of 1..8 (MaxEgressIPs), so N usable
// IPs get exactly 840/N numbers each and connections are spread evenly.
const pickModulus = 840

// mapPick + the picker's ID names its pick map.
const mapPick = "pick-"

// SubName is the name of the part of Egress egress for its IP ip: the
// Egress name, a slash (no Kubernetes name contains one) and the IP. Plans
// (IDs, Roles, EIPs) name per-IP parts so.
func SubName(egress string, ip netip.Addr) string { return egress + "/" + ip.Unmap().String() }

// BaseName is the Egress name of a plan name (SubName's inverse; a plain
// Egress name is returned as it is).
func BaseName(name string) string {
	b, _, _ := strings.Cut(name, "/")
	return b
}

// multiPart is what Build knows of one part of an Egress with several IPs.
type multiPart struct {
	// picker: the Egress's own part; usable names the parts its new
	// connections choose from, in IP order.
	picker bool
	usable []string
	// sub: a per-IP part (routed toward its IP even without local
	// members of its own).
	sub bool
}

// expandMulti replaces every Egress with IPs by its parts (see above) and
// returns them with what Build needs to know of each.
func expandMulti(egs []Egress) ([]Egress, map[string]multiPart) {
	var out []Egress
	parts := map[string]multiPart{}
	for _, e := range egs {
		if len(e.IPs) == 0 {
			out = append(out, e)
			continue
		}
		if len(e.Local) > 0 {
			p := multiPart{picker: true}
			for _, x := range e.IPs {
				if x.Usable && x.IP.IsValid() {
					p.usable = append(p.usable, SubName(e.Name, x.IP))
				}
			}
			role := RoleSource
			if len(p.usable) == 0 {
				role = RoleFailed
			}
			out = append(out, Egress{Name: e.Name, Role: role, FailurePolicy: e.FailurePolicy, Assigning: e.Assigning, Local: e.Local})
			parts[e.Name] = p
		}
		for _, x := range e.IPs {
			if !x.IP.IsValid() {
				continue
			}
			sub := Egress{Name: SubName(e.Name, x.IP), IP: x.IP.Unmap(), FailurePolicy: e.FailurePolicy}
			switch {
			case x.Held:
				sub.Role, sub.Remote = RoleEgress, e.Remote
			case len(e.Local) > 0:
				sub.Role = RoleSource
			default:
				continue
			}
			out = append(out, sub)
			parts[sub.Name] = multiPart{sub: true}
		}
	}
	return out, parts
}

// allIPs lists the egress IPs of e: IP and every one of IPs.
func allIPs(e Egress) []netip.Addr {
	var out []netip.Addr
	if e.IP.IsValid() {
		out = append(out, e.IP.Unmap())
	}
	for _, x := range e.IPs {
		if x.IP.IsValid() {
			out = append(out, x.IP.Unmap())
		}
	}
	return out
}

// pickElements are the elements of a pick map giving marks[i] the numbers
// [i·w, (i+1)·w) with w = pickModulus/len(marks), in nft(8)'s encoding of
// adjacent ranges: each range a start element carrying the mark and an
// end element at the number after it (the kernel refuses two start
// elements in a row in a named interval set). Keys are big-endian, as
// the rule converts the random number: interval sets compare keys byte by
// byte. No marks, no elements.
func pickElements(marks []uint32) []nftables.SetElement {
	if len(marks) == 0 {
		return nil
	}
	w := pickModulus / len(marks)
	els := make([]nftables.SetElement, 0, 2*len(marks))
	for i, m := range marks {
		els = append(els, nftables.SetElement{Key: be32(uint32(i * w)), Val: native(m)},
			nftables.SetElement{Key: be32(uint32((i + 1) * w)), IntervalEnd: true})
	}
	return els
}

func be32(v uint32) []byte { return []byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)} }

// pickSet declares the pick map of the picker with ID id.
func pickSet(id uint16) nftables.Set {
	return nftables.Set{Name: mapPick + strconv.Itoa(int(id)), KeyType: nftables.TypeInteger, Interval: true, IsMap: true, DataType: nftables.TypeMark}
}

// pickRules are the classify rules of the pickers: a new original-direction
// connection whose mark is a picker's ID takes the mark its pick map gives
// a random number in [0, pickModulus). The mark then lives in conntrack,
// so every later packet of the connection follows the same IP.
func (b *builder) pickRules(plans []egressPlan) []Rule {
	cfg := b.cfg
	var out []Rule
	for _, e := range plans {
		if e.role != RolePick {
			continue
		}
		s := b.set(mapPick + strconv.Itoa(int(e.id)))
		out = append(out, rule(ctState(expr.CtStateBitNEW), ctDir(dirOriginal), ctMarkMasked(cfg.IDMask|cfg.FromTunnel), one(eq(native(cfg.Mark(e.id))),
			&expr.Numgen{Register: 1, Modulus: pickModulus, Type: unix.NFT_NG_RANDOM},
			&expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Len: 4, Size: 4},
			&expr.Lookup{SourceRegister: 1, DestRegister: 1, IsDestRegSet: true, SetName: s.Name, SetID: s.ID},
			&expr.Ct{Key: expr.CtKeyMARK, Register: 1, SourceRegister: true})))
	}
	return out
}

// picksOnly reports whether next differs from prev only in the elements of
// pick maps, and returns those maps (in next's form) when it does.
func picksOnly(prev, next Ruleset) ([]SetContent, bool) {
	if len(prev.Sets) != len(next.Sets) || !reflect.DeepEqual(prev.Counters, next.Counters) || !reflect.DeepEqual(prev.Chains, next.Chains) {
		return nil, false
	}
	var changed []SetContent
	for i := range next.Sets {
		p, n := prev.Sets[i], next.Sets[i]
		if !reflect.DeepEqual(p.Set, n.Set) {
			return nil, false
		}
		if reflect.DeepEqual(p.Elements, n.Elements) {
			continue
		}
		if !strings.HasPrefix(n.Set.Name, mapPick) {
			return nil, false
		}
		changed = append(changed, n)
	}
	return changed, true
}

// PickWrite is what the last Apply wrote to the nftables table, for the
// reprogramming figure (BenchmarkMultiIPReprogram, docs/datapath.md).
type PickWrite struct {
	// Table: the whole table was replaced (one transaction).
	Table bool
	// Maps is the number of pick maps rewritten in place, one transaction
	// each (0 with Table).
	Maps int
	// Elements is the number of elements written: the whole table's with
	// Table, else those of the rewritten pick maps.
	Elements int
	// Messages is the number of netlink messages of the writes, batch
	// begin and end included.
	Messages int
}

// writePicks rewrites each of sets (pick maps) in place, one transaction
// per map: flush its elements, add the new ones. Nothing else of the table
// changes, so no other connection's classification or path is touched.
func (d *Datapath) writePicks(sets []SetContent) (PickWrite, error) {
	w := PickWrite{Maps: len(sets)}
	for _, sc := range sets {
		c, err := d.nft()
		if err != nil {
			return w, err
		}
		s := sc.Set
		s.Table = d.table()
		s.ID = 0
		c.FlushSet(&s)
		if len(sc.Elements) > 0 {
			if err := c.SetAddElements(&s, sc.Elements); err != nil {
				return w, &tableError{err}
			}
		}
		if err := c.Flush(); err != nil {
			return w, &tableError{err}
		}
		w.Elements += len(sc.Elements)
		w.Messages += 4 // begin, flush set, new elements, end
	}
	return w, nil
}

// LastWrite returns what the last Apply wrote to the nftables table: the
// whole table, pick maps in place, or nothing (the zero value).
func (d *Datapath) LastWrite() PickWrite {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lastWrite
}

// elementCount is the number of set and map elements of r.
func (r Ruleset) elementCount() int {
	n := 0
	for _, s := range r.Sets {
		n += len(s.Elements)
	}
	return n
}

// messageCount is the number of netlink messages writeTable sends for r:
// batch begin and end, the table added, deleted and added again, one per
// chain, set, element chunk (setChunk), counter and rule.
func (r Ruleset) messageCount() int {
	n := 2 + 3 + len(r.Chains) + len(r.Counters)
	for _, s := range r.Sets {
		n += 1 + (len(s.Elements)+setChunk-1)/setChunk
	}
	for _, c := range r.Chains {
		n += len(c.Rules)
	}
	return n
}
