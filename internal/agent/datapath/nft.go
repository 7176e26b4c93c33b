package datapath

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"maps"
	"math/big"
	"net/netip"
	"slices"
	"strconv"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Rule is the expression list of one nftables rule.
type Rule []expr.Any

// Names of the sets, maps and chains of the table. A "4"/"6" suffix is the
// IPv4/IPv6 twin.
const (
	setCluster = "cluster" // interval set: destinations that never take an egress path
	setNodes   = "nodes"   // Node IPs and egress IPs: the only accepted outer sources of tunnel packets
	setEIPs    = "eips"    // egress IPs held by this Node
	mapLocal   = "local"   // local member IP -> ct mark (ID)
	mapRemote  = "remote"  // remote member IP -> ct mark (ID|FromTunnel)
	mapSNAT    = "snat"    // ct mark (ID) -> egress IP held here
	setFailed  = "failed"  // ct marks (ID) of Egresses whose traffic is rejected
	mapEIPID   = "eipid"   // egress IP held here -> ct mark (ID) of an Egress holding it
	// setSNATSrc6 holds ct mark (ID) . egress IPv6 held here for every
	// Egress held here: the flows allowed to leave with that address as
	// their source (the source guard, chainEIPSource).
	setSNATSrc6 = "snatsrc6"
	// setPeerPods + family + "-" + prefix length: peer Node IP . its Pod
	// network, masked to that length (the sources an egress Node admits
	// from a peer before the member slice names them).
	setPeerPods = "peerpods"
	// setIDs holds every assigned ID's mark with the comment "<role>/<key>"
	// (idComment: the name, or a digest of a name too long for a comment):
	// how a restarted agent reads its IDs back.
	setIDs = "ids"

	chainClassify = "classify"
	// chainMarked is the tail of classify that every packet reaches once
	// (classify's first rule sends packets of established flows straight
	// to it): it carries a marked flow's ID into the packet mark.
	chainMarked  = "marked"
	chainSetMark = "set-mark"
	chainForward = "forward"
	chainReject  = "reject"
	// chainRejectQueue is the base chain that sends the SYNs of rejected
	// connections through the reject queue (Config.RejectQueue).
	chainRejectQueue = "reject-queue"
	chainSNAT        = "snat"
	chainInput       = "input"
	chainEIPGuard    = "eip-guard"
	// chainEIPSource holds the exceptions of the source guard: the
	// packets that may leave with an egress IPv6 address held here as
	// their source. chainSourceOut and chainSourcePost are its base
	// chains (filter output, filter postrouting after srcnat).
	chainEIPSource  = "eip-source"
	chainSourceOut  = "source-out"
	chainSourcePost = "source-post"

	// counterUnknown counts tunnel packets dropped for an unknown inner source.
	counterUnknown = "unknown-source"
	// counterSpoofed counts tunnel packets dropped for an outer source that
	// is not a Node.
	counterSpoofed = "spoofed-tunnel"
	// counterEIPDrop counts new inbound packets dropped at an egress IP.
	counterEIPDrop = "eip-inbound"
	// counterPeerPod counts tunnelled flows admitted from a peer's Pod
	// CIDR before the member slice named their source.
	counterPeerPod = "peer-pod-source"
	// counterEIPSource counts packets the source guard stopped: packets
	// about to leave with an egress IPv6 address held here as their
	// source that no exception allows (see chainEIPSource).
	counterEIPSource = "eip-source"
	// rejectedPrefix + ID names the counter of one failed Egress's rejected
	// packets.
	rejectedPrefix = "rejected-"
)

// icmpPktFiltered is ICMP destination unreachable code 13, communication
// administratively prohibited (RFC 1812 5.2.7.1; ICMP_PKT_FILTERED).
const icmpPktFiltered = 13

// icmp6PolicyFail is ICMPv6 destination unreachable code 5, source
// address failed ingress/egress policy (RFC 4443 section 3.1); Linux
// reports it to the socket as EACCES.
const icmp6PolicyFail = 5

// ICMPv6 Neighbor Solicitation and Advertisement (RFC 4861 section 4).
const (
	icmp6NeighSolicit = 135
	icmp6NeighAdvert  = 136
)

// roleWord is the role as written in the ids set's comments.
var roleWord = map[Role]string{RoleSource: "source", RoleEgress: "egress", RoleFailed: "failed", RoleDrain: "drain", RolePick: "pick"}

// fam4/fam6 parameterise the IPv4 and IPv6 twins.
type famSpec struct {
	suffix   string
	nfproto  byte
	keyType  nftables.SetDatatype
	saddrOff uint32
	daddrOff uint32
	addrLen  uint32
	natFam   uint32
	icmp     byte // L4 protocol number of ICMP of this family
	v6       bool
}

var families = []famSpec{
	{suffix: "4", nfproto: unix.NFPROTO_IPV4, keyType: nftables.TypeIPAddr, saddrOff: 12, daddrOff: 16, addrLen: 4, natFam: unix.NFPROTO_IPV4, icmp: unix.IPPROTO_ICMP},
	{suffix: "6", nfproto: unix.NFPROTO_IPV6, keyType: nftables.TypeIP6Addr, saddrOff: 8, daddrOff: 24, addrLen: 16, natFam: unix.NFPROTO_IPV6, icmp: unix.IPPROTO_ICMPV6, v6: true},
}

func (f famSpec) addr(a netip.Addr) []byte {
	if f.v6 {
		b := a.As16()
		return b[:]
	}
	b := a.As4()
	return b[:]
}

