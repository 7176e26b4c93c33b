package aws

import (
	"context"
	"net/netip"
	"slices"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/egressip/egressip/internal/cloud"
)

var _ cloud.AddressLookup = (*Provider)(nil)

// Holders implements cloud.AddressLookup with DescribeNetworkInterfaces
// filtered by subnet-id and addresses.private-ip-address (primary and
// secondary addresses), 199 addresses per call (EC2 accepts 200 filter
// values per call; the subnet takes one). It needs
// ec2:DescribeNetworkInterfaces.
func (p *Provider) Holders(ctx context.Context, subnetID string, ips []netip.Addr) (map[netip.Addr]cloud.Holder, error) {
	out := map[netip.Addr]cloud.Holder{}
	want := map[netip.Addr]bool{}
	for _, ip := range ips {
		want[ip] = true
	}
	uniq := slices.Compact(slices.SortedFunc(slices.Values(ips), netip.Addr.Compare))
	for chunk := range slices.Chunk(uniq, maxFilterValues-1) {
		pages := ec2.NewDescribeNetworkInterfacesPaginator(p.client, &ec2.DescribeNetworkInterfacesInput{
			Filters: []types.Filter{
				{Name: sdkaws.String("subnet-id"), Values: []string{subnetID}},
				{Name: sdkaws.String("addresses.private-ip-address"), Values: addrStrings(chunk)},
			},
			MaxResults: sdkaws.Int32(pageSize),
		})
		for pages.HasMorePages() {
			res, err := pages.NextPage(ctx)
			if err != nil {
				return nil, mapError("look up the holders of addresses in "+subnetID, err)
			}
			for _, e := range res.NetworkInterfaces {
				h := cloud.Holder{
					InterfaceID:      sdkaws.ToString(e.NetworkInterfaceId),
					Type:             string(e.InterfaceType),
					Description:      sdkaws.ToString(e.Description),
					RequesterID:      sdkaws.ToString(e.RequesterId),
					RequesterManaged: sdkaws.ToBool(e.RequesterManaged),
				}
				if e.Attachment != nil {
					h.InstanceID = sdkaws.ToString(e.Attachment.InstanceId)
				}
				for _, a := range e.PrivateIpAddresses {
					ip, err := netip.ParseAddr(sdkaws.ToString(a.PrivateIpAddress))
					if err != nil || !want[ip] {
						continue
					}
					hh := h
					hh.Primary = sdkaws.ToBool(a.Primary)
					out[ip] = hh
				}
			}
		}
	}
	return out, nil
}

// AssignFree implements cloud.AddressLookup with one
// AssignPrivateIpAddresses call without AllowReassignment: EC2 refuses
// (InvalidIPAddress.InUse, wrapped as cloud.ErrInUse) rather than take an
// address from another interface.
func (p *Provider) AssignFree(ctx context.Context, interfaceID string, ips []netip.Addr) error {
	if len(ips) == 0 {
		return nil
	}
	_, err := p.client.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{
		NetworkInterfaceId: sdkaws.String(interfaceID),
		PrivateIpAddresses: addrStrings(ips),
		AllowReassignment:  sdkaws.Bool(false),
	})
	return mapError("assign free addresses to "+interfaceID, err)
}
