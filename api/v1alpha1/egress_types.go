/*
Copyright 2026 The egressip Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Condition types of an Egress, in the order they turn True.
const (
	// ConditionIPAllocated is True when the Egress has an address from its
	// pool (allocated, or the user-named egressIP accepted).
	ConditionIPAllocated = "IPAllocated"
	// ConditionAssigned is True when the scheduling pass has placed the
	// Egress's address on an egress Node (status.egressNode).
	ConditionAssigned = "Assigned"
	// ConditionReady is True when the agent of the egress Node reports the
	// address bound and announced. On an ExternalIPPool, Ready is True when
	// the pool is valid and usable.
	ConditionReady = "Ready"
	// ConditionSelectorValid is False, with the parse error, while
	// spec.appliedTo holds a selector that cannot be parsed (such an Egress
	// selects no Pod); the condition is absent when the selectors are
	// valid. Admission rejects such selectors (CEL, and the webhook when
	// enabled); the condition covers objects admitted before.
	ConditionSelectorValid = "SelectorValid"
	// ConditionConflict is True while the agent of the egress Node reports
	// that another host answers ARP (IPv4) or Neighbor Solicitations (IPv6)
	// for the egress IP on its link (reason ReasonDuplicateIP; the message
	// names the other MACs and, when a MAC is another Node's, that Node).
	// It turns False (ReasonNoConflict) when a probe round of the agent no
	// longer sees the other host, and is absent on Egresses that never had
	// a conflict. The Egress keeps its Node meanwhile.
	ConditionConflict = "Conflict"
)

// EgressNodeField is the field path of the egress Node, selectable in list
// and watch requests (a field selector such as status.egressNode=worker-3).
// The agent does not select by it (the Nodes of an Egress with spec.ips are
// in status.ips, which no field selector reaches; see internal/agent's
// HolderIndex); tools may list by it.
const EgressNodeField = "status.egressNode"

// AppliedTo selects the Pods whose outbound traffic uses an Egress. At least
// one selector must be given; an empty selector ({}) matches everything.
//
// +kubebuilder:validation:XValidation:rule="has(self.namespaceSelector) || has(self.podSelector)",message="appliedTo needs a namespaceSelector, a podSelector, or both"
type AppliedTo struct {
	// NamespaceSelector selects namespaces; absent means all namespaces.
	// At most 64 matchLabels and 32 matchExpressions.
	// +optional
	// +kubebuilder:validation:XValidation:rule="!has(self.matchLabels) || size(self.matchLabels) <= 64",message="namespaceSelector.matchLabels may have at most 64 entries"
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || size(self.matchExpressions) <= 32",message="namespaceSelector.matchExpressions may have at most 32 entries"
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || size(self.matchExpressions) > 32 || self.matchExpressions.all(e, e.operator in ['In', 'NotIn', 'Exists', 'DoesNotExist'])",message="namespaceSelector.matchExpressions: operator must be In, NotIn, Exists or DoesNotExist"
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || size(self.matchExpressions) > 32 || self.matchExpressions.all(e, !(e.operator in ['In', 'NotIn']) || (has(e.values) && size(e.values) > 0))",message="namespaceSelector.matchExpressions: In and NotIn need at least one value"
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || size(self.matchExpressions) > 32 || self.matchExpressions.all(e, !(e.operator in ['Exists', 'DoesNotExist']) || !has(e.values) || size(e.values) == 0)",message="namespaceSelector.matchExpressions: Exists and DoesNotExist take no values"
	// +kubebuilder:validation:XValidation:rule="!has(self.matchLabels) || size(self.matchLabels) > 64 || self.matchLabels.all(k, !format.qualifiedName().validate(k).hasValue())",message="namespaceSelector.matchLabels: label keys are an optional DNS subdomain prefix and '/', then a name of at most 63 characters: letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`

	// PodSelector selects Pods within the selected namespaces; absent means
	// all Pods. At most 64 matchLabels and 32 matchExpressions.
	// +optional
	// +kubebuilder:validation:XValidation:rule="!has(self.matchLabels) || size(self.matchLabels) <= 64",message="podSelector.matchLabels may have at most 64 entries"
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || size(self.matchExpressions) <= 32",message="podSelector.matchExpressions may have at most 32 entries"
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || size(self.matchExpressions) > 32 || self.matchExpressions.all(e, e.operator in ['In', 'NotIn', 'Exists', 'DoesNotExist'])",message="podSelector.matchExpressions: operator must be In, NotIn, Exists or DoesNotExist"
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || size(self.matchExpressions) > 32 || self.matchExpressions.all(e, !(e.operator in ['In', 'NotIn']) || (has(e.values) && size(e.values) > 0))",message="podSelector.matchExpressions: In and NotIn need at least one value"
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || size(self.matchExpressions) > 32 || self.matchExpressions.all(e, !(e.operator in ['Exists', 'DoesNotExist']) || !has(e.values) || size(e.values) == 0)",message="podSelector.matchExpressions: Exists and DoesNotExist take no values"
	// +kubebuilder:validation:XValidation:rule="!has(self.matchLabels) || size(self.matchLabels) > 64 || self.matchLabels.all(k, !format.qualifiedName().validate(k).hasValue())",message="podSelector.matchLabels: label keys are an optional DNS subdomain prefix and '/', then a name of at most 63 characters: letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
	PodSelector *metav1.LabelSelector `json:"podSelector,omitempty"`
}

// MaxEgressIPs is the most IPs one Egress may ask for in spec.ips, summed
// over its entries (each entry's count). Eight covers one IP per zone in
// every cloud region and keeps a source Node's per-Egress nftables map
// small; it is a cap of the API (CEL), not of the scheduler.
const MaxEgressIPs = 8

// EgressIPAddress is one named egress address, written like spec.egressIP:
// canonical form, global unicast, no zone.
// +kubebuilder:validation:MinLength=2
// +kubebuilder:validation:MaxLength=39
// +kubebuilder:validation:XValidation:rule="isIP(self)",message="ips[].addresses must be IPv4 or IPv6 addresses such as 192.0.2.5 (no zone, no IPv4-mapped IPv6, no leading zeros)"
// +kubebuilder:validation:XValidation:rule="!isIP(self) || ip.isCanonical(self)",message="ips[].addresses must be written in canonical form (RFC 5952 for IPv6, as in 2001:db8::5)"
// +kubebuilder:validation:XValidation:rule="!isIP(self) || ip(self).isGlobalUnicast()",message="ips[].addresses must be unicast addresses (not loopback, link-local, multicast or unspecified)"
type EgressIPAddress string

// EgressIPSource is one entry of spec.ips: Count IPs from one pool,
// optionally held only by the pool's Nodes of one zone, some or all of them
// named.
//
// +kubebuilder:validation:XValidation:rule="!has(self.count) || !has(self.addresses) || self.count >= size(self.addresses)",message="ips[].count must be at least the number of ips[].addresses (the named addresses count towards it)"
type EgressIPSource struct {
	// Pool is the name of the ExternalIPPool the addresses come from (an
	// RFC 1123 subdomain, at most 253 characters).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="!format.dns1123Subdomain().validate(self).hasValue()",message="ips[].pool must be the name of an ExternalIPPool: lower case letters, digits, '-' and '.', at most 253 characters"
	Pool string `json:"pool"`

	// Count is how many IPs this entry asks for, each on its own Node:
	// 1 to MaxEgressIPs (8), and at least len(addresses). Absent: the
	// number of addresses, or 1 when none is named.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=8
	Count *int32 `json:"count,omitempty"`

	// Addresses names some or all of this entry's IPs (the controller
	// allocates the others, lowest free first), each in canonical form and
	// inside the pool. Named addresses are exclusive to this Egress: an
	// address named by two Egresses is a conflict (the younger one's IP is
	// not allocated), unlike spec.egressIP, which single-IP Egresses share.
	// At most 8, no repeats.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=8
	Addresses []EgressIPAddress `json:"addresses,omitempty"`

	// Zone, when set, keeps this entry's IPs on the pool's Nodes whose
	// topology.kubernetes.io/zone label has this value (a label value: at
	// most 63 characters). Absent: any Node of the pool. A zone that no
	// Node carries is accepted with a warning (Nodes may join later); its
	// IPs stay unplaced (NoEligibleNode) meanwhile.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="!format.labelValue().validate(self).hasValue()",message="ips[].zone must be a label value: at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
	Zone string `json:"zone,omitempty"`
}

// EgressSpec is what the user asks for: which Pods, which pool, and
// optionally which address.
//
// An Egress has one IP (externalIPPool, optionally egressIP: the form every
// Egress had before spec.ips) or several (ips); exactly one of
// externalIPPool and ips is given.
//
// +kubebuilder:validation:XValidation:rule="has(self.externalIPPool) != has(self.ips)",message="give exactly one of externalIPPool (one IP) and ips (several IPs)"
// +kubebuilder:validation:XValidation:rule="!has(self.egressIP) || has(self.externalIPPool)",message="egressIP goes with externalIPPool; with ips, name addresses in ips[].addresses"
// +kubebuilder:validation:XValidation:rule="!has(self.ips) || size(self.ips) > 8 || self.ips.map(e, has(e.count) ? e.count : (has(e.addresses) ? size(e.addresses) : 1)).sum() <= 8",message="ips asks for more than 8 IPs in all (the sum of ips[].count)"
// +kubebuilder:validation:XValidation:rule="!has(self.ips) || size(self.ips) > 8 || self.ips.all(a, self.ips.exists_one(b, b.pool == a.pool && has(b.zone) == has(a.zone) && (!has(a.zone) || b.zone == a.zone)))",message="ips lists the same pool and zone twice; raise that entry's count instead"
// +kubebuilder:validation:XValidation:rule="!has(self.ips) || size(self.ips) > 8 || self.ips.all(a, !has(a.addresses) || size(a.addresses) > 8 || self.ips.all(b, !has(b.addresses) || size(b.addresses) > 8 || a == b || a.addresses.all(x, !(x in b.addresses))))",message="ips names the same address in two entries"
// +kubebuilder:validation:XValidation:rule="!has(self.ips) || size(self.ips) > 8 || self.ips.all(a, !has(a.addresses) || size(a.addresses) > 8 || a.addresses.all(x, !isIP(x) || self.ips.all(b, !has(b.addresses) || size(b.addresses) > 8 || b.addresses.all(y, !isIP(y) || ip(y).family() == ip(x).family()))))",message="ips names addresses of both families; an Egress is IPv4 or IPv6 (give a dual-stack workload two Egresses)"
type EgressSpec struct {
	// AppliedTo selects the Pods whose outbound traffic uses this egress IP.
	// +required
	AppliedTo AppliedTo `json:"appliedTo"`

	// ExternalIPPool is the name of the ExternalIPPool the address of a
	// single-IP Egress comes from (an RFC 1123 subdomain, at most 253
	// characters). Required unless ips is given, and exclusive with it.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="!format.dns1123Subdomain().validate(self).hasValue()",message="externalIPPool must be the name of an ExternalIPPool: lower case letters, digits, '-' and '.', at most 253 characters"
	ExternalIPPool string `json:"externalIPPool,omitempty"`

	// IPs asks for several egress IPs, each held by its own Node: one entry
	// per pool (and zone), each with a count and optionally named
	// addresses. At most 8 entries and 8 IPs in all (MaxEgressIPs), of one
	// IP family. Exclusive with externalIPPool and egressIP. The selected
	// Pods' new connections are spread over the Ready IPs, preferring
	// those in the Pod's own zone (see docs/architecture.md, "Several IPs
	// per Egress").
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	IPs []EgressIPSource `json:"ips,omitempty"`

	// EgressIP is the address to use, in canonical form (such as 192.0.2.5
	// or 2001:db8::5). When empty the controller allocates the lowest free
	// address of the pool. Egresses naming the same address share it: one
	// Node holds it for all of them.
	// +optional
	// +kubebuilder:validation:MinLength=2
	// +kubebuilder:validation:MaxLength=39
	// +kubebuilder:validation:XValidation:rule="isIP(self)",message="egressIP must be an IPv4 or IPv6 address such as 192.0.2.5 (no zone, no IPv4-mapped IPv6, no leading zeros)"
	// +kubebuilder:validation:XValidation:rule="!isIP(self) || ip.isCanonical(self)",message="egressIP must be written in canonical form (RFC 5952 for IPv6: lower case, no leading zeros, :: for the longest run of two or more zero groups but never for a single one, as in 2001:db8::5 or 2001:db8:0:1:1:1:1:1)"
	// +kubebuilder:validation:XValidation:rule="!isIP(self) || ip(self).isGlobalUnicast()",message="egressIP must be a unicast address (not loopback, link-local, multicast or unspecified)"
	EgressIP string `json:"egressIP,omitempty"`

	// FailurePolicy says what happens to the selected Pods' traffic to
	// destinations outside the cluster while no Node holds the egress IP
	// (no IP allocated, no eligible Node, or a failover in progress): Fail
	// rejects it at once (new connections and UDP get ICMP "administratively
	// prohibited" on IPv4 or "address unreachable" on IPv6, so connect and
	// send fail with EHOSTUNREACH; segments of a TCP connection opened
	// earlier get a TCP reset, ECONNRESET; see docs/datapath.md), Ignore
	// lets it leave with the IP of the Pod's Node, as if no Egress selected
	// the Pod. The names and the
	// default follow the admission webhooks' failurePolicy: Fail is safe for
	// allow-lists, Ignore keeps traffic flowing. Either way the Egress shows
	// Ready=False with reason NoEgressNode.
	// +optional
	// +kubebuilder:default=Fail
	FailurePolicy FailurePolicy `json:"failurePolicy,omitempty"`

	// DestinationCIDRs are the networks outside the cluster whose traffic
	// this Egress carries, in either IP family; only those of the Egress's
	// own family count. Empty or absent: every destination outside the
	// cluster (as if it listed 0.0.0.0/0 and ::/0). When several Egresses
	// select a Pod, each destination uses the Egress whose CIDR matches it
	// with the longest prefix, the oldest Egress on a tie (see
	// docs/datapath.md, "Destinations"). At most 64 entries, each a
	// canonical CIDR without host bits, such as 198.51.100.0/24 or
	// 2001:db8:1::/48.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	DestinationCIDRs []DestinationCIDR `json:"destinationCIDRs,omitempty"`

	// ExcludedCIDRs are destinations this Egress never carries, in either
	// IP family, even when DestinationCIDRs (or the default, every
	// destination) covers them. Only this Egress gives them up: the next
	// Egress that matches the destination takes it, else the Pod's Node
	// IP. At most 64 entries, canonical CIDRs without host bits.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	ExcludedCIDRs []DestinationCIDR `json:"excludedCIDRs,omitempty"`
}

// DestinationCIDR is a network given as a CIDR in canonical form, with no
// host bits set: 198.51.100.0/24 or 2001:db8:1::/48 (RFC 4632, RFC 5952).
// +kubebuilder:validation:MinLength=4
// +kubebuilder:validation:MaxLength=43
// +kubebuilder:validation:XValidation:rule="isCIDR(self)",message="destination CIDRs must be CIDRs such as 198.51.100.0/24 or 2001:db8:1::/48"
// +kubebuilder:validation:XValidation:rule="!isCIDR(self) || string(cidr(self)) == self",message="destination CIDRs must be written in canonical form (RFC 5952 for IPv6: lower case, no leading zeros, :: for the longest run of two or more zero groups, as in 2001:db8:1::/48)"
// +kubebuilder:validation:XValidation:rule="!isCIDR(self) || cidr(self) == cidr(self).masked()",message="destination CIDRs must not have host bits set (for example 198.51.100.0/24, not 198.51.100.7/24)"
type DestinationCIDR string

// FailurePolicy is what an Egress's Pods get while it has no egress Node:
// Fail or Ignore.
// +kubebuilder:validation:Enum=Fail;Ignore
type FailurePolicy string

const (
	// FailurePolicyFail rejects the selected Pods' external traffic while
	// the Egress has no egress Node. The default.
	FailurePolicyFail FailurePolicy = "Fail"
	// FailurePolicyIgnore lets the selected Pods' external traffic leave
	// with their Node's IP while the Egress has no egress Node.
	FailurePolicyIgnore FailurePolicy = "Ignore"
)

// EgressStatus is the observed state of an Egress, written by the
// controller.
type EgressStatus struct {
	// EgressIP is the address allocated to a single-IP Egress. For an
	// Egress with spec.ips it is the IP of the first entry of IPs that has
	// a Node (else of the first entry), so that tools that read one address
	// still see a held one.
	// +optional
	// +kubebuilder:validation:MaxLength=39
	EgressIP string `json:"egressIP,omitempty"`

	// EgressNode is the name of the Node that holds EgressIP; empty while
	// the Egress is not assigned. Selectable as status.egressNode. For an
	// Egress with spec.ips, the Node of that same entry of IPs; the other
	// holders are only in IPs.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	EgressNode string `json:"egressNode,omitempty"`

	// InterfaceMAC is, for an address of a cloud-backed pool, the hardware
	// address of the egress Node's network interface the cloud attached it
	// to (lower case, colon-separated, such as 0a:1b:2c:3d:4e:5f); the agent
	// binds the address on the Linux interface with this MAC. Empty for
	// other pools.
	// +optional
	// +kubebuilder:validation:MaxLength=17
	// +kubebuilder:validation:Pattern=`^([0-9a-f]{2}:){5}[0-9a-f]{2}$`
	InterfaceMAC string `json:"interfaceMAC,omitempty"`

	// PublicIP is, for a cloud-backed pool with Elastic IPs
	// (spec.cloud.aws.elasticIPs), the public IPv4 address associated with
	// EgressIP: what destinations on the internet see as the source. Empty
	// otherwise, and while no Elastic IP is associated.
	// +optional
	// +kubebuilder:validation:MaxLength=15
	PublicIP string `json:"publicIP,omitempty"`

	// SelectedPods is the number of Pods whose traffic uses this Egress, as
	// the controller last published them in EgressMemberSlices. A Pod that
	// an older Egress also selects counts for the older one only (the
	// oldest Egress wins). Absent until the first count.
	// +optional
	// +kubebuilder:validation:Minimum=0
	SelectedPods *int32 `json:"selectedPods,omitempty"`

	// ShadowedBy names, while SelectedPods is 0, the older Egresses that
	// hold the Pods this Egress's selectors match (at most 3, sorted).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=3
	// +kubebuilder:validation:items:MaxLength=253
	ShadowedBy []string `json:"shadowedBy,omitempty"`

	// SharedWith names the other Egresses that use the same egress IP
	// (sharing is allowed: one Node holds the address for all of them);
	// at most 8, sorted.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:MaxLength=253
	SharedWith []string `json:"sharedWith,omitempty"`

	// IPs lists every IP of an Egress with spec.ips, one entry per IP asked
	// for, in the order of spec.ips (each entry's count in a row, named
	// addresses first). Absent on single-IP Egresses, whose IP is
	// EgressIP/EgressNode. At most 8 (MaxEgressIPs).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	IPs []EgressIPStatus `json:"ips,omitempty"`

	// ReadyIPs is "n/N" for an Egress with spec.ips: n of its N IPs are
	// Ready (the READY-IPS column). Absent on single-IP Egresses.
	// +optional
	// +kubebuilder:validation:MaxLength=3
	// +kubebuilder:validation:Pattern=`^[0-8]/[1-8]$`
	ReadyIPs string `json:"readyIPs,omitempty"`

	// Conditions are IPAllocated, Assigned and Ready, each with a reason and
	// a message that says what to do when it is False.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// EgressIPStatus is one IP of an Egress with spec.ips.
type EgressIPStatus struct {
	// IP is the address; empty while none is allocated.
	// +optional
	// +kubebuilder:validation:MaxLength=39
	IP string `json:"ip,omitempty"`

	// Pool is the ExternalIPPool of the spec.ips entry this IP is for.
	// +required
	// +kubebuilder:validation:MaxLength=253
	Pool string `json:"pool"`

	// Node is the Node that holds the IP; empty while none does.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Node string `json:"node,omitempty"`

	// Zone is the Node's topology.kubernetes.io/zone label; empty when the
	// IP has no Node or the Node has no zone.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Zone string `json:"zone,omitempty"`

	// Ready is true when the Node's agent reports the IP bound and
	// announced: source Nodes then send new connections to it.
	// +optional
	Ready bool `json:"ready,omitempty"`

	// Reason says, while Ready is false, why: one CamelCase word of
	// api/v1alpha1/reasons.go (IPNotAllocated, NoEligibleNode,
	// CapacityExhausted, FewerNodesThanIPs, Binding, ...).
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Reason string `json:"reason,omitempty"`

	// InterfaceMAC is, for a cloud-backed pool, the MAC of the Node's
	// interface the cloud attached the IP to, as status.interfaceMAC.
	// +optional
	// +kubebuilder:validation:MaxLength=17
	// +kubebuilder:validation:Pattern=`^([0-9a-f]{2}:){5}[0-9a-f]{2}$`
	InterfaceMAC string `json:"interfaceMAC,omitempty"`

	// PublicIP is the Elastic IP associated with IP, as status.publicIP.
	// Not written yet: Elastic IPs are associated per Egress, so a pool
	// naming them is refused in spec.ips (ElasticIPsNotSupported).
	// +optional
	// +kubebuilder:validation:MaxLength=15
	PublicIP string `json:"publicIP,omitempty"`
}

// Egress gives the selected Pods a stable source address, allocated from an
// ExternalIPPool and held by one egress Node at a time.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=eg
// +kubebuilder:selectablefield:JSONPath=`.status.egressNode`
// +kubebuilder:printcolumn:name="Egress-IP",type=string,JSONPath=`.status.egressIP`,description="Allocated egress IP"
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.status.egressNode`,description="Node holding the egress IP"
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`,description="Bound and announced on the Node"
// +kubebuilder:printcolumn:name="Ready-IPs",type=string,JSONPath=`.status.readyIPs`,description="Ready IPs of an Egress with spec.ips, n/N (empty for a single-IP Egress)"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Pool",type=string,JSONPath=`.spec.externalIPPool`,priority=1,description="ExternalIPPool"
// +kubebuilder:printcolumn:name="Failure-Policy",type=string,JSONPath=`.spec.failurePolicy`,priority=1,description="What the Pods get while no Node holds the IP"
// +kubebuilder:printcolumn:name="Pods",type=integer,JSONPath=`.status.selectedPods`,priority=1,description="Pods whose traffic uses this Egress"
// +kubebuilder:printcolumn:name="Destinations",type=string,JSONPath=`.spec.destinationCIDRs`,priority=1,description="Networks this Egress carries (empty: every destination outside the cluster)"
// +kubebuilder:printcolumn:name="Public-IP",type=string,JSONPath=`.status.publicIP`,priority=1,description="Elastic IP associated with the egress IP (cloud pools with elasticIPs)"
type Egress struct {
	metav1.TypeMeta `json:",inline"`

	// metadata is a standard object metadata
	// +optional
	metav1.ObjectMeta `json:"metadata,omitzero"`

	// spec is the requested selection, pool and address.
	// +required
	Spec EgressSpec `json:"spec"`

	// status is the allocated address, its Node and the conditions.
	// +optional
	Status EgressStatus `json:"status,omitzero"`
}

// +kubebuilder:object:root=true

// EgressList contains a list of Egress.
type EgressList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitzero"`
	Items           []Egress `json:"items"`
}

func init() {
	SchemeBuilder.Register(func(s *runtime.Scheme) error {
		s.AddKnownTypes(SchemeGroupVersion, &Egress{}, &EgressList{})
		return nil
	})
}