func (f famSpec) owns(a netip.Addr) bool { return a.IsValid() && a.Unmap().Is6() == f.v6 }

// native encodes a 32-bit mark as registers hold it (host byte order).
func native(v uint32) []byte { return binaryutil.NativeEndian.PutUint32(v) }

// ifname is an interface name as nft compares it: NUL-padded to IFNAMSIZ.
func ifname(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}

// builder accumulates the ruleset.
type builder struct {
	cfg  Config
	sets map[string]*SetContent
	// peerLens are the Pod CIDR prefix lengths of the peerpods sets, by
	// family suffix, sorted.
	peerLens map[string][]int
	// splits are the State's Splits as programmed (split.go).
	splits []splitPlan
}

// gpeOff is the offset of the inner IP header in a tunnel packet's UDP
// payload (UDP header 8, VXLAN-GPE header 8), and gpeNextOff that of the
// GPE header's next-protocol field (draft-ietf-nvo3-vxlan-gpe: 1 IPv4,
// 2 IPv6), both from the start of the UDP header.
const (
	gpeOff     = 16
	gpeNextOff = 8 + 3
)

func (b *builder) set(name string) *nftables.Set {
	s, ok := b.sets[name]
	if !ok {
		panic("datapath: unknown set " + name)
	}
	return &s.Set
}

func (b *builder) lookup(name string, invert bool) *expr.Lookup {
	s := b.set(name)
	return &expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID, Invert: invert}
}

func (b *builder) mapTo(name string) *expr.Lookup {
	s := b.set(name)
	return &expr.Lookup{SourceRegister: 1, DestRegister: 1, IsDestRegSet: true, SetName: s.Name, SetID: s.ID}
}

// Expression helpers; every match loads into register 1.
func loadMeta(k expr.MetaKey) expr.Any { return &expr.Meta{Key: k, Register: 1} }
func eq(data []byte) expr.Any          { return &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: data} }
func neq(data []byte) expr.Any         { return &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: data} }
func and32(mask uint32) expr.Any {
	return &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: native(mask), Xor: native(0)}
}
func iif(n string) []expr.Any    { return []expr.Any{loadMeta(expr.MetaKeyIIFNAME), eq(ifname(n))} }
func notIif(n string) []expr.Any { return []expr.Any{loadMeta(expr.MetaKeyIIFNAME), neq(ifname(n))} }
func oif(n string) []expr.Any    { return []expr.Any{loadMeta(expr.MetaKeyOIFNAME), eq(ifname(n))} }
func nfproto(p byte) []expr.Any  { return []expr.Any{loadMeta(expr.MetaKeyNFPROTO), eq([]byte{p})} }
func l4proto(p byte) []expr.Any  { return []expr.Any{loadMeta(expr.MetaKeyL4PROTO), eq([]byte{p})} }
func ctState(bits uint32) []expr.Any {
	return []expr.Any{&expr.Ct{Key: expr.CtKeySTATE, Register: 1}, and32(bits), neq(native(0))}
}

// ctNotNew matches packets whose connection is not new: ct state has no
// new bit (established, related, invalid and untracked packets).
func ctNotNew() []expr.Any {
	return []expr.Any{&expr.Ct{Key: expr.CtKeySTATE, Register: 1}, and32(expr.CtStateBitNEW), eq(native(0))}
}

// dirOriginal and dirReply are conntrack's directions of a packet
// (IP_CT_DIR_ORIGINAL, IP_CT_DIR_REPLY in the kernel), as ctDir matches them.
const dirOriginal, dirReply = 0, 1

