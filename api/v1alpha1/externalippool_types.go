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

// Validation notes for the CEL rules below.
//
// The API server's CEL IP library (Kubernetes 1.31+) parses and classifies
// addresses but cannot order them, so "start <= end" is checked bit by bit:
// start > end exactly when, for some k, both addresses share their first k
// bits and bit k+1 is set in start but clear in end. A bit is set when
// masking to k+1 bits gives a different address than masking to k bits.
// Prefix suffixes come from literal string lists ('/0'..'/128'), because the
// rule-cost estimator cannot bound the length of string(int); and IPs are
// compared with !(a == b) because it cannot bound a != b on IP values.
// A range's family is 4 or 6, or 0 while the range is itself invalid (that
// range's own rule reports it, so the pool-wide rules skip it instead of
// failing twice). CRD rules cannot use cel.bind, so "[x].all(v, ...)" binds
// a value to v.
//
// cidr has no MinLength: a string too short to be a CIDR ("::/0", 4
// characters, is the shortest; "2000::/3" has 8) gets the isCIDR message,
// which names the expected form, instead of OpenAPI's "should be at least N
// chars long". Addresses and CIDRs must be canonical (lower case, RFC 5952),
// as spec.egressIP must, so that one address has one spelling everywhere;
// the messages name the canonical spelling. CRD validation ratcheting
// (Kubernetes 1.30+, on by default) keeps admitting updates of objects
// stored before these rules whose ranges do not change.

