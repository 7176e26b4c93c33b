package datapath

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/egressip/egressip/internal/destinations"
)

// Names of the per-destination classification (issue 21; State.Splits).
const (
	// mapLocalSplit + family: local member IP -> jump to its Split's
	// chain; mapRemoteSplit likewise for remote members.
	mapLocalSplit  = "localsplit"
	mapRemoteSplit = "remotesplit"
	// mapDst + family + "-" + n: the interval map of Split n,
	// destination -> ct mark; chainDst + family + "-" + n sets the
	// connection mark from it.
	mapDst   = "dst"
	chainDst = "dst"
	// setSplitMembers + family holds member IP . ct mark for every mark
	// a Split's map can give its members: how a restarted agent reads
	// the classification of split members back (membersOf).
	setSplitMembers = "splitmembers"
)

// splitPlan is one Split as Build programs it.
type splitPlan struct {
	Split
	f    famSpec
	name string // "<family>-<n>"
	// elements are the interval map's elements, marks the distinct marks
	// it gives, sorted.
	elements []nftables.SetElement
	marks    []uint32
}

// planSplits numbers the Splits of st (sorted by remoteness, family and
// first IP, so equal States give equal tables) and derives their interval
// maps from the plans: a local Split's destinations get the ID mark of
// their Egress when it has a datapath here (sourced, held or rejected), a
// remote Split's only those of Egresses held here, with FromTunnel.
func planSplits(cfg Config, st State, plans []egressPlan) []splitPlan {
	byName := make(map[string]*egressPlan, len(plans))
	// heldPart names, for an Egress with several IPs, its part for the IP
	// held here: the one its remote members' flows are SNATed by.
	heldPart := map[string]string{}
	for i := range plans {
		byName[plans[i].Name] = &plans[i]
		if plans[i].multi.sub && plans[i].role == RoleEgress {
			heldPart[BaseName(plans[i].Name)] = plans[i].Name
		}
	}
	var out []splitPlan
	for _, s := range st.Splits {
		if len(s.IPs) == 0 {
			continue
		}
		sp := splitPlan{Split: s, f: families[0]}
		if s.IPs[0].Unmap().Is6() {
			sp.f = families[1]
		}
		out = append(out, sp)
	}
	slices.SortFunc(out, func(a, b splitPlan) int {
		return cmp.Or(cmp.Compare(btoi(a.Remote), btoi(b.Remote)), cmp.Compare(btoi(a.f.v6), btoi(b.f.v6)), a.IPs[0].Unmap().Compare(b.IPs[0].Unmap()))
	})
	n := map[string]int{}
	for i := range out {
		sp := &out[i]
		key := sp.f.suffix
		if sp.Remote {
			key = "r" + key
		}
		sp.name = fmt.Sprintf("%s-%d", key, n[key])
		n[key]++
		var spans []destinations.Span
		for _, s := range sp.Spans {
			e := byName[s.Egress]
			if h, ok := heldPart[s.Egress]; ok && sp.Remote {
				e = byName[h]
			}
			if e == nil || !sp.f.owns(s.First) || !sp.f.owns(s.Last) {
				continue
			}
			mark := cfg.Mark(e.id)
			switch {
			case sp.Remote && e.role == RoleEgress:
				mark |= cfg.FromTunnel
			case sp.Remote:
				continue
			case e.role != RoleSource && e.role != RoleEgress && e.role != RoleFailed && e.role != RolePick:
				continue
			}
			spans = append(spans, s)
			sp.elements = appendSpan(sp.elements, sp.f, s, native(mark))
			sp.marks = append(sp.marks, mark)
		}
		slices.Sort(sp.marks)
		sp.marks = slices.Compact(sp.marks)
		sp.Spans = spans
	}
	return out
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// appendSpan adds span s of an interval map with value val in nft(8)'s
// encoding: an element at the first address carrying the value, and an
// IntervalEnd element at the address after the last (none when the span
// reaches the top of the address space). Adjacent spans keep both: the
// kernel orders an end element before a start element of the same key,
// and refuses two start elements in a row in a named set
// (nft_rbtree_insert, "partial overlap").
func appendSpan(els []nftables.SetElement, f famSpec, s destinations.Span, val []byte) []nftables.SetElement {
	els = append(els, nftables.SetElement{Key: f.addr(s.First.Unmap()), Val: val})
	if next := s.Last.Unmap().Next(); next.IsValid() {
		els = append(els, nftables.SetElement{Key: f.addr(next), IntervalEnd: true})
	}
	return els
}

// addSplitSets declares the Split maps and fills them in; it returns the
// member IPs the plain local and remote maps must leave out.
func (b *builder) addSplitSets(splits []splitPlan) (local, remote map[netip.Addr]bool) {
	local, remote = map[netip.Addr]bool{}, map[netip.Addr]bool{}
	for _, f := range families {
		for _, name := range []string{mapLocalSplit, mapRemoteSplit} {
			b.sets[name+f.suffix] = &SetContent{Set: nftables.Set{Name: name + f.suffix, KeyType: f.keyType, IsMap: true, DataType: nftables.TypeVerdict}}
		}
		b.sets[setSplitMembers+f.suffix] = &SetContent{Set: nftables.Set{Name: setSplitMembers + f.suffix, KeyType: nftables.MustConcatSetType(f.keyType, nftables.TypeMark)}}
	}
	for _, sp := range splits {
		name := mapDst + sp.name
		b.sets[name] = &SetContent{Set: nftables.Set{Name: name, KeyType: sp.f.keyType, Interval: true, IsMap: true, DataType: nftables.TypeMark}, Elements: sp.elements}
		vmap, seen := mapLocalSplit+sp.f.suffix, local
		if sp.Remote {
			vmap, seen = mapRemoteSplit+sp.f.suffix, remote
		}
		jump := &expr.Verdict{Kind: expr.VerdictJump, Chain: chainDst + sp.name} // one for every member of the Split
		for _, ip := range sp.IPs {
			ip = ip.Unmap()
			if !sp.f.owns(ip) || seen[ip] {
				continue
			}
			seen[ip] = true
			b.sets[vmap].Elements = append(b.sets[vmap].Elements, nftables.SetElement{Key: sp.f.addr(ip), VerdictData: jump})
			for _, m := range sp.marks {
				b.sets[setSplitMembers+sp.f.suffix].Elements = append(b.sets[setSplitMembers+sp.f.suffix].Elements, nftables.SetElement{Key: slices.Concat(sp.f.addr(ip), native(m))})
			}
		}
	}
	return local, remote
}

// splitChains returns the chains of the Splits: each sets the connection
// mark from its interval map (no element: no mark, the flow takes no
// Egress) and returns to classify.
func (b *builder) splitChains(splits []splitPlan) []ChainContent {
	out := make([]ChainContent, 0, len(splits))
	for _, sp := range splits {
		out = append(out, ChainContent{Chain: nftables.Chain{Name: chainDst + sp.name}, Rules: []Rule{
			rule(one(payload(sp.f.daddrOff, sp.f.addrLen), b.mapTo(mapDst+sp.name), &expr.Ct{Key: expr.CtKeyMARK, Register: 1, SourceRegister: true})),
		}})
	}
	return out
}

// splitLookup is the classify expression that sends a member of a Split
// to its chain: the source address looked up in vmap.
func (b *builder) splitLookup(vmap string, f famSpec) []expr.Any {
	s := b.set(vmap + f.suffix)
	return one(payload(f.saddrOff, f.addrLen), &expr.Lookup{SourceRegister: 1, DestRegister: 0, IsDestRegSet: true, SetName: s.Name, SetID: s.ID})
}

// splitMarksOf decodes the splitmembers sets of a ruleset or of a table
// read back from the kernel: member IP -> the marks its Split's map can
// give its flows, sorted.
func splitMarksOf(sets []SetContent) map[netip.Addr][]uint32 {
	out := map[netip.Addr][]uint32{}
	for _, sc := range sets {
		for _, f := range families {
			if sc.Set.Name != setSplitMembers+f.suffix {
				continue
			}
			for _, e := range sc.Elements {
				if len(e.Key) < int(f.addrLen)+4 {
					continue
				}
				ip, ok := netip.AddrFromSlice(e.Key[:f.addrLen])
				mark, err := markOf(e.Key[f.addrLen : f.addrLen+4])
				if ok && err == nil {
					out[ip.Unmap()] = append(out[ip.Unmap()], mark)
				}
			}
		}
	}
	for ip, ms := range out {
		slices.Sort(ms)
		out[ip] = slices.Compact(ms)
	}
	return out
}

// memberMarks joins the plain member classification (one mark per IP)
// and the split one (several) into IP -> marks, sorted.
func memberMarks(plain map[netip.Addr]uint32, split map[netip.Addr][]uint32) map[netip.Addr][]uint32 {
	out := make(map[netip.Addr][]uint32, len(plain)+len(split))
	for ip, m := range plain {
		out[ip] = []uint32{m}
	}
	for ip, ms := range split {
		out[ip] = append(out[ip], ms...)
		slices.Sort(out[ip])
		out[ip] = slices.Compact(out[ip])
	}
	return out
}

// failedSpans returns, for the local split members among ips, the spans
// of their Splits whose Egress is rejected here (its mark in failed).
func failedSpans(cfg Config, st State, plan Plan, failed map[uint32]bool, ips map[netip.Addr]bool) map[netip.Addr][]destinations.Span {
	out := map[netip.Addr][]destinations.Span{}
	for _, s := range st.Splits {
		if s.Remote {
			continue
		}
		var spans []destinations.Span
		for _, sp := range s.Spans {
			if id, ok := plan.IDs[sp.Egress]; ok {
				if _, rejected := failed[cfg.Mark(id)]; rejected {
					spans = append(spans, sp)
				}
			}
		}
		for _, ip := range s.IPs {
			if ip = ip.Unmap(); ips[ip] {
				out[ip] = append(out[ip], spans...)
			}
		}
	}
	for ip, spans := range out {
		slices.SortFunc(spans, func(a, b destinations.Span) int { return a.First.Compare(b.First) })
		out[ip] = spans
	}
	return out
}