func ctDir(d byte) []expr.Any {
	return []expr.Any{&expr.Ct{Key: expr.CtKeyDIRECTION, Register: 1}, eq([]byte{d})}
}
func ctMarkMasked(mask uint32) []expr.Any {
	return []expr.Any{&expr.Ct{Key: expr.CtKeyMARK, Register: 1}, and32(mask)}
}
func payload(off, n uint32) expr.Any {
	return &expr.Payload{OperationType: expr.PayloadLoad, DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n}
}
func udpDport(port uint16) []expr.Any {
	return []expr.Any{
		loadMeta(expr.MetaKeyL4PROTO), eq([]byte{unix.IPPROTO_UDP}),
		&expr.Payload{OperationType: expr.PayloadLoad, DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		eq(binaryutil.BigEndian.PutUint16(port)),
	}
}

// orMetaMark sets bits in the packet mark, keeping the others:
// mark = (mark & ^bits) ^ bits.
func orMetaMark(bits uint32) []expr.Any {
	return []expr.Any{
		loadMeta(expr.MetaKeyMARK),
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: native(^bits), Xor: native(bits)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
	}
}

func verdict(k expr.VerdictKind, chain string) expr.Any {
	return &expr.Verdict{Kind: k, Chain: chain}
}

func rule(parts ...[]expr.Any) Rule {
	var r Rule
	for _, p := range parts {
		r = append(r, p...)
	}
	return r
}

func one(e ...expr.Any) []expr.Any { return e }

// buildRuleset derives the table's content. plans are sorted by name.
func buildRuleset(cfg Config, st State, plans []egressPlan) Ruleset {
	b := &builder{cfg: cfg, sets: map[string]*SetContent{}, peerLens: map[string][]int{}, splits: planSplits(cfg, st, plans)}
	b.addSets(st, plans)
	// Stable batch-local set IDs.
	sets := make([]SetContent, 0, len(b.sets))
	for i, name := range slices.Sorted(maps.Keys(b.sets)) {
		b.sets[name].Set.ID = uint32(i + 1)
		sets = append(sets, *b.sets[name])
	}
	chains, counters := b.chains(plans)
	return Ruleset{Sets: sets, Counters: counters, Chains: chains}
}

// addSets declares the sets and maps and fills in their elements.
func (b *builder) addSets(st State, plans []egressPlan) {
	cfg := b.cfg
	markType := nftables.TypeMark
	add := func(s nftables.Set) {
		b.sets[s.Name] = &SetContent{Set: s}
	}
	for _, f := range families {
		add(nftables.Set{Name: setCluster + f.suffix, KeyType: f.keyType, Interval: true})
		add(nftables.Set{Name: setNodes + f.suffix, KeyType: f.keyType})
		add(nftables.Set{Name: setEIPs + f.suffix, KeyType: f.keyType})
		add(nftables.Set{Name: mapLocal + f.suffix, KeyType: f.keyType, IsMap: true, DataType: markType})
		add(nftables.Set{Name: mapRemote + f.suffix, KeyType: f.keyType, IsMap: true, DataType: markType})
		add(nftables.Set{Name: mapSNAT + f.suffix, KeyType: markType, KeyByteOrder: binaryutil.NativeEndian, IsMap: true, DataType: f.keyType})
	}
	holds := slices.ContainsFunc(plans, func(e egressPlan) bool { return e.role == RoleEgress })
	for _, f := range families {
		add(nftables.Set{Name: mapEIPID + f.suffix, KeyType: f.keyType, IsMap: true, DataType: markType})
		if !holds {
			continue
		}
		// Peer Pod networks by prefix length: one set (and rule) per
		// length, usually one (--node-cidr-mask-size).
		byLen := map[int][]nftables.SetElement{}
		for _, pr := range st.Peers {
			if !f.owns(pr.IP) {
				continue
			}
			for _, c := range pr.PodCIDRs {
				if !c.IsValid() || !f.owns(c.Addr()) {
					continue
				}
				if c.Addr().Is4In6() {
					c = netip.PrefixFrom(c.Addr().Unmap(), max(c.Bits()-96, 0))
				}
				c = c.Masked()
				byLen[c.Bits()] = append(byLen[c.Bits()], nftables.SetElement{Key: slices.Concat(f.addr(pr.IP.Unmap()), f.addr(c.Addr()))})
			}
		}
		for _, l := range slices.Sorted(maps.Keys(byLen)) {
			name := setPeerPods + f.suffix + "-" + strconv.Itoa(l)
			add(nftables.Set{Name: name, KeyType: nftables.MustConcatSetType(f.keyType, f.keyType)})
			b.sets[name].Elements = byLen[l]
			b.peerLens[f.suffix] = append(b.peerLens[f.suffix], l)
		}
	}
	add(nftables.Set{Name: setSNATSrc6, KeyType: nftables.MustConcatSetType(markType, nftables.TypeIP6Addr)})
	add(nftables.Set{Name: setFailed, KeyType: markType, KeyByteOrder: binaryutil.NativeEndian})
	add(nftables.Set{Name: setIDs, KeyType: markType, KeyByteOrder: binaryutil.NativeEndian})

	splitLocal, splitRemote := b.addSplitSets(b.splits)

	// Elements.
	elem := func(set string, key, val []byte) {
		s := b.sets[set]
		s.Elements = append(s.Elements, nftables.SetElement{Key: key, Val: val})
	}
	seenLocal, seenRemote := map[netip.Addr]bool{}, map[netip.Addr]bool{}
	for _, e := range plans {
		mark := cfg.Mark(e.id)
		b.sets[setIDs].Elements = append(b.sets[setIDs].Elements, nftables.SetElement{Key: native(mark), Comment: idComment(e.role, e.Name)})
		f := families[0]
		if e.v6 {
			f = families[1]
		}
		if e.role == RoleFailed {
			elem(setFailed, native(mark), nil)
		}
		if e.role == RolePick {
			ps := pickSet(e.id)
			add(ps)
			b.sets[ps.Name].Elements = pickElements(e.picks)
		}
		for _, ip := range e.Local {
			ip = ip.Unmap()
			if f.owns(ip) && !seenLocal[ip] && !splitLocal[ip] {
				seenLocal[ip] = true
				elem(mapLocal+f.suffix, f.addr(ip), native(mark))
			}
		}
		if e.role != RoleEgress {
			continue
		}
		elem(setEIPs+f.suffix, f.addr(e.IP.Unmap()), nil)
		elem(mapSNAT+f.suffix, native(mark), f.addr(e.IP.Unmap()))
		if f.v6 {
			elem(setSNATSrc6, slices.Concat(native(mark), f.addr(e.IP.Unmap())), nil)
		}
		// Egresses sharing an IP: the first in name order names it (the
		// SNAT address is the same whichever it is).
		if !slices.ContainsFunc(b.sets[mapEIPID+f.suffix].Elements, func(x nftables.SetElement) bool { return slices.Equal(x.Key, f.addr(e.IP.Unmap())) }) {
			elem(mapEIPID+f.suffix, f.addr(e.IP.Unmap()), native(mark))
		}
		for _, m := range e.Remote {
			ip := m.IP.Unmap()
			if f.owns(ip) && !seenRemote[ip] && !seenLocal[ip] && !splitRemote[ip] && !splitLocal[ip] {
				seenRemote[ip] = true
				elem(mapRemote+f.suffix, f.addr(ip), native(mark|cfg.FromTunnel))
			}
		}
	}
	for _, f := range families {
		// Tunnel packets may also come from an egress IP: IPv6 source
		// selection (RFC 6724 rule 8, as Linux applies it) prefers an
		// egress IP's /128 over the Node's /64 address for peers on the
		// same subnet.
		var nodes []netip.Addr
		for _, ip := range st.NodeIPs {
			if f.owns(ip) {
				nodes = append(nodes, ip.Unmap())
			}
		}
		for _, e := range st.Egresses {
			for _, ip := range allIPs(e) {
				if f.owns(ip) {
					nodes = append(nodes, ip)
				}
			}
		}
		slices.SortFunc(nodes, netip.Addr.Compare)
		for _, ip := range slices.Compact(nodes) {
			elem(setNodes+f.suffix, f.addr(ip), nil)
		}
		b.sets[setCluster+f.suffix].Elements = intervalElements(f, clusterPrefixes(f, st))
	}
	for _, s := range b.sets {
		if !s.Set.Interval {
			// Egresses may share an egress IP: one element per key, as
			// the kernel keeps it.
			slices.SortFunc(s.Elements, func(x, y nftables.SetElement) int { return slices.Compare(x.Key, y.Key) })
			s.Elements = slices.CompactFunc(s.Elements, func(x, y nftables.SetElement) bool { return slices.Equal(x.Key, y.Key) })
		}
	}
}

// chains builds the chains (jump targets first) and lists the named
// counters their rules use.
func (b *builder) chains(plans []egressPlan) ([]ChainContent, []string) {
	classify, marked, setMark, forward := b.classifyRules(plans), b.markedRules(), b.setMarkRules(), b.forwardRules()
	reject, counters := b.rejectRules(plans)
	rejectQueue, snat, input, guard := b.rejectQueueRules(), b.snatRules(), b.inputRules(), b.eipGuardRules()
	eipSource, sourceOut, sourcePost := b.sourceGuard()
	counters = append(counters, counterUnknown, counterSpoofed, counterEIPDrop, counterPeerPod, counterEIPSource)
	slices.Sort(counters)

	filter, nat := nftables.ChainTypeFilter, nftables.ChainTypeNAT
	prio := func(p int32) *nftables.ChainPriority { return new(nftables.ChainPriority(p)) }
	chains := append(b.splitChains(b.splits), []ChainContent{
		{Chain: nftables.Chain{Name: chainSetMark}, Rules: setMark},
		{Chain: nftables.Chain{Name: chainMarked}, Rules: marked},
		{Chain: nftables.Chain{Name: chainReject}, Rules: reject},
		{Chain: nftables.Chain{Name: chainEIPGuard}, Rules: guard},
		{Chain: nftables.Chain{Name: chainClassify, Type: filter, Hooknum: nftables.ChainHookPrerouting, Priority: prio(-100 + 10)}, Rules: classify},
		{Chain: nftables.Chain{Name: chainRejectQueue, Type: filter, Hooknum: nftables.ChainHookForward, Priority: prio(-150 - 20)}, Rules: rejectQueue},
		{Chain: nftables.Chain{Name: chainForward, Type: filter, Hooknum: nftables.ChainHookForward, Priority: prio(-150 - 10)}, Rules: forward},
		{Chain: nftables.Chain{Name: chainSNAT, Type: nat, Hooknum: nftables.ChainHookPostrouting, Priority: prio(100 - 10)}, Rules: snat},
		{Chain: nftables.Chain{Name: chainInput, Type: filter, Hooknum: nftables.ChainHookInput, Priority: prio(0 - 10)}, Rules: input},
		{Chain: nftables.Chain{Name: chainEIPSource}, Rules: eipSource},
		{Chain: nftables.Chain{Name: chainSourceOut, Type: filter, Hooknum: nftables.ChainHookOutput, Priority: prio(0 - 10)}, Rules: sourceOut},
		{Chain: nftables.Chain{Name: chainSourcePost, Type: filter, Hooknum: nftables.ChainHookPostrouting, Priority: prio(100 + 10)}, Rules: sourcePost},
	}...)
	return chains, counters
}

// classifyRules builds the chain classify: decide with the connection mark,
// then set the packet mark for the routing decision (prerouting, after
// kube-proxy's DNAT). Only the first packet of a connection (ct state new)
// is decided; every other packet skips the decisions with one rule and goes
// to chainMarked, so that a bulk transfer's packets cost two short chains
// rather than the dozen rules of the decisions.
func (b *builder) classifyRules(plans []egressPlan) []Rule {
	cfg := b.cfg
	tun := cfg.TunnelDevice
	classify := make([]Rule, 0, 4*len(families)+6)
	classify = append(classify, rule(ctNotNew(), one(verdict(expr.VerdictGoto, chainMarked))))
	for _, f := range families {
		classify = append(classify, rule(iif(tun), nfproto(f.nfproto), ctState(expr.CtStateBitNEW),
			one(payload(f.saddrOff, f.addrLen), b.mapTo(mapRemote+f.suffix), &expr.Ct{Key: expr.CtKeyMARK, Register: 1, SourceRegister: true})))
		// Remote members whose destinations Egresses held here share:
		// their Split's chain marks by destination.
		classify = append(classify, rule(iif(tun), nfproto(f.nfproto), ctState(expr.CtStateBitNEW), b.splitLookup(mapRemoteSplit, f)))
	}
	// A member not in remote yet, whose outer packet input found to come
	// from a peer's Pod CIDR to an egress IP held here (the hint: that
	// Egress's ID in the packet mark, kept through decapsulation; chainMarked
	// clears it).
	classify = append(classify,
		rule(iif(tun), ctState(expr.CtStateBitNEW), ctMarkMasked(cfg.IDMask), one(eq(native(0))),
			one(loadMeta(expr.MetaKeyMARK), and32(cfg.IDMask), neq(native(0)),
				&expr.Objref{Type: int(nftables.ObjTypeCounter), Name: counterPeerPod},
				loadMeta(expr.MetaKeyMARK),
				&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: native(cfg.IDMask), Xor: native(cfg.FromTunnel)},
				&expr.Ct{Key: expr.CtKeyMARK, Register: 1, SourceRegister: true})))
	classify = append(classify, rule(iif(tun), ctState(expr.CtStateBitNEW), ctMarkMasked(cfg.IDMask), one(eq(native(0)),
		&expr.Objref{Type: int(nftables.ObjTypeCounter), Name: counterUnknown}, verdict(expr.VerdictDrop, ""))))
	for _, f := range families {
		classify = append(classify, rule(notIif(tun), nfproto(f.nfproto), ctState(expr.CtStateBitNEW), ctDir(dirOriginal),
			one(payload(f.daddrOff, f.addrLen), b.lookup(setCluster+f.suffix, true),
				payload(f.saddrOff, f.addrLen), b.mapTo(mapLocal+f.suffix), &expr.Ct{Key: expr.CtKeyMARK, Register: 1, SourceRegister: true})))
		classify = append(classify, rule(notIif(tun), nfproto(f.nfproto), ctState(expr.CtStateBitNEW), ctDir(dirOriginal),
			one(payload(f.daddrOff, f.addrLen), b.lookup(setCluster+f.suffix, true)), b.splitLookup(mapLocalSplit, f)))
	}
	// Egresses with several IPs: a new connection of a local member
	// takes one of the usable IPs' marks (multi.go).
	classify = append(classify, b.pickRules(plans)...)
	classify = append(classify, rule(one(verdict(expr.VerdictGoto, chainMarked))))
	return classify
}

