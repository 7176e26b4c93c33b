package ec2emu_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/egressip/egressip/internal/cloud/aws/ec2emu"
)

// client is the real SDK client on the emulator, without retries so each
// call is one request.
func client(s *ec2emu.Server, secret string) *ec2.Client {
	return ec2.New(ec2.Options{
		Region:       s.Region(),
		Credentials:  credentials.NewStaticCredentialsProvider(ec2emu.AccessKeyID, secret, ""),
		BaseEndpoint: aws.String(s.URL()),
		Retryer:      aws.NopRetryer{},
	})
}

func setup(t *testing.T, cfg ec2emu.Config) (*ec2emu.Server, *ec2.Client, string) {
	t.Helper()
	s := ec2emu.New(cfg)
	t.Cleanup(s.Close)
	subnet, err := s.AddSubnet(ec2emu.Subnet{CIDR: netip.MustParsePrefix("10.1.0.0/24")})
	if err != nil {
		t.Fatal(err)
	}
	return s, client(s, ec2emu.SecretAccessKey), subnet
}

func must[T any](t *testing.T) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// wantCode asserts that err is an EC2 API error with the code and HTTP
// status.
func wantCode(t *testing.T, err error, code string, status int) {
	t.Helper()
	var ae smithy.APIError
	if !errors.As(err, &ae) || ae.ErrorCode() != code {
		t.Fatalf("error %v: want EC2 code %s", err, code)
	}
	var re *awshttp.ResponseError
	if !errors.As(err, &re) || re.HTTPStatusCode() != status {
		t.Fatalf("error %v: want HTTP status %d", err, status)
	}
	if re.ServiceRequestID() == "" {
		t.Fatalf("error %v carries no request ID", err)
	}
}

// Instance types and an address the tests use repeatedly.
const (
	t3medium  = "t3.medium"
	m5large   = "m5.large"
	c54xlarge = "c5.4xlarge"
	moved     = "10.1.0.50"
)

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return c
}

func TestSignatureIsChecked(t *testing.T) {
	s, good, _ := setup(t, ec2emu.Config{})
	if _, err := good.DescribeSubnets(ctx(t), &ec2.DescribeSubnetsInput{}); err != nil {
		t.Fatalf("correctly signed call: %v", err)
	}
	_, err := client(s, "wrong-secret").DescribeSubnets(ctx(t), &ec2.DescribeSubnetsInput{})
	wantCode(t, err, "AuthFailure", 401)
	other := ec2.New(ec2.Options{
		Region:       "eu-west-1",
		Credentials:  credentials.NewStaticCredentialsProvider(ec2emu.AccessKeyID, ec2emu.SecretAccessKey, ""),
		BaseEndpoint: aws.String(s.URL()),
		Retryer:      aws.NopRetryer{},
	})
	_, err = other.DescribeSubnets(ctx(t), &ec2.DescribeSubnetsInput{})
	wantCode(t, err, "AuthFailure", 401)
	if got := s.Counts()["DescribeSubnets"]; got[ec2emu.Success] != 1 || got["AuthFailure"] != 2 {
		t.Fatalf("counts %v: want 1 Success and 2 AuthFailure", got)
	}
}

