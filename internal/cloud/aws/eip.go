package aws

import (
	"context"
	"maps"
	"net/netip"
	"slices"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/egressip/egressip/internal/cloud"
)

var _ cloud.ElasticIPs = (*Provider)(nil)

// ElasticIPs implements cloud.ElasticIPs with one DescribeAddresses call
// for the IDs (filter allocation-id, so that unknown IDs are absent rather
// than failing the call) and one for the tags (tag:<key> filters; EC2
// ANDs filters). It needs ec2:DescribeAddresses.
func (p *Provider) ElasticIPs(ctx context.Context, ids []string, tags map[string]string) ([]cloud.ElasticIP, error) {
	var out []cloud.ElasticIP
	seen := map[string]bool{}
	read := func(filters []types.Filter) error {
		res, err := p.client.DescribeAddresses(ctx, &ec2.DescribeAddressesInput{Filters: filters})
		if err != nil {
			return mapError("describe Elastic IPs", err)
		}
		for _, a := range res.Addresses {
			id := sdkaws.ToString(a.AllocationId)
			if seen[id] {
				continue
			}
			seen[id] = true
			e := cloud.ElasticIP{AllocationID: id, AssociationID: sdkaws.ToString(a.AssociationId), InterfaceID: sdkaws.ToString(a.NetworkInterfaceId)}
			e.PublicIP, _ = netip.ParseAddr(sdkaws.ToString(a.PublicIp))
			e.PrivateIP, _ = netip.ParseAddr(sdkaws.ToString(a.PrivateIpAddress))
			out = append(out, e)
		}
		return nil
	}
	for chunk := range slices.Chunk(slices.Compact(slices.Sorted(slices.Values(ids))), maxFilterValues) {
		if err := read([]types.Filter{{Name: sdkaws.String("allocation-id"), Values: chunk}}); err != nil {
			return nil, err
		}
	}
	if len(tags) > 0 {
		var fs []types.Filter
		for _, k := range slices.Sorted(maps.Keys(tags)) {
			fs = append(fs, types.Filter{Name: sdkaws.String("tag:" + k), Values: []string{tags[k]}})
		}
		if err := read(fs); err != nil {
			return nil, err
		}
	}
	slices.SortFunc(out, func(a, b cloud.ElasticIP) int { return cmpString(a.AllocationID, b.AllocationID) })
	return out, nil
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Associate implements cloud.ElasticIPs with one AssociateAddress call
// (AllowReassociation: the controller associates only allocations that
// are free or associated with one of its own addresses). It needs
// ec2:AssociateAddress.
func (p *Provider) Associate(ctx context.Context, allocationID, interfaceID string, private netip.Addr) (string, error) {
	out, err := p.client.AssociateAddress(ctx, &ec2.AssociateAddressInput{
		AllocationId:       sdkaws.String(allocationID),
		NetworkInterfaceId: sdkaws.String(interfaceID),
		PrivateIpAddress:   sdkaws.String(private.String()),
		AllowReassociation: sdkaws.Bool(true),
	})
	if err != nil {
		return "", mapError("associate "+allocationID+" with "+private.String(), err)
	}
	return sdkaws.ToString(out.AssociationId), nil
}

// Disassociate implements cloud.ElasticIPs with one DisassociateAddress
// call. It needs ec2:DisassociateAddress.
func (p *Provider) Disassociate(ctx context.Context, associationID string) error {
	_, err := p.client.DisassociateAddress(ctx, &ec2.DisassociateAddressInput{AssociationId: sdkaws.String(associationID)})
	return mapError("disassociate "+associationID, err)
}