// markedRules builds the chain marked, the end of classify for every
// packet: clear the hint of tunnelled packets, then carry a marked flow's
// ID (and, for replies, FromTunnel) into the packet mark.
func (b *builder) markedRules() []Rule {
	cfg := b.cfg
	both := cfg.IDMask | cfg.FromTunnel
	return []Rule{
		// The hint never reaches routing.
		rule(iif(cfg.TunnelDevice), one(loadMeta(expr.MetaKeyMARK), and32(^cfg.IDMask), &expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1})),
		rule(ctMarkMasked(both), one(eq(native(0)), verdict(expr.VerdictReturn, ""))),
		// Every original-direction packet of a marked flow, tunnelled ones
		// included, carries its Egress's ID into routing: on the egress
		// Node the pool routing rules (package poolroute) choose the
		// egress IP's own link by it; elsewhere no rule matches the ID of
		// an Egress held here, and the main table decides as before. A
		// packet nobody else marked takes the ID in one assignment; one
		// that carries another program's mark bits keeps them, through
		// set-mark.
		rule(ctDir(dirOriginal), one(loadMeta(expr.MetaKeyMARK), eq(native(0)),
			&expr.Ct{Key: expr.CtKeyMARK, Register: 1}, and32(cfg.IDMask),
			&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1}, verdict(expr.VerdictReturn, ""))),
		rule(ctDir(dirOriginal), one(verdict(expr.VerdictJump, chainSetMark))),
		rule(ctDir(dirReply), ctMarkMasked(cfg.FromTunnel), one(neq(native(0))), orMetaMark(cfg.FromTunnel)),
	}
}