func TestDescribeInstances(t *testing.T) {
	s, c, subnet := setup(t, ec2emu.Config{})
	ids := make([]string, 0, 12)
	for range 12 {
		ids = append(ids, must[ec2emu.InstanceInfo](t)(s.AddInstance(ec2emu.Instance{Type: t3medium, SubnetID: subnet})).ID)
	}
	second := must[string](t)(s.AddInterface(ids[0], ec2emu.InterfaceOptions{ListFirst: true}))

	// Named IDs: any unknown one fails the whole call, as in EC2.
	_, err := c.DescribeInstances(ctx(t), &ec2.DescribeInstancesInput{InstanceIds: []string{ids[0], "i-0123456789abcdef0"}})
	wantCode(t, err, "InvalidInstanceID.NotFound", 400)
	_, err = c.DescribeInstances(ctx(t), &ec2.DescribeInstancesInput{InstanceIds: []string{"i-xyz"}})
	wantCode(t, err, "InvalidInstanceID.Malformed", 400)

	// The instance-id filter just leaves unknown ones out.
	out := must[*ec2.DescribeInstancesOutput](t)(c.DescribeInstances(ctx(t), &ec2.DescribeInstancesInput{
		Filters: []types.Filter{{Name: aws.String("instance-id"), Values: []string{ids[0], ids[3], "i-0123456789abcdef0"}}},
	}))
	var got []string
	for _, r := range out.Reservations {
		for _, in := range r.Instances {
			got = append(got, *in.InstanceId)
		}
	}
	if !slices.Equal(got, []string{ids[0], ids[3]}) {
		t.Fatalf("filtered DescribeInstances returned %v, want %v", got, []string{ids[0], ids[3]})
	}
	first := out.Reservations[0].Instances[0]
	if len(first.NetworkInterfaces) != 2 || *first.NetworkInterfaces[0].NetworkInterfaceId != second ||
		*first.NetworkInterfaces[0].Attachment.DeviceIndex != 1 || *first.NetworkInterfaces[1].Attachment.DeviceIndex != 0 {
		t.Fatalf("interfaces of %s: want the device-1 interface %s listed first, got %+v", ids[0], second, first.NetworkInterfaces)
	}
	if first.State.Name != types.InstanceStateNameRunning || first.InstanceType != t3medium {
		t.Fatalf("instance %s: state %s type %s", ids[0], first.State.Name, first.InstanceType)
	}

	// Pagination: 12 instances, 5 per page, 3 calls.
	s.ResetCounts()
	pages := ec2.NewDescribeInstancesPaginator(c, &ec2.DescribeInstancesInput{MaxResults: aws.Int32(5)})
	n := 0
	for pages.HasMorePages() {
		p := must[*ec2.DescribeInstancesOutput](t)(pages.NextPage(ctx(t)))
		n += len(p.Reservations)
	}
	if n != 12 || s.Calls("DescribeInstances") != 3 {
		t.Fatalf("paginated: %d instances in %d calls, want 12 in 3", n, s.Calls("DescribeInstances"))
	}

	// EC2 takes at most 200 filter values per call.
	many := make([]string, 201)
	for i := range many {
		many[i] = fmt.Sprintf("i-%017x", i)
	}
	_, err = c.DescribeInstances(ctx(t), &ec2.DescribeInstancesInput{Filters: []types.Filter{{Name: aws.String("instance-id"), Values: many}}})
	wantCode(t, err, "FilterLimitExceeded", 400)

	// Terminated instances stay listed, without interfaces.
	if err := s.Terminate(ids[1]); err != nil {
		t.Fatal(err)
	}
	out = must[*ec2.DescribeInstancesOutput](t)(c.DescribeInstances(ctx(t), &ec2.DescribeInstancesInput{InstanceIds: ids[1:2]}))
	if in := out.Reservations[0].Instances[0]; in.State.Name != types.InstanceStateNameTerminated || len(in.NetworkInterfaces) != 0 {
		t.Fatalf("terminated instance: state %s, %d interfaces", in.State.Name, len(in.NetworkInterfaces))
	}
}

