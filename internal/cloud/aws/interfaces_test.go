package aws

import (
	"errors"
	"strings"
	"testing"

	"github.com/egressip/egressip/internal/cloud"
	"github.com/egressip/egressip/internal/cloud/aws/ec2emu"
)

// The InterfaceManager methods against the emulator: an interface created
// with tags and groups, attached with DeleteOnTermination, found by tag,
// deleted (detach, wait, delete); a missing permission names the IAM
// action; a full instance is ErrInterfaceLimit.
func TestInterfaceManager(t *testing.T) {
	e := newEnv(t, ec2emu.Config{}, Options{})
	a := e.instance(t, "t3.micro") // 2 interfaces
	tags := map[string]string{ec2emu.NoManageTag: "true", "egressip.io/cluster": "c1"}
	eni, err := e.p.CreateInterface(ctx(t), cloud.InterfaceSpec{SubnetID: e.subnet, Groups: []string{ec2emu.DefaultSecurityGroup}, Tags: tags, Description: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if eni.ID == "" || eni.MAC == "" || eni.InstanceID != "" || eni.Tags["egressip.io/cluster"] != "c1" {
		t.Fatalf("created %+v", eni)
	}
	att, err := e.p.AttachInterface(ctx(t), eni.ID, a.ID, 1)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := e.emu.Interface(eni.ID)
	if !st.Attached || st.DeviceIndex != 1 || !st.DeleteOnTermination {
		t.Fatalf("after attach: %+v", st)
	}
	second, err := e.p.CreateInterface(ctx(t), cloud.InterfaceSpec{SubnetID: e.subnet, Tags: tags})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.p.AttachInterface(ctx(t), second.ID, a.ID, 2); !errors.Is(err, cloud.ErrInterfaceLimit) {
		t.Fatalf("attach beyond the limit: %v, want ErrInterfaceLimit", err)
	}
	got, err := e.p.TaggedInterfaces(ctx(t), map[string]string{"egressip.io/cluster": "c1"})
	if err != nil || len(got) != 2 {
		t.Fatalf("TaggedInterfaces: %v, %+v", err, got)
	}
	for _, g := range got {
		if g.ID == eni.ID && (g.InstanceID != a.ID || g.AttachmentID != att) {
			t.Fatalf("tagged listing %+v, want attached to %s as %s", g, a.ID, att)
		}
	}
	if err := e.p.DeleteInterface(ctx(t), eni.ID, att); err != nil {
		t.Fatal(err)
	}
	if err := e.p.DeleteInterface(ctx(t), second.ID, ""); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.emu.Interface(eni.ID); ok {
		t.Fatal("interface not deleted")
	}
	zones, err := e.p.SubnetZones(ctx(t), []string{e.subnet})
	if err != nil || zones[e.subnet].Zone != e.emu.Region()+"a" || zones[e.subnet].VPCID != "vpc-emu" {
		t.Fatalf("SubnetZones: %v %+v", err, zones)
	}
	if _, err := e.p.SubnetZones(ctx(t), []string{"subnet-0badc0de"}); !errors.Is(err, cloud.ErrNotFound) {
		t.Fatalf("unknown subnet: %v", err)
	}
	e.emu.Deny("CreateNetworkInterface")
	_, err = e.p.CreateInterface(ctx(t), cloud.InterfaceSpec{SubnetID: e.subnet})
	if !errors.Is(err, cloud.ErrUnauthorized) || !strings.Contains(err.Error(), "the IAM policy lacks ec2:CreateNetworkInterface") {
		t.Fatalf("denied create: %v", err)
	}
}
