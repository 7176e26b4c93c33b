package ec2emu_test

import (
	"context"
	"net/netip"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/egressip/egressip/internal/cloud/aws/ec2emu"
)

// The interface life cycle through the real SDK: create with tags and a
// security group, attach at the next device index, DeleteOnTermination,
// the instance's interface limit, in-use deletion refused, detach and
// delete; and the errors of bad input.
func TestENILifeCycle(t *testing.T) {
	s, c, subnet := setup(t, ec2emu.Config{})
	ctx := context.Background()
	in := must[ec2emu.InstanceInfo](t)(s.AddInstance(ec2emu.Instance{Type: "t3.medium", SubnetID: subnet})) // 3 interfaces

	_, err := c.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{SubnetId: aws.String(subnet), Groups: []string{"sg-0000000000000bad"}})
	wantCode(t, err, "InvalidGroup.NotFound", 400)
	_, err = c.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{SubnetId: aws.String("subnet-0000dead")})
	wantCode(t, err, "InvalidSubnetID.NotFound", 400)

	create := func() string {
		out, err := c.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{
			SubnetId: aws.String(subnet), Groups: []string{ec2emu.DefaultSecurityGroup},
			TagSpecifications: []types.TagSpecification{{ResourceType: types.ResourceTypeNetworkInterface, Tags: []types.Tag{
				{Key: aws.String(ec2emu.NoManageTag), Value: aws.String("true")}, {Key: aws.String("egressip.io/cluster"), Value: aws.String("c1")}}}},
		})
		if err != nil {
			t.Fatal(err)
		}
		if out.NetworkInterface.Status != types.NetworkInterfaceStatusAvailable || len(out.NetworkInterface.TagSet) != 2 {
			t.Fatalf("created %+v", out.NetworkInterface)
		}
		return aws.ToString(out.NetworkInterface.NetworkInterfaceId)
	}
	a, b, x := create(), create(), create()
	attach := func(id string, dev int32) (string, error) {
		out, err := c.AttachNetworkInterface(ctx, &ec2.AttachNetworkInterfaceInput{NetworkInterfaceId: aws.String(id), InstanceId: aws.String(in.ID), DeviceIndex: aws.Int32(dev)})
		if err != nil {
			return "", err
		}
		return aws.ToString(out.AttachmentId), nil
	}
	attA := must[string](t)(attach(a, 1))
	_, err = attach(b, 1)
	wantCode(t, err, "InvalidParameterValue", 400) // device index in use
	attB := must[string](t)(attach(b, 2))
	_, err = attach(x, 3)
	wantCode(t, err, "AttachmentLimitExceeded", 400)
	if _, err := c.ModifyNetworkInterfaceAttribute(ctx, &ec2.ModifyNetworkInterfaceAttributeInput{NetworkInterfaceId: aws.String(a),
		Attachment: &types.NetworkInterfaceAttachmentChanges{AttachmentId: aws.String(attA), DeleteOnTermination: aws.Bool(true)}}); err != nil {
		t.Fatal(err)
	}
	tagged, err := c.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{Filters: []types.Filter{{Name: aws.String("tag:egressip.io/cluster"), Values: []string{"c1"}}}})
	if err != nil || len(tagged.NetworkInterfaces) != 3 {
		t.Fatalf("tag filter: %v, %d interfaces, want 3", err, len(tagged.NetworkInterfaces))
	}
	_, err = c.DeleteNetworkInterface(ctx, &ec2.DeleteNetworkInterfaceInput{NetworkInterfaceId: aws.String(b)})
	wantCode(t, err, "InvalidNetworkInterface.InUse", 400)
	if _, err := c.DetachNetworkInterface(ctx, &ec2.DetachNetworkInterfaceInput{AttachmentId: aws.String(attB)}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.DeleteNetworkInterface(ctx, &ec2.DeleteNetworkInterfaceInput{NetworkInterfaceId: aws.String(b)}); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Interface(b); ok {
		t.Fatal("deleted interface still exists")
	}
	// Terminating deletes the interfaces with DeleteOnTermination (the
	// primary and a); x was never attached and stays.
	if err := s.Terminate(in.ID); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Interface(a); ok {
		t.Fatal("interface with DeleteOnTermination survived its instance")
	}
	if st, ok := s.Interface(x); !ok || st.Attached {
		t.Fatalf("detached interface: %+v, %v", st, ok)
	}
	s.Deny("CreateNetworkInterface")
	_, err = c.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{SubnetId: aws.String(subnet)})
	wantCode(t, err, "UnauthorizedOperation", 403)
}

// The ipamd actor adopts unknown secondary addresses on managed
// interfaces (the primary always), never on one tagged no_manage=true, and
// in warm-IP mode releases the free ones above its target.
func TestIpamdActorAdoptsAndReleases(t *testing.T) {
	s, _, subnet := setup(t, ec2emu.Config{})
	in := must[ec2emu.InstanceInfo](t)(s.AddInstance(ec2emu.Instance{Type: "m5.large", SubnetID: subnet}))
	ours := must[string](t)(s.AddInterface(in.ID, ec2emu.InterfaceOptions{Tags: map[string]string{ec2emu.NoManageTag: "true"}}))
	cni := must[string](t)(s.AddInterface(in.ID, ec2emu.InterfaceOptions{}))
	a := must[*ec2emu.Ipamd](t)(s.NewIpamd(ec2emu.IpamdConfig{InstanceID: in.ID, WarmIPTarget: 1}))
	a.Step() // fills its warm pool: one address
	if len(a.Pool()) != 1 {
		t.Fatalf("pool %v after the first reconcile, want 1 warm address", a.Pool())
	}
	onPrimary := must[[]netip.Addr](t)(s.UseSlots(in.PrimaryInterface, 2))
	onOurs := must[[]netip.Addr](t)(s.UseSlots(ours, 2))
	onCNI := must[[]netip.Addr](t)(s.UseSlots(cni, 1))
	adopted, freed := a.Step()
	got := map[netip.Addr]bool{}
	for _, x := range adopted {
		got[x.Addr] = true
	}
	for _, ip := range append(onPrimary, onCNI...) {
		if !got[ip] {
			t.Errorf("%s on a managed interface not adopted (%v)", ip, adopted)
		}
	}
	for _, ip := range onOurs {
		if got[ip] {
			t.Errorf("%s on the no_manage interface adopted", ip)
		}
	}
	// 4 free, target 1: three released, none of them from ours.
	if len(freed) != 3 {
		t.Fatalf("freed %v, want 3", freed)
	}
	if st, _ := s.Interface(ours); len(st.Secondary) != 2 {
		t.Fatalf("the no_manage interface lost addresses: %v", st.Secondary)
	}
}