func TestDescribeNetworkInterfacesAndSubnets(t *testing.T) {
	s, c, subnet := setup(t, ec2emu.Config{})
	other := must[string](t)(s.AddSubnet(ec2emu.Subnet{CIDR: netip.MustParsePrefix("10.2.0.0/28")}))
	a := must[ec2emu.InstanceInfo](t)(s.AddInstance(ec2emu.Instance{Type: m5large, SubnetID: subnet}))
	b := must[ec2emu.InstanceInfo](t)(s.AddInstance(ec2emu.Instance{Type: m5large, SubnetID: subnet}))
	aOther := must[string](t)(s.AddInterface(a.ID, ec2emu.InterfaceOptions{SubnetID: other}))
	pods := must[[]netip.Addr](t)(s.UseSlots(a.PrimaryInterface, 3))

	byInstance := must[*ec2.DescribeNetworkInterfacesOutput](t)(c.DescribeNetworkInterfaces(ctx(t), &ec2.DescribeNetworkInterfacesInput{
		Filters: []types.Filter{{Name: aws.String("attachment.instance-id"), Values: []string{a.ID}}},
	}))
	if len(byInstance.NetworkInterfaces) != 2 {
		t.Fatalf("interfaces of %s: %d, want 2", a.ID, len(byInstance.NetworkInterfaces))
	}
	p := byInstance.NetworkInterfaces[0]
	if *p.NetworkInterfaceId != a.PrimaryInterface || *p.MacAddress != a.MAC || *p.Attachment.InstanceId != a.ID || *p.PrivateIpAddress != a.PrivateIP.String() {
		t.Fatalf("primary interface: %+v", p)
	}
	var secondary []string
	for _, ip := range p.PrivateIpAddresses {
		if !*ip.Primary {
			secondary = append(secondary, *ip.PrivateIpAddress)
		}
	}
	if want := []string{pods[0].String(), pods[1].String(), pods[2].String()}; !slices.Equal(secondary, want) {
		t.Fatalf("secondary addresses %v, want %v", secondary, want)
	}

	bySubnet := must[*ec2.DescribeNetworkInterfacesOutput](t)(c.DescribeNetworkInterfaces(ctx(t), &ec2.DescribeNetworkInterfacesInput{
		Filters: []types.Filter{{Name: aws.String("subnet-id"), Values: []string{other}}},
	}))
	if len(bySubnet.NetworkInterfaces) != 1 || *bySubnet.NetworkInterfaces[0].NetworkInterfaceId != aOther {
		t.Fatalf("interfaces in %s: %+v, want only %s", other, bySubnet.NetworkInterfaces, aOther)
	}
	byID := must[*ec2.DescribeNetworkInterfacesOutput](t)(c.DescribeNetworkInterfaces(ctx(t), &ec2.DescribeNetworkInterfacesInput{
		NetworkInterfaceIds: []string{b.PrimaryInterface},
	}))
	if len(byID.NetworkInterfaces) != 1 || *byID.NetworkInterfaces[0].Attachment.InstanceId != b.ID {
		t.Fatalf("interface %s: %+v", b.PrimaryInterface, byID.NetworkInterfaces)
	}
	_, err := c.DescribeNetworkInterfaces(ctx(t), &ec2.DescribeNetworkInterfacesInput{NetworkInterfaceIds: []string{"eni-0123456789abcdef0"}})
	wantCode(t, err, "InvalidNetworkInterfaceID.NotFound", 400)

	subnets := must[*ec2.DescribeSubnetsOutput](t)(c.DescribeSubnets(ctx(t), &ec2.DescribeSubnetsInput{SubnetIds: []string{subnet, other}}))
	free := map[string]int32{}
	for _, sn := range subnets.Subnets {
		free[*sn.SubnetId] = *sn.AvailableIpAddressCount
	}
	// /24: 256-5 usable, minus 2 primaries and 3 Pod IPs; /28: 16-5-1.
	if free[subnet] != 246 || free[other] != 10 || s.FreeAddresses(subnet) != 246 {
		t.Fatalf("free addresses %v (true %d), want %s:246 %s:10", free, s.FreeAddresses(subnet), subnet, other)
	}
	_, err = c.DescribeSubnets(ctx(t), &ec2.DescribeSubnetsInput{SubnetIds: []string{"subnet-nope"}})
	wantCode(t, err, "InvalidSubnetID.NotFound", 400)
}

func TestDescribeInstanceTypes(t *testing.T) {
	_, c, _ := setup(t, ec2emu.Config{})
	out := must[*ec2.DescribeInstanceTypesOutput](t)(c.DescribeInstanceTypes(ctx(t), &ec2.DescribeInstanceTypesInput{
		InstanceTypes: []types.InstanceType{"c5.4xlarge", "t3.medium"},
	}))
	got := map[types.InstanceType][2]int32{}
	for _, it := range out.InstanceTypes {
		got[it.InstanceType] = [2]int32{*it.NetworkInfo.MaximumNetworkInterfaces, *it.NetworkInfo.Ipv4AddressesPerInterface}
	}
	if want := map[types.InstanceType][2]int32{"c5.4xlarge": {8, 30}, "t3.medium": {3, 6}}; !equalMaps(got, want) {
		t.Fatalf("instance types %v, want %v", got, want)
	}
	_, err := c.DescribeInstanceTypes(ctx(t), &ec2.DescribeInstanceTypesInput{InstanceTypes: []types.InstanceType{"x9.huge"}})
	wantCode(t, err, "InvalidInstanceType", 400)
}