// IPRange is one block of addresses of an ExternalIPPool: either a CIDR or an
// inclusive start-end pair, never both.
//
// +kubebuilder:validation:XValidation:rule="has(self.cidr) ? !has(self.start) && !has(self.end) : has(self.start) && has(self.end)",message="each ipRanges entry needs either cidr, or both start and end, but not both forms"
// +kubebuilder:validation:XValidation:rule="!has(self.start) || !has(self.end) || !isIP(self.start) || !isIP(self.end) || ip(self.start).family() == ip(self.end).family()",message="start and end must be of the same IP family"
// +kubebuilder:validation:XValidation:rule="!has(self.start) || !has(self.end) || !isIP(self.start) || !isIP(self.end) || ip(self.start).family() != ip(self.end).family() || ![0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 127].exists(k, (k < 32 || ip(self.start).family() == 6) && cidr(self.start + ['/0', '/1', '/2', '/3', '/4', '/5', '/6', '/7', '/8', '/9', '/10', '/11', '/12', '/13', '/14', '/15', '/16', '/17', '/18', '/19', '/20', '/21', '/22', '/23', '/24', '/25', '/26', '/27', '/28', '/29', '/30', '/31', '/32', '/33', '/34', '/35', '/36', '/37', '/38', '/39', '/40', '/41', '/42', '/43', '/44', '/45', '/46', '/47', '/48', '/49', '/50', '/51', '/52', '/53', '/54', '/55', '/56', '/57', '/58', '/59', '/60', '/61', '/62', '/63', '/64', '/65', '/66', '/67', '/68', '/69', '/70', '/71', '/72', '/73', '/74', '/75', '/76', '/77', '/78', '/79', '/80', '/81', '/82', '/83', '/84', '/85', '/86', '/87', '/88', '/89', '/90', '/91', '/92', '/93', '/94', '/95', '/96', '/97', '/98', '/99', '/100', '/101', '/102', '/103', '/104', '/105', '/106', '/107', '/108', '/109', '/110', '/111', '/112', '/113', '/114', '/115', '/116', '/117', '/118', '/119', '/120', '/121', '/122', '/123', '/124', '/125', '/126', '/127'][k]).masked().ip() == cidr(self.end + ['/0', '/1', '/2', '/3', '/4', '/5', '/6', '/7', '/8', '/9', '/10', '/11', '/12', '/13', '/14', '/15', '/16', '/17', '/18', '/19', '/20', '/21', '/22', '/23', '/24', '/25', '/26', '/27', '/28', '/29', '/30', '/31', '/32', '/33', '/34', '/35', '/36', '/37', '/38', '/39', '/40', '/41', '/42', '/43', '/44', '/45', '/46', '/47', '/48', '/49', '/50', '/51', '/52', '/53', '/54', '/55', '/56', '/57', '/58', '/59', '/60', '/61', '/62', '/63', '/64', '/65', '/66', '/67', '/68', '/69', '/70', '/71', '/72', '/73', '/74', '/75', '/76', '/77', '/78', '/79', '/80', '/81', '/82', '/83', '/84', '/85', '/86', '/87', '/88', '/89', '/90', '/91', '/92', '/93', '/94', '/95', '/96', '/97', '/98', '/99', '/100', '/101', '/102', '/103', '/104', '/105', '/106', '/107', '/108', '/109', '/110', '/111', '/112', '/113', '/114', '/115', '/116', '/117', '/118', '/119', '/120', '/121', '/122', '/123', '/124', '/125', '/126', '/127'][k]).masked().ip() && !(cidr(self.start + ['/1', '/2', '/3', '/4', '/5', '/6', '/7', '/8', '/9', '/10', '/11', '/12', '/13', '/14', '/15', '/16', '/17', '/18', '/19', '/20', '/21', '/22', '/23', '/24', '/25', '/26', '/27', '/28', '/29', '/30', '/31', '/32', '/33', '/34', '/35', '/36', '/37', '/38', '/39', '/40', '/41', '/42', '/43', '/44', '/45', '/46', '/47', '/48', '/49', '/50', '/51', '/52', '/53', '/54', '/55', '/56', '/57', '/58', '/59', '/60', '/61', '/62', '/63', '/64', '/65', '/66', '/67', '/68', '/69', '/70', '/71', '/72', '/73', '/74', '/75', '/76', '/77', '/78', '/79', '/80', '/81', '/82', '/83', '/84', '/85', '/86', '/87', '/88', '/89', '/90', '/91', '/92', '/93', '/94', '/95', '/96', '/97', '/98', '/99', '/100', '/101', '/102', '/103', '/104', '/105', '/106', '/107', '/108', '/109', '/110', '/111', '/112', '/113', '/114', '/115', '/116', '/117', '/118', '/119', '/120', '/121', '/122', '/123', '/124', '/125', '/126', '/127', '/128'][k]).masked().ip() == cidr(self.start + ['/0', '/1', '/2', '/3', '/4', '/5', '/6', '/7', '/8', '/9', '/10', '/11', '/12', '/13', '/14', '/15', '/16', '/17', '/18', '/19', '/20', '/21', '/22', '/23', '/24', '/25', '/26', '/27', '/28', '/29', '/30', '/31', '/32', '/33', '/34', '/35', '/36', '/37', '/38', '/39', '/40', '/41', '/42', '/43', '/44', '/45', '/46', '/47', '/48', '/49', '/50', '/51', '/52', '/53', '/54', '/55', '/56', '/57', '/58', '/59', '/60', '/61', '/62', '/63', '/64', '/65', '/66', '/67', '/68', '/69', '/70', '/71', '/72', '/73', '/74', '/75', '/76', '/77', '/78', '/79', '/80', '/81', '/82', '/83', '/84', '/85', '/86', '/87', '/88', '/89', '/90', '/91', '/92', '/93', '/94', '/95', '/96', '/97', '/98', '/99', '/100', '/101', '/102', '/103', '/104', '/105', '/106', '/107', '/108', '/109', '/110', '/111', '/112', '/113', '/114', '/115', '/116', '/117', '/118', '/119', '/120', '/121', '/122', '/123', '/124', '/125', '/126', '/127'][k]).masked().ip()) && cidr(self.end + ['/1', '/2', '/3', '/4', '/5', '/6', '/7', '/8', '/9', '/10', '/11', '/12', '/13', '/14', '/15', '/16', '/17', '/18', '/19', '/20', '/21', '/22', '/23', '/24', '/25', '/26', '/27', '/28', '/29', '/30', '/31', '/32', '/33', '/34', '/35', '/36', '/37', '/38', '/39', '/40', '/41', '/42', '/43', '/44', '/45', '/46', '/47', '/48', '/49', '/50', '/51', '/52', '/53', '/54', '/55', '/56', '/57', '/58', '/59', '/60', '/61', '/62', '/63', '/64', '/65', '/66', '/67', '/68', '/69', '/70', '/71', '/72', '/73', '/74', '/75', '/76', '/77', '/78', '/79', '/80', '/81', '/82', '/83', '/84', '/85', '/86', '/87', '/88', '/89', '/90', '/91', '/92', '/93', '/94', '/95', '/96', '/97', '/98', '/99', '/100', '/101', '/102', '/103', '/104', '/105', '/106', '/107', '/108', '/109', '/110', '/111', '/112', '/113', '/114', '/115', '/116', '/117', '/118', '/119', '/120', '/121', '/122', '/123', '/124', '/125', '/126', '/127', '/128'][k]).masked().ip() == cidr(self.end + ['/0', '/1', '/2', '/3', '/4', '/5', '/6', '/7', '/8', '/9', '/10', '/11', '/12', '/13', '/14', '/15', '/16', '/17', '/18', '/19', '/20', '/21', '/22', '/23', '/24', '/25', '/26', '/27', '/28', '/29', '/30', '/31', '/32', '/33', '/34', '/35', '/36', '/37', '/38', '/39', '/40', '/41', '/42', '/43', '/44', '/45', '/46', '/47', '/48', '/49', '/50', '/51', '/52', '/53', '/54', '/55', '/56', '/57', '/58', '/59', '/60', '/61', '/62', '/63', '/64', '/65', '/66', '/67', '/68', '/69', '/70', '/71', '/72', '/73', '/74', '/75', '/76', '/77', '/78', '/79', '/80', '/81', '/82', '/83', '/84', '/85', '/86', '/87', '/88', '/89', '/90', '/91', '/92', '/93', '/94', '/95', '/96', '/97', '/98', '/99', '/100', '/101', '/102', '/103', '/104', '/105', '/106', '/107', '/108', '/109', '/110', '/111', '/112', '/113', '/114', '/115', '/116', '/117', '/118', '/119', '/120', '/121', '/122', '/123', '/124', '/125', '/126', '/127'][k]).masked().ip())",messageExpression="'start ' + self.start + ' is greater than end ' + self.end + ': a range runs from start up to end'"
type IPRange struct {
	// CIDR is a block of addresses in CIDR notation, such as 192.0.2.0/28 or
	// 2001:db8::/120, with no host bits set, containing no loopback,
	// link-local, multicast or broadcast address. For IPv4
	// blocks larger than /31 the network and broadcast addresses are never
	// allocated; /31 and /32 give every address (RFC 3021).
	// +optional
	// +kubebuilder:validation:MaxLength=43
	// +kubebuilder:validation:XValidation:rule="isCIDR(self)",message="cidr must be a CIDR such as 192.0.2.0/28 or 2001:db8::/120"
	// +kubebuilder:validation:XValidation:rule="!isCIDR(self) || string(cidr(self)) == self",message="cidr must be written in canonical form (RFC 5952 for IPv6: lower case, no leading zeros, :: for the longest run of two or more zero groups but never for a single one, as in 2001:db8::5 or 2001:db8:0:1:1:1:1:1)"
	// +kubebuilder:validation:XValidation:rule="!isCIDR(self) || cidr(self) == cidr(self).masked()",message="cidr must not have host bits set (for example 192.0.2.0/28, not 192.0.2.5/28)"
	// +kubebuilder:validation:XValidation:rule="!isCIDR(self) || cidr(self).ip().isGlobalUnicast()",message="cidr must be a unicast block (not loopback, link-local, multicast or unspecified)"
	// +kubebuilder:validation:XValidation:rule="!isCIDR(self) || !cidr(self).ip().isGlobalUnicast() || !['127.0.0.0/8', '169.254.0.0/16', '224.0.0.0/4', '255.255.255.255/32', 'fe80::/10', 'ff00::/8'].exists(b, cidr(self).containsCIDR(b))",message="cidr must not contain loopback, link-local, multicast or broadcast addresses (127.0.0.0/8, 169.254.0.0/16, 224.0.0.0/4, 255.255.255.255, fe80::/10, ff00::/8): they are never egress IPs; split it into blocks around them"
	CIDR string `json:"cidr,omitempty"`

	// Start is the first address of an inclusive range, such as 192.0.2.100.
	// +optional
	// +kubebuilder:validation:MinLength=2
	// +kubebuilder:validation:MaxLength=39
	// +kubebuilder:validation:XValidation:rule="isIP(self)",message="start must be an IPv4 or IPv6 address such as 192.0.2.100 (no zone, no IPv4-mapped IPv6, no leading zeros)"
	// +kubebuilder:validation:XValidation:rule="!isIP(self) || ip.isCanonical(self)",message="start must be written in canonical form (RFC 5952 for IPv6: lower case, no leading zeros, :: for the longest run of two or more zero groups but never for a single one, as in 2001:db8::5 or 2001:db8:0:1:1:1:1:1)"
	// +kubebuilder:validation:XValidation:rule="!isIP(self) || ip(self).isGlobalUnicast()",message="start must be a unicast address (not loopback, link-local, multicast or unspecified)"
	Start string `json:"start,omitempty"`

	// End is the last address of an inclusive range, such as 192.0.2.120; it
	// must be of the same family as Start and not lower than it.
	// +optional
	// +kubebuilder:validation:MinLength=2
	// +kubebuilder:validation:MaxLength=39
	// +kubebuilder:validation:XValidation:rule="isIP(self)",message="end must be an IPv4 or IPv6 address such as 192.0.2.120 (no zone, no IPv4-mapped IPv6, no leading zeros)"
	// +kubebuilder:validation:XValidation:rule="!isIP(self) || ip.isCanonical(self)",message="end must be written in canonical form (RFC 5952 for IPv6: lower case, no leading zeros, :: for the longest run of two or more zero groups but never for a single one, as in 2001:db8::5 or 2001:db8:0:1:1:1:1:1)"
	// +kubebuilder:validation:XValidation:rule="!isIP(self) || ip(self).isGlobalUnicast()",message="end must be a unicast address (not loopback, link-local, multicast or unspecified)"
	End string `json:"end,omitempty"`
}