// setMarkRules builds the chain set-mark, which copies the ID bits of the
// connection mark into the packet mark one bit at a time: nft can OR only
// constants into a register.
func (b *builder) setMarkRules() []Rule {
	cfg := b.cfg
	var setMark []Rule
	for bit := uint32(1); bit != 0; bit <<= 1 {
		if cfg.IDMask&bit != 0 {
			setMark = append(setMark, rule(ctMarkMasked(bit), one(neq(native(0))), orMetaMark(bit)))
		}
	}
	return setMark
}

// forwardRules builds the chain forward: clear our packet-mark bits first,
// reject failed Egresses' traffic, clamp MSS of SYNs entering the tunnel.
// Only connections we marked are touched: every packet that enters the
// tunnel or is rejected belongs to one, and other software's packet marks
// on other traffic stay as they are.
func (b *builder) forwardRules() []Rule {
	cfg := b.cfg
	tun := cfg.TunnelDevice
	both := cfg.IDMask | cfg.FromTunnel
	forward := []Rule{
		rule(ctMarkMasked(both), one(eq(native(0)), verdict(expr.VerdictReturn, ""))),
		rule(one(loadMeta(expr.MetaKeyMARK), and32(^both), &expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1})),
		rule(ctDir(dirOriginal), ctMarkMasked(cfg.IDMask), one(b.lookup(setFailed, false), verdict(expr.VerdictJump, chainReject))),
		rule(oif(tun), l4proto(unix.IPPROTO_TCP), one(
			&expr.Payload{OperationType: expr.PayloadLoad, DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 13, Len: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 1, Mask: []byte{0x06}, Xor: []byte{0}},
			eq([]byte{0x02}),
			&expr.Rt{Register: 1, Key: expr.RtTCPMSS},
			&expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Len: 2, Size: 2},
			&expr.Exthdr{SourceRegister: 1, Op: expr.ExthdrOpTcpopt, Type: 2, Offset: 2, Len: 2})),
	}
	return forward
}