func equalMaps[K comparable, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func TestAssignRules(t *testing.T) {
	s, c, subnet := setup(t, ec2emu.Config{})
	a := must[ec2emu.InstanceInfo](t)(s.AddInstance(ec2emu.Instance{Type: t3medium, SubnetID: subnet}))
	b := must[ec2emu.InstanceInfo](t)(s.AddInstance(ec2emu.Instance{Type: t3medium, SubnetID: subnet}))
	assign := func(eni string, reassign bool, ips ...string) error {
		_, err := c.AssignPrivateIpAddresses(ctx(t), &ec2.AssignPrivateIpAddressesInput{
			NetworkInterfaceId: aws.String(eni), PrivateIpAddresses: ips, AllowReassignment: aws.Bool(reassign),
		})
		return err
	}
	if err := assign(a.PrimaryInterface, false, "10.1.0.100", "10.1.0.101"); err != nil {
		t.Fatal(err)
	}
	// Taken elsewhere: refused without AllowReassignment, moved with it.
	wantCode(t, assign(b.PrimaryInterface, false, "10.1.0.100"), "InvalidIPAddress.InUse", 400)
	if err := assign(b.PrimaryInterface, true, "10.1.0.100"); err != nil {
		t.Fatal(err)
	}
	if owner := s.Owner(subnet, netip.MustParseAddr("10.1.0.100")); owner != b.PrimaryInterface {
		t.Fatalf("10.1.0.100 is on %q after reassignment, want %s", owner, b.PrimaryInterface)
	}
	if st, _ := s.Interface(a.PrimaryInterface); !slices.Equal(st.Secondary, []netip.Addr{netip.MustParseAddr("10.1.0.101")}) {
		t.Fatalf("%s keeps %v, want only 10.1.0.101", a.PrimaryInterface, st.Secondary)
	}
	// Primary addresses never move; reserved and foreign addresses are refused.
	wantCode(t, assign(a.PrimaryInterface, true, b.PrivateIP.String()), "InvalidParameterValue", 400)
	wantCode(t, assign(a.PrimaryInterface, true, "10.1.0.1"), "InvalidParameterValue", 400)
	wantCode(t, assign(a.PrimaryInterface, true, "10.9.0.10"), "InvalidParameterValue", 400)
	wantCode(t, assign("eni-0123456789abcdef0", true, "10.1.0.10"), "InvalidNetworkInterfaceID.NotFound", 400)

	// t3.medium: 6 addresses per interface, the primary included; all or nothing.
	wantCode(t, assign(a.PrimaryInterface, true, "10.1.0.110", "10.1.0.111", "10.1.0.112", "10.1.0.113", "10.1.0.114"),
		"PrivateIpAddressLimitExceeded", 400)
	if st, _ := s.Interface(a.PrimaryInterface); len(st.Secondary) != 1 {
		t.Fatalf("a refused Assign left %v on the interface", st.Secondary)
	}
	out := must[*ec2.AssignPrivateIpAddressesOutput](t)(c.AssignPrivateIpAddresses(ctx(t), &ec2.AssignPrivateIpAddressesInput{
		NetworkInterfaceId: aws.String(a.PrimaryInterface), SecondaryPrivateIpAddressCount: aws.Int32(4),
	}))
	if len(out.AssignedPrivateIpAddresses) != 4 || *out.NetworkInterfaceId != a.PrimaryInterface {
		t.Fatalf("AssignPrivateIpAddresses by count: %+v", out)
	}
	_, err := c.AssignPrivateIpAddresses(ctx(t), &ec2.AssignPrivateIpAddressesInput{
		NetworkInterfaceId: aws.String(a.PrimaryInterface), SecondaryPrivateIpAddressCount: aws.Int32(1),
	})
	wantCode(t, err, "PrivateIpAddressLimitExceeded", 400)

	unassign := func(ips ...string) error {
		_, err := c.UnassignPrivateIpAddresses(ctx(t), &ec2.UnassignPrivateIpAddressesInput{NetworkInterfaceId: aws.String(a.PrimaryInterface), PrivateIpAddresses: ips})
		return err
	}
	wantCode(t, unassign("10.1.0.100"), "InvalidParameterValue", 400) // on b now
	wantCode(t, unassign(a.PrivateIP.String()), "InvalidParameterValue", 400)
	if err := unassign("10.1.0.101"); err != nil {
		t.Fatal(err)
	}
	if owner := s.Owner(subnet, netip.MustParseAddr("10.1.0.101")); owner != "" {
		t.Fatalf("10.1.0.101 still on %s after Unassign", owner)
	}
}

func TestSubnetExhaustion(t *testing.T) {
	s, c, _ := setup(t, ec2emu.Config{})
	small := must[string](t)(s.AddSubnet(ec2emu.Subnet{CIDR: netip.MustParsePrefix("10.3.0.0/28")}))
	enis := make([]string, 0, 2)
	for range 2 {
		in := must[ec2emu.InstanceInfo](t)(s.AddInstance(ec2emu.Instance{Type: c54xlarge, SubnetID: small}))
		enis = append(enis, in.PrimaryInterface)
	}
	// 11 usable addresses, 2 primaries: 9 left.
	if _, err := c.AssignPrivateIpAddresses(ctx(t), &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: &enis[0], SecondaryPrivateIpAddressCount: aws.Int32(7)}); err != nil {
		t.Fatal(err)
	}
	_, err := c.AssignPrivateIpAddresses(ctx(t), &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: &enis[1], SecondaryPrivateIpAddressCount: aws.Int32(3)})
	wantCode(t, err, "InsufficientFreeAddressesInSubnet", 400)
	held := 0
	for _, st := range s.Interfaces() {
		if st.SubnetID == small {
			held += 1 + len(st.Secondary)
		}
	}
	if held != 9 || s.FreeAddresses(small) != 2 {
		t.Fatalf("after a refused Assign: %d addresses held, %d free; want 9 and 2", held, s.FreeAddresses(small))
	}
}

