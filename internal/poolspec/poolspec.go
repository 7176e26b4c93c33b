// Package poolspec converts ExternalIPPool API objects into the plain values
// of package ipam, the one place the two meet.
package poolspec

import (
	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/ipam"
)

// Ranges converts spec.ipRanges to ipam's plain form.
func Ranges(rs []v1.IPRange) []ipam.Range {
	out := make([]ipam.Range, len(rs))
	for i, r := range rs {
		out[i] = ipam.Range{CIDR: r.CIDR, Start: r.Start, End: r.End}
	}
	return out
}

// Subnet converts spec.subnetInfo (nil when absent) to ipam's form.
func Subnet(s *v1.SubnetInfo) *ipam.SubnetInfo {
	if s == nil {
		return nil
	}
	return &ipam.SubnetInfo{Gateway: s.Gateway, PrefixLength: int(s.PrefixLength), VLAN: int(s.VLAN)}
}

// Parse validates p's spec and returns its ipam.Pool; the error is ipam's
// (a FieldErrors listing every problem).
func Parse(p *v1.ExternalIPPool) (*ipam.Pool, error) {
	return ipam.NewPool(Ranges(p.Spec.IPRanges), Subnet(p.Spec.SubnetInfo))
}