// rejectRules builds the chain reject and lists the per-Egress counters its
// rules use: count per Egress, then answer with an ICMP error that reads
// EHOSTUNREACH: IPv4 "communication administratively prohibited" (type 3
// code 13, RFC 1812 5.2.7.1), a hard error even for connected UDP sockets;
// IPv6 "address unreachable" (type 1 code 3, RFC 4443; ICMPv6's
// administratively-prohibited would read EACCES).
func (b *builder) rejectRules(plans []egressPlan) (reject []Rule, counters []string) {
	cfg := b.cfg
	for _, e := range plans {
		if e.role != RoleFailed {
			continue
		}
		name := rejectedPrefix + strconv.Itoa(int(e.id))
		counters = append(counters, name)
		reject = append(reject, rule(ctMarkMasked(cfg.IDMask), one(eq(native(cfg.Mark(e.id))),
			&expr.Objref{Type: int(nftables.ObjTypeCounter), Name: name})))
	}
	reject = append(reject,
		// A TCP segment that is not a SYN belongs to a connection opened
		// before the Egress was rejected here (its conntrack entry was
		// cleaned and the flow picked up again): a RST ends it at once
		// (ECONNRESET) where an ICMP error would only be a soft error that
		// leaves the application waiting for TCP's retransmission timeout.
		rule(l4proto(unix.IPPROTO_TCP),
			one(&expr.Payload{OperationType: expr.PayloadLoad, DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 13, Len: 1},
				&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 1, Mask: []byte{0x02}, Xor: []byte{0}},
				eq([]byte{0x00}),
				&expr.Reject{Type: unix.NFT_REJECT_TCP_RST})),
		rule(nfproto(unix.NFPROTO_IPV4), one(&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: icmpPktFiltered})),
		rule(one(&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_HOST_UNREACH})))
	return reject, counters
}

// rejectQueueRules builds the chain reject-queue, empty when the round trip
// is off (Config.queueExpr nil). reject-queue is a base chain just before
// forward: the SYN of a connection forward will reject first goes to the
// netfilter queue that ServeRejectQueue reads, which sends it back
// (NF_REPEAT) with FromTunnel set in the packet mark, a bit no
// original-direction packet otherwise carries at this point; the repeated
// pass lets it through to forward, whose rejection then runs in
// ServeRejectQueue's system call rather than inside the Pod's connect().
// bypass: with no reader the packet goes straight on to forward and is
// rejected there.
func (b *builder) rejectQueueRules() []Rule {
	cfg := b.cfg
	var rejectQueue []Rule
	if q := cfg.queueExpr(); q != nil {
		rejectQueue = append(rejectQueue, rule(ctDir(dirOriginal), l4proto(unix.IPPROTO_TCP),
			one(&expr.Payload{OperationType: expr.PayloadLoad, DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 13, Len: 1},
				&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 1, Mask: []byte{0x17}, Xor: []byte{0}},
				eq([]byte{0x02})), // SYN without ACK, RST or FIN
			one(loadMeta(expr.MetaKeyMARK), and32(cfg.FromTunnel), eq(native(0))),
			ctMarkMasked(cfg.IDMask),
			one(b.lookup(setFailed, false), q)))
	}
	return rejectQueue
}

// snatRules builds the chain snat, ahead of any CNI masquerade (nf_nat
// stops at the first binding): identity SNAT into the tunnel, egress-IP
// SNAT out of it.
func (b *builder) snatRules() []Rule {
	cfg := b.cfg
	tun := cfg.TunnelDevice
	snat := make([]Rule, 0, 2*len(families))
	for _, f := range families {
		snat = append(snat, rule(oif(tun), nfproto(f.nfproto), ctMarkMasked(cfg.IDMask), one(neq(native(0)),
			payload(f.saddrOff, f.addrLen), &expr.NAT{Type: expr.NATTypeSourceNAT, Family: f.natFam, RegAddrMin: 1})))
	}
	for _, f := range families {
		snat = append(snat, rule(nfproto(f.nfproto), ctMarkMasked(cfg.IDMask), one(b.mapTo(mapSNAT+f.suffix), &expr.NAT{Type: expr.NATTypeSourceNAT, Family: f.natFam, RegAddrMin: 1})))
	}
	return snat
}

