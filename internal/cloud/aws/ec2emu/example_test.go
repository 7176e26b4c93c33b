package ec2emu_test

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/egressip/egressip/internal/cloud/aws/ec2emu"
)

// An emulated EC2 with 200 ms per call and 20 calls per second, driven by
// the real SDK client.
func Example() {
	emu := ec2emu.New(ec2emu.Config{Latency: map[string]time.Duration{"*": 200 * time.Millisecond}, Rate: 20, Burst: 20})
	defer emu.Close()
	subnet, _ := emu.AddSubnet(ec2emu.Subnet{CIDR: netip.MustParsePrefix("10.0.0.0/24")})
	node, _ := emu.AddInstance(ec2emu.Instance{Type: "m5.large", SubnetID: subnet})
	_, _ = emu.UseSlots(node.PrimaryInterface, 2) // the VPC CNI's Pod IPs

	client := ec2.NewFromConfig(emu.AWSConfig())
	out, err := client.AssignPrivateIpAddresses(context.Background(), &ec2.AssignPrivateIpAddressesInput{
		NetworkInterfaceId:             aws.String(node.PrimaryInterface),
		SecondaryPrivateIpAddressCount: aws.Int32(3),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, a := range out.AssignedPrivateIpAddresses {
		fmt.Println(*a.PrivateIpAddress)
	}
	st, _ := emu.Interface(node.PrimaryInterface)
	fmt.Println(node.ProviderID != "", st.Primary, len(st.Secondary), emu.Counts()["AssignPrivateIpAddresses"])
	// Output:
	// 10.0.0.7
	// 10.0.0.8
	// 10.0.0.9
	// true 10.0.0.4 5 map[Success:1]
}
