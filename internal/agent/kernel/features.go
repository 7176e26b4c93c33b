// Package kernel probes, when the agent starts, the Linux kernel features
// the agent relies on, and decides from what it found which parts of the
// agent run, which run degraded and which do not start.
//
// The package has two halves. Decide (this file) is pure: features found ->
// a Decision with the parts refused or degraded and the messages for the
// log, the metric and the Node condition. Probe (probe.go) asks the real
// kernel, one small create-and-delete at a time, in the Node's network
// namespace, leaving nothing behind. docs/agent.md has the table of
// features, the first kernel with each and what happens without it; Specs
// is that table in code, and the two must agree.
package kernel

import (
	"fmt"
	"slices"
	"strings"
)

// Feature names one kernel capability the agent uses. The names are the
// values of the "feature" label of egressip_agent_kernel_feature and appear
// in the Node condition's message.
type Feature string

// The probed features.
const (
	// VXLANGPE: a flow-based ("external", IFLA_VXLAN_COLLECT_METADATA)
	// VXLAN device with the Generic Protocol Extension (IFLA_VXLAN_GPE),
	// the datapath's tunnel device.
	VXLANGPE Feature = "vxlan-gpe"
	// EncapRouteIPv4 and EncapRouteIPv6: routes carrying tunnel metadata
	// (lightweight tunnels, `encap ip` / `encap ip6`; LWTUNNEL_ENCAP_IP and
	// LWTUNNEL_ENCAP_IP6), which steer traffic into the flow-based device.
	EncapRouteIPv4 Feature = "encap-route-ipv4"
	EncapRouteIPv6 Feature = "encap-route-ipv6"
	// NftInetNAT: a nat chain in an nftables table of family inet, where
	// the datapath's SNAT lives.
	NftInetNAT Feature = "nft-inet-nat"
	// NftNamedCounter: named counter objects and the objref expression
	// (per-Egress reject and drop counts).
	NftNamedCounter Feature = "nft-named-counter"
	// NftTCPMSS: the rt expression's tcpmss key and writing a TCP option
	// with the exthdr expression (MSS clamping of SYNs into the tunnel).
	NftTCPMSS Feature = "nft-tcpmss"
	// NftSets: interval sets and maps (the datapath's CIDR sets and its
	// address-to-mark and mark-to-address maps).
	NftSets Feature = "nft-sets"
	// NFQueue: the nftables queue expression, or xtables' NFQUEUE target
	// through nft_compat, with the netfilter queue netlink interface (the
	// reject queue; probed by the datapath itself, see
	// datapath.Datapath.RejectQueueForm).
	NFQueue Feature = "nfqueue"
	// SysctlAddrGenMode: net.ipv6.conf.<dev>.addr_gen_mode can be written
	// (the tunnel device gets no IPv6 link-local address).
	SysctlAddrGenMode Feature = "sysctl-ipv6-addr-gen-mode"
	// SysctlRPFilter: net.ipv4.conf.<dev>.rp_filter can be written (loose
	// reverse-path filtering on the tunnel device).
	SysctlRPFilter Feature = "sysctl-ipv4-rp-filter"
	// IFAProto: the kernel keeps the address protocol attribute IFA_PROTO
	// that marks the addresses egressip bound. The bind package verifies
	// it on its own on the first bind; this probe's result is informative.
	IFAProto Feature = "ifa-proto"
)

// Part is a part of the agent that depends on kernel features.
type Part string

// The parts.
const (
	// PartDatapath is the datapath (--datapath): tunnel, nftables table and
	// policy routing.
	PartDatapath Part = "datapath"
	// PartRejectQueue is the reject queue of the datapath (round trip of
	// rejected SYNs through the agent).
	PartRejectQueue Part = "reject-queue"
	// PartOwnership is how the agent marks the addresses it owns.
	PartOwnership Part = "address-ownership"
)

// Effect is what a missing feature does to its Part.
type Effect string

// The effects.
const (
	// Refuse: the part does not start.
	Refuse Effect = "refused"
	// Degrade: the part runs in its degraded mode.
	Degrade Effect = "degraded"
)

// Spec is one row of the feature table.
type Spec struct {
	Feature Feature
	Part    Part
	// Effect is what happens to Part without the feature.
	Effect Effect
	// Without says, for users, what happens without the feature.
	Without string
}