// SubnetInfo describes the layer-2 subnet the pool's addresses live in.
type SubnetInfo struct {
	// Gateway is the subnet's router address, such as 192.0.2.1. It is never
	// allocated to an Egress. Same family as the pool.
	// +required
	// +kubebuilder:validation:MinLength=2
	// +kubebuilder:validation:MaxLength=39
	// +kubebuilder:validation:XValidation:rule="isIP(self)",message="gateway must be an IPv4 or IPv6 address such as 192.0.2.1"
	// +kubebuilder:validation:XValidation:rule="!isIP(self) || ip.isCanonical(self)",message="gateway must be written in canonical form (RFC 5952 for IPv6: lower case, no leading zeros, :: for the longest run of two or more zero groups but never for a single one, as in 2001:db8::5 or 2001:db8:0:1:1:1:1:1)"
	Gateway string `json:"gateway"`

	// PrefixLength is the subnet's prefix length in bits: 1..32 for an IPv4
	// pool, 1..128 for an IPv6 pool.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=128
	PrefixLength int32 `json:"prefixLength"`

	// VLAN is the IEEE 802.1Q VLAN ID the subnet is carried on; 0 means
	// untagged. 4095 is reserved by 802.1Q and rejected.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=4094
	VLAN int32 `json:"vlan,omitempty"`
}

