package controller

import (
	"net/netip"
	"testing"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/cloud"
)

// TestCloudCapacityFigure computes a Node's egress-IP capacity in
// OwnInterfaces mode on an instance type of 3 ENIs x 10 addresses.
func TestCloudCapacityFigure(t *testing.T) {
	ours := func(id string, dev int, n int) cloud.ENI {
		e := cloud.ENI{ID: id, DeviceIndex: dev, Tags: map[string]string{TagCluster: "egressip", TagNoManage: "true", TagNode: "a", TagPool: "p"}}
		for i := range n {
			e.Secondary = append(e.Secondary, netip.AddrFrom4([4]byte{10, 0, byte(dev), byte(10 + i)}))
		}
		return e
	}
	cni := cloud.ENI{ID: "eni-cni", DeviceIndex: 1, Tags: map[string]string{"node.k8s.amazonaws.com/instance_id": "i-1"}}
	for _, tc := range []struct {
		name   string
		others []cloud.ENI
		maxPer int32
		want   int
	}{
		// The primary ENI is the CNI's: 2 ENIs of ours may attach, 9
		// secondary addresses each.
		{"primary only the CNI's", nil, 0, 18},
		{"maxInterfacesPerNode 1", nil, 1, 9},
		// The CNI attached a second ENI: one slot left for us.
		{"CNI has a second ENI", []cloud.ENI{cni}, 0, 9},
		// One ENI of ours with 4 warm addresses (not allocated), one to
		// attach: (9 - 4) + 9.
		{"one of ours with 4 warm", []cloud.ENI{ours("eni-1", 1, 4)}, 0, 14},
		{"both of ours attached, both full of warm", []cloud.ENI{ours("eni-1", 1, 9), ours("eni-2", 2, 9)}, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ci := &cloudInput{Cluster: "egressip", Manage: true,
				Subnets: map[string]cloud.Subnet{"subnet-01234567": {ID: "subnet-01234567", VPCID: "vpc-1", Zone: "z1"}},
				Ifaces: map[string]cloud.Interface{"a": {Node: "a", InstanceID: "i-1", ID: "eni-primary", Limit: 10, MaxInterfaces: 3,
					VPCID: "vpc-1", Zone: "z1", SubnetID: "subnet-other", Others: tc.others}}}
			p := &v1.ExternalIPPool{}
			p.Name = "p"
			p.Spec.Cloud = &v1.CloudPool{Provider: v1.CloudProviderAWS, AWS: &v1.AWSPool{SubnetID: "subnet-01234567", MaxInterfacesPerNode: tc.maxPer}}
			cp := newCloudPool(p, ci, nil)
			got, ok := nodeCloudCapacity(ci, newENIView(ci), "a", []*cloudPool{cp})
			if !ok || got != tc.want {
				t.Fatalf("capacity %d (ok %v), want %d", got, ok, tc.want)
			}
		})
	}
}