// Specs is the feature table, in probe order (docs/agent.md shows it with
// the kernel versions).
var Specs = []Spec{
	{VXLANGPE, PartDatapath, Refuse, "the datapath does not start: no tunnel device"},
	{EncapRouteIPv4, PartDatapath, Refuse, "the datapath does not start: no IPv4 routes into the tunnel"},
	{EncapRouteIPv6, PartDatapath, Refuse, "the datapath does not start: no IPv6 routes into the tunnel"},
	{NftInetNAT, PartDatapath, Refuse, "the datapath does not start: its SNAT chain cannot be created"},
	{NftNamedCounter, PartDatapath, Refuse, "the datapath does not start: its counters cannot be created"},
	{NftTCPMSS, PartDatapath, Refuse, "the datapath does not start: MSS clamping into the tunnel cannot be programmed"},
	{NftSets, PartDatapath, Refuse, "the datapath does not start: its sets and maps cannot be created"},
	{SysctlAddrGenMode, PartDatapath, Refuse, "the datapath does not start: the tunnel device cannot be configured"},
	{SysctlRPFilter, PartDatapath, Refuse, "the datapath does not start: the tunnel device cannot be configured"},
	{NFQueue, PartRejectQueue, Degrade, "connections that failurePolicy Fail rejects are rejected synchronously (IPv6 TCP connects then fail after about 1 s, on the retransmitted SYN)"},
	{IFAProto, PartOwnership, Degrade, "addresses are not marked with IFA_PROTO; ownership falls back to the agent's own record"},
}

// SpecOf returns the Spec of f and whether f is in Specs.
func SpecOf(f Feature) (Spec, bool) {
	i := slices.IndexFunc(Specs, func(s Spec) bool { return s.Feature == f })
	if i < 0 {
		return Spec{}, false
	}
	return Specs[i], true
}

// Missing is one feature found missing.
type Missing struct {
	Spec
	// Detail is what the probe saw (the kernel's error).
	Detail string
}

// Message is the sentence logged for m, naming the feature, the kernel
// release and the consequence.
func (m Missing) Message(release string) string {
	return fmt.Sprintf("kernel %s lacks %s (%s): %s", release, m.Feature, m.Detail, m.Without)
}

// Decision is what runs, given the features found.
type Decision struct {
	// Release is the kernel release (uname -r).
	Release string
	// Probed lists the features probed, in Specs order.
	Probed []Feature
	// Missing lists the probed features found missing, in Specs order.
	Missing []Missing
}

// Decide turns probe results into a Decision. results maps each probed
// feature to nil (present) or the error that shows it missing; features
// not in results were not probed (their part is off) and count as neither.
// Features not in Specs are ignored.
func Decide(release string, results map[Feature]error) Decision {
	d := Decision{Release: release}
	for _, s := range Specs {
		err, probed := results[s.Feature]
		if !probed {
			continue
		}
		d.Probed = append(d.Probed, s.Feature)
		if err != nil {
			d.Missing = append(d.Missing, Missing{Spec: s, Detail: err.Error()})
		}
	}
	return d
}

// Present reports whether f was probed and found.
func (d Decision) Present(f Feature) bool {
	return slices.Contains(d.Probed, f) && !slices.ContainsFunc(d.Missing, func(m Missing) bool { return m.Feature == f })
}

// Refused reports whether part p must not start.
func (d Decision) Refused(p Part) bool {
	return slices.ContainsFunc(d.Missing, func(m Missing) bool { return m.Part == p && m.Effect == Refuse })
}

// Degraded reports whether part p runs in its degraded mode (and is not
// refused).
func (d Decision) Degraded(p Part) bool {
	return !d.Refused(p) && slices.ContainsFunc(d.Missing, func(m Missing) bool { return m.Part == p && m.Effect == Degrade })
}

// MaxConditionMessage bounds ConditionMessage, in bytes (the same bound as
// the datapath condition's, report.MaxDatapathMessage).
const MaxConditionMessage = 1024

// ConditionMessage is the Node condition's message: the kernel release,
// then per affected part whether it is refused or degraded and the missing
// features with what the probe saw. With nothing missing it says how many
// features were found. At most MaxConditionMessage bytes.
func (d Decision) ConditionMessage() string {
	if len(d.Missing) == 0 {
		return fmt.Sprintf("kernel %s has every feature probed (%d)", d.Release, len(d.Probed))
	}
	var parts []string
	var order []Part
	byPart := map[Part][]string{}
	for _, m := range d.Missing {
		if _, seen := byPart[m.Part]; !seen {
			order = append(order, m.Part)
		}
		byPart[m.Part] = append(byPart[m.Part], fmt.Sprintf("%s (%s)", m.Feature, m.Detail))
	}
	for _, p := range order {
		state := "degraded"
		if d.Refused(p) {
			state = "not started"
		}
		parts = append(parts, fmt.Sprintf("%s %s, missing %s", p, state, strings.Join(byPart[p], ", ")))
	}
	msg := fmt.Sprintf("kernel %s: %s", d.Release, strings.Join(parts, "; "))
	if len(msg) > MaxConditionMessage {
		msg = msg[:MaxConditionMessage-3] + "..."
	}
	return msg
}