// inputRules builds the chain input: tunnel packets only from Nodes; egress
// IPs accept no new inbound connections and answer nothing (drop, never
// RST).
func (b *builder) inputRules() []Rule {
	cfg := b.cfg
	input := make([]Rule, 0, 2*len(families))
	for _, f := range families {
		input = append(input, rule(nfproto(f.nfproto), udpDport(cfg.TunnelPort), one(payload(f.saddrOff, f.addrLen), b.lookup(setNodes+f.suffix, true),
			&expr.Objref{Type: int(nftables.ObjTypeCounter), Name: counterSpoofed}, verdict(expr.VerdictDrop, ""))))
	}
	// The hint for a member the slice has not named yet: a tunnel packet
	// (from a Node, checked above) to an egress IP held here whose inner
	// source lies in the sending Node's Pod CIDR gets that Egress's ID in
	// its packet mark; classify reads it after decapsulation.
	for i, f := range families {
		next := byte(1 + i) // GPE next protocol: 1 IPv4, 2 IPv6
		reg2 := 8 + f.addrLen/4
		for _, l := range b.peerLens[f.suffix] {
			input = append(input, rule(nfproto(f.nfproto), udpDport(cfg.TunnelPort),
				one(&expr.Payload{OperationType: expr.PayloadLoad, DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: gpeNextOff, Len: 1}, eq([]byte{next})),
				one(&expr.Payload{OperationType: expr.PayloadLoad, DestRegister: 8, Base: expr.PayloadBaseNetworkHeader, Offset: f.saddrOff, Len: f.addrLen},
					&expr.Payload{OperationType: expr.PayloadLoad, DestRegister: reg2, Base: expr.PayloadBaseTransportHeader, Offset: gpeOff + f.saddrOff, Len: f.addrLen},
					&expr.Bitwise{SourceRegister: reg2, DestRegister: reg2, Len: f.addrLen, Mask: prefixMask(l, f.addrLen), Xor: make([]byte, f.addrLen)},
					&expr.Lookup{SourceRegister: 8, SetName: setPeerPods + f.suffix + "-" + strconv.Itoa(l), SetID: b.set(setPeerPods + f.suffix + "-" + strconv.Itoa(l)).ID},
					payload(f.daddrOff, f.addrLen), b.mapTo(mapEIPID+f.suffix),
					&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1})))
		}
	}
	for _, f := range families {
		input = append(input, rule(nfproto(f.nfproto), one(payload(f.daddrOff, f.addrLen), b.lookup(setEIPs+f.suffix, false), verdict(expr.VerdictJump, chainEIPGuard))))
	}
	return input
}

// eipGuardRules builds the chain eip-guard, which input jumps to for
// packets to an egress IP held here.
func (b *builder) eipGuardRules() []Rule {
	cfg := b.cfg
	return []Rule{
		rule(ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), one(verdict(expr.VerdictAccept, ""))),
		rule(udpDport(cfg.TunnelPort), one(verdict(expr.VerdictAccept, ""))),
		rule(l4proto(unix.IPPROTO_ICMP), one(verdict(expr.VerdictAccept, ""))),
		rule(l4proto(unix.IPPROTO_ICMPV6), one(verdict(expr.VerdictAccept, ""))),
		rule(one(&expr.Objref{Type: int(nftables.ObjTypeCounter), Name: counterEIPDrop}, verdict(expr.VerdictDrop, ""))),
	}
}

// sourceGuard builds the source guard (issue 23, fault 4): no packet
// leaves the Node with an egress IPv6 address held here as its source
// unless an exception of eip-source allows it. Egress IPv6 addresses are
// bound deprecated, which RFC 6724 rule 3 ranks below the Node's own
// preferred address, but while that address is tentative (duplicate
// address detection after it was added again, about a second; RFC 4862
// section 5.4) it is no candidate at all, and the kernel's source
// selection then takes the egress IP for host traffic and for the CNI's
// masquerade. IPv4 needs no guard: its egress IPs are bound with scope
// host, which source selection never takes for a routed destination.
//
// Exceptions (accept in eip-source): packets delivered on this Node
// (oif lo); reply-direction packets, whose source is the address their
// connection was opened to (echo replies, errors about packets sent to
// the egress IP); Neighbor Solicitations and Advertisements (the
// address answers and announces itself, RFC 4861); tunnel packets to a
// Node or egress IP (the outer source of the return path may be any
// local address; peers accept egress IPs as outer sources); and flows
// whose connection mark carries the ID of an Egress that holds that very
// address here (members' flows SNATed to it, set snatsrc6).
//
// Everything else is counted (counter eip-source) and stopped. In
// output, where the packet is the Node's own, it is rejected so that the
// application learns at once instead of retransmitting from an address
// that stays wrong for its socket: TCP with a reset (ECONNREFUSED), the
// rest with ICMPv6 "source address failed ingress/egress policy"
// (EACCES). In postrouting, after the NAT hooks at srcnat (priority 100)
// have rewritten the source (a masquerade that picked the egress IP),
// it is dropped: the kernel rejects nowhere in postrouting, and the
// dropped packet's conntrack entry is never confirmed, so the next
// packet (a retransmitted SYN) is masqueraded afresh.
func (b *builder) sourceGuard() (eipSource, out, post []Rule) {
	f := families[1]
	accept := one(verdict(expr.VerdictAccept, ""))
	icmpType := func(t byte) []expr.Any {
		return one(&expr.Payload{OperationType: expr.PayloadLoad, DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1}, eq([]byte{t}))
	}
	s := b.set(setSNATSrc6)
	eipSource = []Rule{
		rule(oif("lo"), accept),
		rule(ctDir(dirReply), accept),
		rule(l4proto(unix.IPPROTO_ICMPV6), icmpType(icmp6NeighSolicit), accept),
		rule(l4proto(unix.IPPROTO_ICMPV6), icmpType(icmp6NeighAdvert), accept),
		rule(udpDport(b.cfg.TunnelPort), one(payload(f.daddrOff, f.addrLen), b.lookup(setNodes+f.suffix, false)), accept),
		// ct mark & ID mask . ip6 saddr @snatsrc6: the mark in register
		// 8, the address in 9-12 (a concatenation's layout).
		rule(one(&expr.Ct{Key: expr.CtKeyMARK, Register: 8},
			&expr.Bitwise{SourceRegister: 8, DestRegister: 8, Len: 4, Mask: native(b.cfg.IDMask), Xor: native(0)},
			&expr.Payload{OperationType: expr.PayloadLoad, DestRegister: 9, Base: expr.PayloadBaseNetworkHeader, Offset: f.saddrOff, Len: f.addrLen},
			&expr.Lookup{SourceRegister: 8, SetName: s.Name, SetID: s.ID}), accept),
	}
	held := func() []expr.Any {
		return rule(nfproto(f.nfproto), one(payload(f.saddrOff, f.addrLen), b.lookup(setEIPs+f.suffix, false)))
	}
	count := one(&expr.Objref{Type: int(nftables.ObjTypeCounter), Name: counterEIPSource})
	out = []Rule{
		rule(held(), one(verdict(expr.VerdictJump, chainEIPSource))),
		// Counted here, once: a TCP segment is reset, any other packet
		// falls through to the next rule.
		rule(held(), count, l4proto(unix.IPPROTO_TCP), one(&expr.Reject{Type: unix.NFT_REJECT_TCP_RST})),
		rule(held(), one(&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: icmp6PolicyFail})),
	}
	post = []Rule{
		rule(held(), one(verdict(expr.VerdictJump, chainEIPSource))),
		rule(held(), count, one(verdict(expr.VerdictDrop, ""))),
	}
	return eipSource, out, post
}