// ExternalIPPoolSpec defines the addresses of a pool and the Nodes that may
// hold them.
//
// +kubebuilder:validation:XValidation:rule="!has(self.subnetInfo) || !has(self.ipRanges) || !isIP(self.subnetInfo.gateway) || [self.ipRanges.map(r, has(r.cidr) ? (isCIDR(r.cidr) ? cidr(r.cidr).ip().family() : 0) : ((has(r.start) && isIP(r.start)) ? ip(r.start).family() : 0)).filter(f, f != 0)].all(fams, size(fams) == 0 || ip(self.subnetInfo.gateway).family() == fams[0])",message="subnetInfo.gateway must be of the same IP family as the pool's ipRanges"
// +kubebuilder:validation:XValidation:rule="!has(self.subnetInfo) || !has(self.ipRanges) || self.subnetInfo.prefixLength <= 32 || [self.ipRanges.map(r, has(r.cidr) ? (isCIDR(r.cidr) ? cidr(r.cidr).ip().family() : 0) : ((has(r.start) && isIP(r.start)) ? ip(r.start).family() : 0)).filter(f, f != 0)].all(fams, size(fams) == 0 || fams[0] == 6)",message="subnetInfo.prefixLength must be between 1 and 32 for an IPv4 pool"
// +kubebuilder:validation:XValidation:rule="!has(self.subnetInfo) || !has(self.ipRanges) || !isIP(self.subnetInfo.gateway) || self.subnetInfo.prefixLength < 0 || self.subnetInfo.prefixLength > 128 || (ip(self.subnetInfo.gateway).family() == 4 && self.subnetInfo.prefixLength > 32) || [cidr(self.subnetInfo.gateway + '/' + ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', '10', '11', '12', '13', '14', '15', '16', '17', '18', '19', '20', '21', '22', '23', '24', '25', '26', '27', '28', '29', '30', '31', '32', '33', '34', '35', '36', '37', '38', '39', '40', '41', '42', '43', '44', '45', '46', '47', '48', '49', '50', '51', '52', '53', '54', '55', '56', '57', '58', '59', '60', '61', '62', '63', '64', '65', '66', '67', '68', '69', '70', '71', '72', '73', '74', '75', '76', '77', '78', '79', '80', '81', '82', '83', '84', '85', '86', '87', '88', '89', '90', '91', '92', '93', '94', '95', '96', '97', '98', '99', '100', '101', '102', '103', '104', '105', '106', '107', '108', '109', '110', '111', '112', '113', '114', '115', '116', '117', '118', '119', '120', '121', '122', '123', '124', '125', '126', '127', '128'][self.subnetInfo.prefixLength]).masked()].all(sn, self.ipRanges.all(r, has(r.cidr) ? (!isCIDR(r.cidr) || cidr(r.cidr).ip().family() != sn.ip().family() || sn.containsCIDR(r.cidr)) : (!has(r.start) || !has(r.end) || !isIP(r.start) || !isIP(r.end) || ip(r.start).family() != sn.ip().family() || ip(r.end).family() != sn.ip().family() || (sn.containsIP(r.start) && sn.containsIP(r.end)))))",message="every ipRanges entry must lie inside the subnet given by subnetInfo.gateway and subnetInfo.prefixLength"
// +kubebuilder:validation:XValidation:rule="has(self.cloud) || (has(self.ipRanges) && size(self.ipRanges) > 0)",message="ipRanges is required (1 to 32 entries) unless the pool is cloud-backed (spec.cloud)"
// +kubebuilder:validation:XValidation:rule="!has(self.cloud) || !has(self.ipRanges) || self.ipRanges.all(r, has(r.cidr) ? (!isCIDR(r.cidr) || cidr(r.cidr).ip().family() == 4) : (!has(r.start) || !isIP(r.start) || ip(r.start).family() == 4))",message="a cloud-backed pool is IPv4 only: every ipRanges entry must be IPv4"
// +kubebuilder:validation:XValidation:rule="!has(self.cloud) || !has(self.subnetInfo) || !has(self.subnetInfo.vlan) || self.subnetInfo.vlan == 0",message="subnetInfo.vlan is not allowed in a cloud-backed pool: the cloud network delivers the addresses untagged"
type ExternalIPPoolSpec struct {
	// IPRanges are the pool's addresses: 1 to 32 entries, each a CIDR or a
	// start-end range, all of one IP family. A workload that needs both
	// families uses two pools and two Egresses. Required unless Cloud is
	// set; in a cloud-backed pool they must lie in the cloud subnet and
	// restrict the pool to those addresses (without them the cloud picks
	// any free address of the subnet).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:XValidation:rule="[self.map(r, has(r.cidr) ? (isCIDR(r.cidr) ? cidr(r.cidr).ip().family() : 0) : ((has(r.start) && isIP(r.start)) ? ip(r.start).family() : 0)).filter(f, f != 0)].all(fams, fams.all(f, f == fams[0]))",message="all ipRanges of a pool must be of one IP family; use a second pool for the other family"
	IPRanges []IPRange `json:"ipRanges,omitempty"`

	// SubnetInfo describes the layer-2 subnet of the addresses (gateway,
	// prefix length, VLAN). Optional: without it the agent binds each
	// address on the interface whose connected subnet holds it.
	// +optional
	SubnetInfo *SubnetInfo `json:"subnetInfo,omitempty"`

	// NodeSelector selects the Nodes that may hold this pool's addresses.
	// Empty or absent selects every Linux Node. At most 64 matchLabels and
	// 32 matchExpressions.
	// +optional
	// +kubebuilder:validation:XValidation:rule="!has(self.matchLabels) || size(self.matchLabels) <= 64",message="nodeSelector.matchLabels may have at most 64 entries"
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || size(self.matchExpressions) <= 32",message="nodeSelector.matchExpressions may have at most 32 entries"
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || size(self.matchExpressions) > 32 || self.matchExpressions.all(e, e.operator in ['In', 'NotIn', 'Exists', 'DoesNotExist'])",message="nodeSelector.matchExpressions: operator must be In, NotIn, Exists or DoesNotExist"
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || size(self.matchExpressions) > 32 || self.matchExpressions.all(e, !(e.operator in ['In', 'NotIn']) || (has(e.values) && size(e.values) > 0))",message="nodeSelector.matchExpressions: In and NotIn need at least one value"
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || size(self.matchExpressions) > 32 || self.matchExpressions.all(e, !(e.operator in ['Exists', 'DoesNotExist']) || !has(e.values) || size(e.values) == 0)",message="nodeSelector.matchExpressions: Exists and DoesNotExist take no values"
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`

	// Cloud makes the pool cloud-backed: the controller attaches each
	// address to the holding Node's network interface through the cloud
	// API before the agent binds it, and keeps warm addresses attached
	// ahead of demand. See docs/cloud-aws.md.
	// +optional
	Cloud *CloudPool `json:"cloud,omitempty"`
}

// CloudProvider names the cloud API a cloud-backed pool uses.
// +kubebuilder:validation:Enum=AWS
type CloudProvider string

// The supported cloud providers.
const (
	// CloudProviderAWS attaches addresses as secondary private IPv4
	// addresses of the Node's primary ENI through the EC2 API.
	CloudProviderAWS CloudProvider = "AWS"
)

// CloudPool is the cloud side of a cloud-backed pool and its warm IP
// targets. The targets follow the AWS VPC CNI's WARM_IP_TARGET and
// MINIMUM_IP_TARGET (amazon-vpc-cni-k8s, docs/eni-and-ip-target.md), counted
// pool-wide instead of per Node.
//
// +kubebuilder:validation:XValidation:rule="self.provider != 'AWS' || has(self.aws)",message="cloud.aws is required when cloud.provider is AWS"
// +kubebuilder:validation:XValidation:rule="self.provider == 'AWS' || !has(self.aws)",message="cloud.aws is allowed only when cloud.provider is AWS"
type CloudPool struct {
	// Provider is the cloud API to use. Only AWS is supported.
	// +required
	Provider CloudProvider `json:"provider"`

	// AWS holds the EC2 settings; required when Provider is AWS.
	// +optional
	AWS *AWSPool `json:"aws,omitempty"`

	// WarmIPTarget is the number of addresses the controller keeps
	// attached to eligible Nodes but allocated to no Egress, pool-wide, so
	// that a new Egress is served without a cloud API call. 0 (the
	// default) attaches addresses only on demand.
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	WarmIPTarget int32 `json:"warmIPTarget,omitempty"`

	// MinimumIPTarget is a floor on the pool's attached addresses
	// (allocated plus warm): the controller never detaches below it and
	// attaches up to it even with no demand. 0 or absent means no floor.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	MinimumIPTarget int32 `json:"minimumIPTarget,omitempty"`
}

// AWSInterfaceMode says which network interfaces hold a pool's addresses.
// +kubebuilder:validation:Enum=OwnInterfaces;PrimaryInterface
type AWSInterfaceMode string

// The interface modes of an AWS pool.
const (
	// AWSOwnInterfaces: the controller creates network interfaces (ENIs)
	// of its own in the pool's subnet, tagged
	// node.k8s.amazonaws.com/no_manage=true so that the AWS VPC CNI leaves
	// them alone, attaches them to the Nodes and puts the egress IPs only
	// on them. The default; required on EKS and wherever the VPC CNI runs.
	AWSOwnInterfaces AWSInterfaceMode = "OwnInterfaces"
	// AWSPrimaryInterface: the egress IPs go on each Node's primary ENI
	// (device index 0). Only for clusters without the AWS VPC CNI: the CNI
	// always manages the primary ENI, takes unknown secondary addresses
	// on it as Pod addresses and may release them.
	AWSPrimaryInterface AWSInterfaceMode = "PrimaryInterface"
)

// AWSPool is the EC2 side of a cloud-backed pool.
// +kubebuilder:validation:XValidation:rule="!has(self.interfaceMode) || self.interfaceMode != 'PrimaryInterface' || (!has(self.securityGroupIDs) && !has(self.maxInterfacesPerNode))",message="securityGroupIDs and maxInterfacesPerNode apply to the controller's own interfaces: not allowed with interfaceMode PrimaryInterface"
type AWSPool struct {
	// SubnetID is the VPC subnet the pool's addresses come from, such as
	// subnet-0123456789abcdef0. With interfaceMode OwnInterfaces the
	// controller's interfaces are created in it, and only Nodes in its
	// VPC and availability zone may hold the pool's addresses; with
	// PrimaryInterface only Nodes whose primary network interface is in
	// this subnet may.
	// +required
	// +kubebuilder:validation:MinLength=15
	// +kubebuilder:validation:MaxLength=24
	// +kubebuilder:validation:Pattern=`^subnet-[0-9a-f]{8,17}$`
	SubnetID string `json:"subnetID"`

	// InterfaceMode is OwnInterfaces (the default: egress IPs only on
	// interfaces the controller creates, tagged so that the AWS VPC CNI
	// leaves them alone) or PrimaryInterface (on each Node's primary
	// interface; only for clusters without the VPC CNI). See
	// docs/cloud-aws.md.
	// +optional
	// +kubebuilder:default=OwnInterfaces
	InterfaceMode AWSInterfaceMode `json:"interfaceMode,omitempty"`

	// SecurityGroupIDs are the security groups of the interfaces the
	// controller creates; empty copies those of each Node's primary
	// interface.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:Pattern=`^sg-[0-9a-f]{8,17}$`
	// +kubebuilder:validation:items:MaxLength=20
	SecurityGroupIDs []string `json:"securityGroupIDs,omitempty"`

	// MaxInterfacesPerNode caps how many interfaces the controller
	// attaches to one Node for this pool, leaving the instance's other
	// interface slots to the CNI. Absent: as many as the instance type
	// allows beside the interfaces already attached.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=15
	MaxInterfacesPerNode int32 `json:"maxInterfacesPerNode,omitempty"`

	// ElasticIPs names Elastic IP allocations that give the pool's egress
	// IPs public addresses: each address allocated to an Egress is
	// associated with one of them (AssociateAddress), the association
	// follows the address when it moves, and it is released when the
	// address leaves its Egress. Without it, egress IPs have no public
	// address of their own. See docs/cloud-aws.md.
	// +optional
	ElasticIPs *ElasticIPs `json:"elasticIPs,omitempty"`
}

// Interfaces returns the pool's interface mode, OwnInterfaces when unset.
func (a *AWSPool) Interfaces() AWSInterfaceMode {
	if a == nil || a.InterfaceMode == "" {
		return AWSOwnInterfaces
	}
	return a.InterfaceMode
}

// ElasticIPs selects Elastic IP allocations, by ID or by tags (exactly one
// of the two).
//
// +kubebuilder:validation:XValidation:rule="has(self.allocationIDs) != has(self.tags)",message="elasticIPs takes exactly one of allocationIDs and tags"
type ElasticIPs struct {
	// AllocationIDs are the allocations' IDs, such as
	// eipalloc-0123456789abcdef0.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=200
	// +kubebuilder:validation:items:Pattern=`^eipalloc-[0-9a-f]{8,17}$`
	// +kubebuilder:validation:items:MaxLength=26
	AllocationIDs []string `json:"allocationIDs,omitempty"`

	// Tags selects the allocations that carry every one of these tags
	// (key: value), such as {"egressip.io/pool": "partner-egress"}.
	// +optional
	// +kubebuilder:validation:MinProperties=1
	// +kubebuilder:validation:MaxProperties=10
	// +kubebuilder:validation:XValidation:rule="self.all(k, size(k) > 0 && size(k) <= 128 && size(self[k]) <= 256)",message="tag keys must be 1 to 128 characters, values at most 256"
	Tags map[string]string `json:"tags,omitempty"`
}

// IPPoolUsage counts a pool's addresses.
type IPPoolUsage struct {
	// Total is the number of allocatable addresses in the pool (network,
	// broadcast and gateway addresses excluded). It saturates at 2^63-1 for
	// very large IPv6 ranges; TotalText does not.
	// +kubebuilder:validation:Minimum=0
	Total int64 `json:"total"`

	// TotalText is the same count for people, shown in the TOTAL column of
	// `kubectl get eip`: the exact decimal count up to 2^32 (every IPv4
	// pool), above that a power of two with its exponent rounded to one
	// decimal and a leading "~" when inexact, such as "~2^64" for a /64
	// (2^64 addresses less the reserved ones). Empty until the controller
	// has written it.
	// +optional
	// +kubebuilder:validation:MaxLength=16
	TotalText string `json:"totalText,omitempty"`

	// Used is the number of distinct addresses allocated to Egresses.
	// Egresses that share one address count once.
	// +kubebuilder:validation:Minimum=0
	Used int64 `json:"used"`
}

// WarmIP is an address the controller attached to a Node's network
// interface for a cloud-backed pool and has not allocated to an Egress.
type WarmIP struct {
	// IP is the IPv4 address.
	// +required
	// +kubebuilder:validation:MinLength=7
	// +kubebuilder:validation:MaxLength=15
	// +kubebuilder:validation:XValidation:rule="isIP(self) && ip(self).family() == 4",message="ip must be an IPv4 address"
	IP string `json:"ip"`

	// Node is the name of the Node whose interface holds IP.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Node string `json:"node"`
}

// CloudPoolStatus is the cloud side of a cloud-backed pool as the
// controller last saw it. The warm list is the controller's record of which
// attached addresses it owns (with the Egress statuses, which hold the
// allocated ones), so that a restarted controller tells them apart from
// addresses other software attached to the same interfaces.
type CloudPoolStatus struct {
	// Attached is the number of the pool's addresses attached to Nodes'
	// interfaces (allocated plus warm).
	// +kubebuilder:validation:Minimum=0
	Attached int32 `json:"attached"`

	// Warm is the number of attached addresses allocated to no Egress.
	// +kubebuilder:validation:Minimum=0
	Warm int32 `json:"warm"`

	// Allocated is the number of attached addresses allocated to Egresses.
	// +kubebuilder:validation:Minimum=0
	Allocated int32 `json:"allocated"`

	// WarmIPs are the warm addresses and their Nodes, sorted by address.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=1000
	WarmIPs []WarmIP `json:"warmIPs,omitempty"`
}

// ExcludedAddresses counts the addresses of a pool's ranges that are never
// allocated for one reason.
type ExcludedAddresses struct {
	// Reason is NodeAddress (an InternalIP or ExternalIP of a Node),
	// SpecialPurpose (loopback, link-local, multicast, "this network",
	// broadcast, unspecified or IPv4-mapped) or Reserved (the gateway, or a
	// network, broadcast or Subnet-Router anycast address).
	// +required
	// +kubebuilder:validation:Enum=NodeAddress;SpecialPurpose;Reserved
	Reason string `json:"reason"`

	// Count is the number of such addresses in the pool's ranges; it
	// saturates at 2^63-1.
	// +required
	// +kubebuilder:validation:Minimum=0
	Count int64 `json:"count"`

	// Message says which addresses, such as "192.0.2.10 (InternalIP of Node
	// worker-1)", naming at most a few.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`
}