func TestEventualConsistency(t *testing.T) {
	clock := clocktesting.NewFakeClock(time.Now())
	s, c, subnet := setup(t, ec2emu.Config{ConsistencyDelay: 2 * time.Second, Now: clock.Now})
	a := must[ec2emu.InstanceInfo](t)(s.AddInstance(ec2emu.Instance{Type: m5large, SubnetID: subnet}))
	b := must[ec2emu.InstanceInfo](t)(s.AddInstance(ec2emu.Instance{Type: m5large, SubnetID: subnet}))
	seen := func(eni string) []string {
		out := must[*ec2.DescribeNetworkInterfacesOutput](t)(c.DescribeNetworkInterfaces(ctx(t), &ec2.DescribeNetworkInterfacesInput{NetworkInterfaceIds: []string{eni}}))
		var ips []string
		for _, ip := range out.NetworkInterfaces[0].PrivateIpAddresses {
			if !*ip.Primary {
				ips = append(ips, *ip.PrivateIpAddress)
			}
		}
		return ips
	}
	if _, err := c.AssignPrivateIpAddresses(ctx(t), &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: &a.PrimaryInterface, PrivateIpAddresses: []string{moved}}); err != nil {
		t.Fatal(err)
	}
	if got := seen(a.PrimaryInterface); len(got) != 0 {
		t.Fatalf("Describe shows %v right after Assign, want the old state", got)
	}
	clock.Step(2 * time.Second)
	if got := seen(a.PrimaryInterface); !slices.Equal(got, []string{moved}) {
		t.Fatalf("Describe shows %v after the delay, want [10.1.0.50]", got)
	}
	// A move: the old owner keeps showing it, the new one does not yet.
	if _, err := c.AssignPrivateIpAddresses(ctx(t), &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: &b.PrimaryInterface, PrivateIpAddresses: []string{moved}, AllowReassignment: aws.Bool(true)}); err != nil {
		t.Fatal(err)
	}
	clock.Step(time.Second)
	if ga, gb := seen(a.PrimaryInterface), seen(b.PrimaryInterface); len(ga) != 1 || len(gb) != 0 {
		t.Fatalf("1 s after the move: a shows %v, b shows %v; want the old state", ga, gb)
	}
	if owner := s.Owner(subnet, netip.MustParseAddr(moved)); owner != b.PrimaryInterface {
		t.Fatalf("true owner %q, want %s", owner, b.PrimaryInterface)
	}
	clock.Step(time.Second)
	if ga, gb := seen(a.PrimaryInterface), seen(b.PrimaryInterface); len(ga) != 0 || !slices.Equal(gb, []string{moved}) {
		t.Fatalf("2 s after the move: a shows %v, b shows %v", ga, gb)
	}
}

