package aws

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/egressip/egressip/internal/cloud"
)

// The ENI life cycle of cloud.InterfaceManager. IAM: ec2:CreateNetworkInterface
// and ec2:CreateTags (tags are set in the create call, TagSpecifications),
// ec2:AttachNetworkInterface, ec2:ModifyNetworkInterfaceAttribute,
// ec2:DetachNetworkInterface, ec2:DeleteNetworkInterface and
// ec2:DescribeNetworkInterfaces.

var _ cloud.InterfaceManager = (*Provider)(nil)

// detachWait bounds how long DeleteInterface waits for a detached
// interface to become available (EC2 detaches in seconds).
const detachWait = 2 * time.Minute

// otherInterfaces lists an instance's attached interfaces other than the
// one at device index 0 of network card 0, sorted by device index.
func otherInterfaces(in types.Instance) []cloud.ENI {
	var out []cloud.ENI
	for _, e := range in.NetworkInterfaces {
		if e.Attachment == nil || sdkaws.ToInt32(e.Attachment.NetworkCardIndex) != 0 || sdkaws.ToInt32(e.Attachment.DeviceIndex) == 0 {
			continue
		}
		x := cloud.ENI{
			ID:           sdkaws.ToString(e.NetworkInterfaceId),
			MAC:          strings.ToLower(sdkaws.ToString(e.MacAddress)),
			SubnetID:     sdkaws.ToString(e.SubnetId),
			InstanceID:   sdkaws.ToString(in.InstanceId),
			DeviceIndex:  int(sdkaws.ToInt32(e.Attachment.DeviceIndex)),
			AttachmentID: sdkaws.ToString(e.Attachment.AttachmentId),
			Secondary:    secondaryOf(e.PrivateIpAddresses),
		}
		// DescribeInstances carries no interface tags: the caller reads
		// them with DescribeNetworkInterfaces (withTags).
		out = append(out, x)
	}
	slices.SortFunc(out, func(a, b cloud.ENI) int { return a.DeviceIndex - b.DeviceIndex })
	return out
}