// clusterPrefixes lists the destinations of family f that never take an
// egress path: cluster CIDRs, Node IPs, every egress IP, loopback,
// link-local and multicast.
func clusterPrefixes(f famSpec, st State) []netip.Prefix {
	var ps []netip.Prefix
	host := func(a netip.Addr) netip.Prefix { a = a.Unmap(); return netip.PrefixFrom(a, a.BitLen()) }
	for _, p := range st.ClusterCIDRs {
		if p.IsValid() && f.owns(p.Addr()) {
			ps = append(ps, netip.PrefixFrom(p.Addr().Unmap(), p.Bits()).Masked())
		}
	}
	for _, a := range st.NodeIPs {
		if f.owns(a) {
			ps = append(ps, host(a))
		}
	}
	for _, e := range st.Egresses {
		for _, ip := range allIPs(e) {
			if f.owns(ip) {
				ps = append(ps, host(ip))
			}
		}
	}
	if f.v6 {
		ps = append(ps, netip.MustParsePrefix("::1/128"), netip.MustParsePrefix("fe80::/10"), netip.MustParsePrefix("ff00::/8"))
	} else {
		ps = append(ps, netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("169.254.0.0/16"), netip.MustParsePrefix("224.0.0.0/4"))
	}
	return ps
}

// intervalElements turns prefixes into the elements of an nft interval set:
// merged, sorted, each range as a start element and an exclusive end
// element flagged IntervalEnd (omitted when the range reaches the top of
// the address space), the encoding nft(8) uses.
func intervalElements(f famSpec, ps []netip.Prefix) []nftables.SetElement {
	type rng struct{ lo, hi *big.Int } // [lo, hi)
	toInt := func(a netip.Addr) *big.Int { return new(big.Int).SetBytes(f.addr(a)) }
	rs := make([]rng, 0, len(ps))
	for _, p := range ps {
		lo := toInt(p.Masked().Addr())
		size := new(big.Int).Lsh(big.NewInt(1), uint(p.Addr().BitLen()-p.Bits()))
		rs = append(rs, rng{lo, new(big.Int).Add(lo, size)})
	}
	slices.SortFunc(rs, func(a, b rng) int { return cmp.Or(a.lo.Cmp(b.lo), a.hi.Cmp(b.hi)) })
	var merged []rng
	for _, r := range rs {
		if n := len(merged); n > 0 && r.lo.Cmp(merged[n-1].hi) <= 0 {
			if r.hi.Cmp(merged[n-1].hi) > 0 {
				merged[n-1].hi = r.hi
			}
			continue
		}
		merged = append(merged, r)
	}
	top := new(big.Int).Lsh(big.NewInt(1), uint(f.addrLen*8))
	bytesOf := func(x *big.Int) []byte { return x.FillBytes(make([]byte, f.addrLen)) }
	var out []nftables.SetElement
	for _, r := range merged {
		out = append(out, nftables.SetElement{Key: bytesOf(r.lo)})
		if r.hi.Cmp(top) < 0 {
			out = append(out, nftables.SetElement{Key: bytesOf(r.hi), IntervalEnd: true})
		}
	}
	return out
}

// prefixMask is the network mask of a /bits prefix in n bytes.
func prefixMask(bits int, n uint32) []byte {
	m := make([]byte, n)
	for i := range m {
		switch {
		case bits >= 8:
			m[i], bits = 0xff, bits-8
		case bits > 0:
			m[i], bits = byte(0xff<<(8-bits)), 0
		}
	}
	return m
}

// markOf decodes a mark element key.
func markOf(b []byte) (uint32, error) {
	if len(b) != 4 {
		return 0, fmt.Errorf("mark of %d bytes", len(b))
	}
	return binary.NativeEndian.Uint32(b), nil
}

// membersOf decodes the member maps (local and remote, both families) of
// a ruleset or of a table read back from the kernel: member IP -> the
// connection-mark bits the classify chain gives its new flows. Elements
// that do not decode are skipped.
func membersOf(sets []SetContent) map[netip.Addr]uint32 {
	out := map[netip.Addr]uint32{}
	for _, sc := range sets {
		for _, f := range families {
			if sc.Set.Name != mapLocal+f.suffix && sc.Set.Name != mapRemote+f.suffix {
				continue
			}
			for _, e := range sc.Elements {
				ip, ok := netip.AddrFromSlice(e.Key)
				mark, err := markOf(e.Val)
				if ok && err == nil && len(e.Key) == int(f.addrLen) {
					out[ip.Unmap()] = mark
				}
			}
		}
	}
	return out
}