func TestThrottleLatencyAndFaults(t *testing.T) {
	s, c, _ := setup(t, ec2emu.Config{Rate: 1, Burst: 5})
	throttled := 0
	for range 10 {
		_, err := c.DescribeSubnets(ctx(t), &ec2.DescribeSubnetsInput{})
		if err != nil {
			wantCode(t, err, "RequestLimitExceeded", 503)
			throttled++
		}
	}
	// A burst of 5, then 1 per second: 10 quick calls see at least 4
	// refusals even on a slow machine (a refill needs a whole second).
	counts := s.Counts()["DescribeSubnets"]
	if throttled < 4 || counts["RequestLimitExceeded"] != throttled || counts[ec2emu.Success] != 10-throttled {
		t.Fatalf("%d of 10 calls throttled, counts %v", throttled, counts)
	}

	// Own bucket for Assign: once the shared bucket (one call per 100 s) is
	// spent, Describe calls are throttled and Assign still passes.
	s.SetThrottle(0.01, 1)
	s.SetActionThrottle("AssignPrivateIpAddresses", ec2emu.Throttle{Rate: 100, Burst: 10})
	if _, err := c.DescribeSubnets(ctx(t), &ec2.DescribeSubnetsInput{}); err != nil {
		t.Fatalf("the fresh bucket's one call: %v", err)
	}
	_, err := c.AssignPrivateIpAddresses(ctx(t), &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: aws.String("eni-0123456789abcdef0"), PrivateIpAddresses: []string{"10.1.0.9"}})
	wantCode(t, err, "InvalidNetworkInterfaceID.NotFound", 400)
	_, err = c.DescribeSubnets(ctx(t), &ec2.DescribeSubnetsInput{})
	wantCode(t, err, "RequestLimitExceeded", 503)

	s.SetThrottle(0, 0)
	s.SetLatency("DescribeSubnets", 150*time.Millisecond)
	start := time.Now()
	if _, err := c.DescribeSubnets(ctx(t), &ec2.DescribeSubnetsInput{}); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Fatalf("call took %v, want at least the 150ms latency", d)
	}

	s.FailNext("DescribeInstances", "InternalError", 1)
	_, err = c.DescribeInstances(ctx(t), &ec2.DescribeInstancesInput{})
	wantCode(t, err, "InternalError", 500)
	if _, err := c.DescribeInstances(ctx(t), &ec2.DescribeInstancesInput{}); err != nil {
		t.Fatalf("the call after the injected fault: %v", err)
	}
}

// TestSDKRetriesThrottling checks the SDK's standard retryer recognises the
// emulator's throttling responses.
func TestSDKRetriesThrottling(t *testing.T) {
	s, _, _ := setup(t, ec2emu.Config{})
	c := ec2.New(ec2.Options{
		Region:       s.Region(),
		Credentials:  credentials.NewStaticCredentialsProvider(ec2emu.AccessKeyID, ec2emu.SecretAccessKey, ""),
		BaseEndpoint: aws.String(s.URL()),
		Retryer:      retry.NewStandard(func(o *retry.StandardOptions) { o.MaxAttempts = 4; o.MaxBackoff = 10 * time.Millisecond }),
	})
	s.FailNext("DescribeSubnets", "RequestLimitExceeded", 3)
	if _, err := c.DescribeSubnets(ctx(t), &ec2.DescribeSubnetsInput{}); err != nil {
		t.Fatalf("4th attempt should succeed: %v", err)
	}
	if got := s.Counts()["DescribeSubnets"]; got["RequestLimitExceeded"] != 3 || got[ec2emu.Success] != 1 {
		t.Fatalf("counts %v, want 3 throttled and 1 success", got)
	}
}