// ExternalIPPoolStatus is the observed state of an ExternalIPPool, written by
// the controller.
type ExternalIPPoolStatus struct {
	// Usage counts the pool's addresses.
	// +optional
	Usage IPPoolUsage `json:"usage,omitempty"`

	// Excluded counts, by reason, the addresses of the pool's ranges that
	// are never allocated (they are not part of usage.total). Absent when
	// there are none.
	// +optional
	// +listType=map
	// +listMapKey=reason
	// +kubebuilder:validation:MaxItems=3
	Excluded []ExcludedAddresses `json:"excluded,omitempty"`

	// Cloud is the state of a cloud-backed pool's attached addresses.
	// +optional
	Cloud *CloudPoolStatus `json:"cloud,omitempty"`

	// Conditions of the pool. Ready=True when the pool is valid and can
	// allocate; its reason and message say what is wrong otherwise.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// ExternalIPPool is a cluster-wide pool of egress IPs and the Nodes that may
// hold them.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=eip
// +kubebuilder:printcolumn:name="Total",type=string,JSONPath=`.status.usage.totalText`,description="Allocatable addresses (exact up to 2^32, then a power of two such as ~2^64; the exact integer, saturated at 2^63-1, is .status.usage.total)"
// +kubebuilder:printcolumn:name="Used",type=integer,JSONPath=`.status.usage.used`,description="Addresses allocated to Egresses"
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`,description="Whether the pool is valid and in use as configured"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ExternalIPPool struct {
	metav1.TypeMeta `json:",inline"`

	// metadata is a standard object metadata
	// +optional
	metav1.ObjectMeta `json:"metadata,omitzero"`

	// spec defines the pool's addresses and eligible Nodes.
	// +required
	Spec ExternalIPPoolSpec `json:"spec"`

	// status is the pool's observed usage and conditions.
	// +optional
	Status ExternalIPPoolStatus `json:"status,omitzero"`
}

// +kubebuilder:object:root=true

// ExternalIPPoolList contains a list of ExternalIPPool.
type ExternalIPPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitzero"`
	Items           []ExternalIPPool `json:"items"`
}

func init() {
	SchemeBuilder.Register(func(s *runtime.Scheme) error {
		s.AddKnownTypes(SchemeGroupVersion, &ExternalIPPool{}, &ExternalIPPoolList{})
		return nil
	})
}