func secondaryOf(list []types.InstancePrivateIpAddress) []netip.Addr {
	var out []netip.Addr
	for _, a := range list {
		if sdkaws.ToBool(a.Primary) {
			continue
		}
		if ip, err := netip.ParseAddr(sdkaws.ToString(a.PrivateIpAddress)); err == nil {
			out = append(out, ip)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// eniOf converts a DescribeNetworkInterfaces item.
func eniOf(e types.NetworkInterface) cloud.ENI {
	x := cloud.ENI{
		ID:          sdkaws.ToString(e.NetworkInterfaceId),
		MAC:         strings.ToLower(sdkaws.ToString(e.MacAddress)),
		SubnetID:    sdkaws.ToString(e.SubnetId),
		DeviceIndex: -1,
		Tags:        map[string]string{},
	}
	if a := e.Attachment; a != nil && e.Status != types.NetworkInterfaceStatusAvailable {
		x.InstanceID = sdkaws.ToString(a.InstanceId)
		x.DeviceIndex = int(sdkaws.ToInt32(a.DeviceIndex))
		x.AttachmentID = sdkaws.ToString(a.AttachmentId)
	}
	for _, t := range e.TagSet {
		x.Tags[sdkaws.ToString(t.Key)] = sdkaws.ToString(t.Value)
	}
	for _, a := range e.PrivateIpAddresses {
		if sdkaws.ToBool(a.Primary) {
			continue
		}
		if ip, err := netip.ParseAddr(sdkaws.ToString(a.PrivateIpAddress)); err == nil {
			x.Secondary = append(x.Secondary, ip)
		}
	}
	slices.SortFunc(x.Secondary, netip.Addr.Compare)
	return x
}

// CreateInterface implements cloud.InterfaceManager with one
// CreateNetworkInterface call that sets the tags too.
func (p *Provider) CreateInterface(ctx context.Context, spec cloud.InterfaceSpec) (cloud.ENI, error) {
	in := &ec2.CreateNetworkInterfaceInput{
		SubnetId: sdkaws.String(spec.SubnetID),
		Groups:   spec.Groups,
	}
	if spec.Description != "" {
		in.Description = sdkaws.String(spec.Description)
	}
	if len(spec.Tags) > 0 {
		ts := types.TagSpecification{ResourceType: types.ResourceTypeNetworkInterface}
		for _, k := range slices.Sorted(maps.Keys(spec.Tags)) {
			ts.Tags = append(ts.Tags, types.Tag{Key: sdkaws.String(k), Value: sdkaws.String(spec.Tags[k])})
		}
		in.TagSpecifications = []types.TagSpecification{ts}
	}
	out, err := p.client.CreateNetworkInterface(ctx, in)
	if err != nil {
		return cloud.ENI{}, mapError("create network interface in "+spec.SubnetID, err)
	}
	if out.NetworkInterface == nil {
		return cloud.ENI{}, fmt.Errorf("create network interface in %s: EC2 returned no interface", spec.SubnetID)
	}
	return eniOf(*out.NetworkInterface), nil
}

// AttachInterface implements cloud.InterfaceManager: AttachNetworkInterface
// on network card 0, then ModifyNetworkInterfaceAttribute to set
// DeleteOnTermination (AttachNetworkInterface cannot), so the interface
// goes with its instance.
func (p *Provider) AttachInterface(ctx context.Context, interfaceID, instanceID string, deviceIndex int) (string, error) {
	out, err := p.client.AttachNetworkInterface(ctx, &ec2.AttachNetworkInterfaceInput{
		NetworkInterfaceId: sdkaws.String(interfaceID),
		InstanceId:         sdkaws.String(instanceID),
		DeviceIndex:        sdkaws.Int32(int32(deviceIndex)),
		NetworkCardIndex:   sdkaws.Int32(0),
	})
	if err != nil {
		return "", mapError(fmt.Sprintf("attach %s to %s at device index %d", interfaceID, instanceID, deviceIndex), err)
	}
	att := sdkaws.ToString(out.AttachmentId)
	_, err = p.client.ModifyNetworkInterfaceAttribute(ctx, &ec2.ModifyNetworkInterfaceAttributeInput{
		NetworkInterfaceId: sdkaws.String(interfaceID),
		Attachment:         &types.NetworkInterfaceAttachmentChanges{AttachmentId: sdkaws.String(att), DeleteOnTermination: sdkaws.Bool(true)},
	})
	if err != nil {
		return att, mapError("set DeleteOnTermination on "+interfaceID, err)
	}
	return att, nil
}

// DeleteInterface implements cloud.InterfaceManager: DetachNetworkInterface
// when attached, a wait until EC2 reports it available, then
// DeleteNetworkInterface. An interface that no longer exists is done.
func (p *Provider) DeleteInterface(ctx context.Context, interfaceID, attachmentID string) error {
	if attachmentID != "" {
		_, err := p.client.DetachNetworkInterface(ctx, &ec2.DetachNetworkInterfaceInput{AttachmentId: sdkaws.String(attachmentID)})
		if err := mapError("detach "+interfaceID, err); err != nil && !errors.Is(err, cloud.ErrNotFound) {
			return err
		}
		w := ec2.NewNetworkInterfaceAvailableWaiter(p.client, func(o *ec2.NetworkInterfaceAvailableWaiterOptions) {
			o.MinDelay, o.MaxDelay = 500*time.Millisecond, 5*time.Second
		})
		if err := w.Wait(ctx, &ec2.DescribeNetworkInterfacesInput{NetworkInterfaceIds: []string{interfaceID}}, detachWait); err != nil {
			if err := mapError("wait for "+interfaceID+" to detach", err); !errors.Is(err, cloud.ErrNotFound) {
				return err
			}
			return nil
		}
	}
	_, err := p.client.DeleteNetworkInterface(ctx, &ec2.DeleteNetworkInterfaceInput{NetworkInterfaceId: sdkaws.String(interfaceID)})
	if err := mapError("delete "+interfaceID, err); err != nil && !errors.Is(err, cloud.ErrNotFound) {
		return err
	}
	return nil
}

// TaggedInterfaces implements cloud.InterfaceManager with paginated
// DescribeNetworkInterfaces calls filtered by tag:<key>=<value>.
func (p *Provider) TaggedInterfaces(ctx context.Context, tags map[string]string) ([]cloud.ENI, error) {
	fs := make([]types.Filter, 0, len(tags))
	for _, k := range slices.Sorted(maps.Keys(tags)) {
		fs = append(fs, types.Filter{Name: sdkaws.String("tag:" + k), Values: []string{tags[k]}})
	}
	pages := ec2.NewDescribeNetworkInterfacesPaginator(p.client, &ec2.DescribeNetworkInterfacesInput{Filters: fs, MaxResults: sdkaws.Int32(pageSize)})
	var out []cloud.ENI
	for pages.HasMorePages() {
		res, err := pages.NextPage(ctx)
		if err != nil {
			return nil, mapError("describe network interfaces by tag", err)
		}
		for _, e := range res.NetworkInterfaces {
			out = append(out, eniOf(e))
		}
	}
	slices.SortFunc(out, func(a, b cloud.ENI) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// SubnetZones implements cloud.InterfaceManager with DescribeSubnets.
func (p *Provider) SubnetZones(ctx context.Context, ids []string) (map[string]cloud.Subnet, error) {
	out := make(map[string]cloud.Subnet, len(ids))
	for chunk := range slices.Chunk(slices.Compact(slices.Sorted(slices.Values(ids))), maxFilterValues) {
		pages := ec2.NewDescribeSubnetsPaginator(p.client, &ec2.DescribeSubnetsInput{SubnetIds: chunk})
		for pages.HasMorePages() {
			res, err := pages.NextPage(ctx)
			if err != nil {
				return nil, mapError("describe subnets", err)
			}
			for _, s := range res.Subnets {
				out[sdkaws.ToString(s.SubnetId)] = cloud.Subnet{ID: sdkaws.ToString(s.SubnetId), VPCID: sdkaws.ToString(s.VpcId), Zone: sdkaws.ToString(s.AvailabilityZone)}
			}
		}
	}
	return out, nil
}
