package aws

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/prometheus/client_golang/prometheus"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/egressip/egressip/internal/cloud"
	"github.com/egressip/egressip/internal/cloud/aws/ec2emu"
)

type env struct {
	emu    *ec2emu.Server
	p      *Provider
	reg    *prometheus.Registry
	subnet string
}

// newEnv starts an emulator with one 10.0.0.0/20 subnet and a Provider on
// it with fast retries.
func newEnv(t *testing.T, cfg ec2emu.Config, opts Options) *env {
	t.Helper()
	emu := ec2emu.New(cfg)
	t.Cleanup(emu.Close)
	subnet, err := emu.AddSubnet(ec2emu.Subnet{CIDR: netip.MustParsePrefix("10.0.0.0/20")})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	opts.Registerer = reg
	if opts.MaxBackoff == 0 {
		opts.MaxBackoff = 20 * time.Millisecond
	}
	p, err := New(emu.AWSConfig(), opts)
	if err != nil {
		t.Fatal(err)
	}
	return &env{emu: emu, p: p, reg: reg, subnet: subnet}
}

func (e *env) instance(t *testing.T, typ string) ec2emu.InstanceInfo {
	t.Helper()
	in, err := e.emu.AddInstance(ec2emu.Instance{Type: typ, SubnetID: e.subnet})
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return c
}

func addrs(s ...string) []netip.Addr {
	out := make([]netip.Addr, len(s))
	for i, v := range s {
		out[i] = netip.MustParseAddr(v)
	}
	return out
}

func TestInterfacesUsesDeviceIndexZero(t *testing.T) {
	e := newEnv(t, ec2emu.Config{}, Options{})
	a := e.instance(t, m5large)
	// A secondary interface listed before the primary one.
	second, err := e.emu.AddInterface(a.ID, ec2emu.InterfaceOptions{ListFirst: true})
	if err != nil {
		t.Fatal(err)
	}
	sst, _ := e.emu.Interface(second)
	pods, err := e.emu.UseSlots(a.PrimaryInterface, 2)
	if err != nil {
		t.Fatal(err)
	}
	got, err := e.p.Interfaces(ctx(t), map[string]string{nodeA: a.ProviderID})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]cloud.Interface{nodeA: {
		Node: nodeA, InstanceID: a.ID, InstanceType: m5large, ID: a.PrimaryInterface,
		MAC: a.MAC, SubnetID: e.subnet, Limit: 10, Secondary: pods,
		Zone: e.emu.Region() + "a", VPCID: "vpc-emu", Groups: []string{ec2emu.DefaultSecurityGroup}, MaxInterfaces: 3,
		// The other interface, with its attachment (its tags come from
		// TaggedInterfaces: DescribeInstances carries none).
		Others: []cloud.ENI{{ID: second, MAC: sst.MAC, SubnetID: e.subnet, InstanceID: a.ID, DeviceIndex: 1, AttachmentID: "eni-attach-" + second[len("eni-"):] + "-1"}},
	}}
	if d := cmp.Diff(want, got, addrCmp); d != "" {
		t.Fatalf("Interfaces (-want +got):\n%s", d)
	}
}

func TestAssignCountAndUnassign(t *testing.T) {
	e := newEnv(t, ec2emu.Config{}, Options{})
	a := e.instance(t, "t3.medium")
	ips, err := e.p.AssignCount(ctx(t), a.PrimaryInterface, 3)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := e.emu.Interface(a.PrimaryInterface)
	if d := cmp.Diff(ips, st.Secondary, addrCmp); d != "" || len(ips) != 3 {
		t.Fatalf("AssignCount returned %v, interface holds %v", ips, st.Secondary)
	}
	if err := e.p.Unassign(ctx(t), a.PrimaryInterface, ips[:2]); err != nil {
		t.Fatal(err)
	}
	st, _ = e.emu.Interface(a.PrimaryInterface)
	if len(st.Secondary) != 1 || st.Secondary[0] != ips[2] {
		t.Fatalf("after Unassign the interface holds %v, want [%v]", st.Secondary, ips[2])
	}
}

// Instance types, a Node and an unknown instance the tests use repeatedly.
const (
	m5large   = "m5.large"
	c54xlarge = "c5.4xlarge"
	nodeA     = "node-a"
	unknownID = "i-0123456789abcdef0"
)

var addrCmp = cmp.Comparer(func(x, y netip.Addr) bool { return x == y })

// callMetrics reads egressip_controller_cloud_api_calls_total by action and
// code, and the number of duration observations.
func callMetrics(t *testing.T, reg *prometheus.Registry) (map[string]map[string]int, int) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]map[string]int{}
	observed := 0
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			switch mf.GetName() {
			case "egressip_controller_cloud_api_calls_total":
				if calls[labels["action"]] == nil {
					calls[labels["action"]] = map[string]int{}
				}
				calls[labels["action"]][labels["code"]] = int(m.GetCounter().GetValue())
			case "egressip_controller_cloud_api_call_duration_seconds":
				observed += int(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return calls, observed
}

func total(counts map[string]map[string]int) int {
	n := 0
	for _, m := range counts {
		for _, c := range m {
			n += c
		}
	}
	return n
}

// describeInstancesPages is the number of DescribeInstances requests
// Interfaces must make for the well-formed instance IDs of ids: one
// paginated call per chunk of maxFilterValues sorted IDs, each returning
// the chunk's instances known to EC2 (live or terminated) in pages of
// pageSize, plus one empty page after a full last page when EC2 sends a
// trailing NextToken.
func describeInstancesPages(t *testing.T, ids map[string]string, known map[string]bool, pageSize int, trailing bool) int {
	t.Helper()
	var instances []string
	for _, pid := range ids {
		if _, id, err := ParseProviderID(pid); err == nil {
			instances = append(instances, id)
		}
	}
	slices.Sort(instances)
	instances = slices.Compact(instances)
	n := 0
	for chunk := range slices.Chunk(instances, maxFilterValues) {
		hits := 0
		for _, id := range chunk {
			if known[id] {
				hits++
			}
		}
		pages := (hits + pageSize - 1) / pageSize
		if hits == 0 || (trailing && hits%pageSize == 0) {
			pages++
		}
		n += pages
	}
	return n
}

// TestInterfacesBatchesAndSkips: 250 instances (one terminated), a ghost
// instance and a malformed providerID. The calls are derived from the
// inputs: where the ghost's ID sorts among the random instance IDs decides
// how the 251 IDs fall into chunks of 200. This test failed in most runs
// before the Provider gave net/http a request body of its own (see
// ownBodyClient): a retried attempt counted as a third DescribeInstances.
func TestInterfacesBatchesAndSkips(t *testing.T) {
	e := newEnv(t, ec2emu.Config{}, Options{})
	typesCycle := []string{"t3.medium", m5large, c54xlarge}
	limit := map[string]int{"t3.medium": 6, m5large: 10, c54xlarge: 30}
	ids := map[string]string{}
	infos := map[string]ec2emu.InstanceInfo{}
	known := map[string]bool{}
	for i := range 250 {
		node := fmt.Sprintf("node-%03d", i)
		in := e.instance(t, typesCycle[i%3])
		ids[node], infos[node], known[in.ID] = in.ProviderID, in, true
	}
	if err := e.emu.Terminate(infos["node-007"].ID); err != nil {
		t.Fatal(err)
	}
	ids["ghost"] = "aws:///us-east-1a/i-0123456789abcdef0"
	ids["bad"] = "aws://us-east-1a/i-0123456789abcdef0"

	got, err := e.p.Interfaces(ctx(t), ids)
	if !errors.Is(err, ErrMalformedProviderID) || !strings.Contains(err.Error(), "node bad") {
		t.Fatalf("Interfaces error %v: want the malformed providerID of Node bad reported", err)
	}
	if len(got) != 249 {
		t.Fatalf("Interfaces returned %d Nodes, want 249 (250 minus the terminated one; ghost and bad absent)", len(got))
	}
	for node, in := range infos {
		iface, ok := got[node]
		if node == "node-007" {
			if ok {
				t.Fatalf("terminated instance of %s is in the result", node)
			}
			continue
		}
		if !ok || iface.Node != node || iface.ID != in.PrimaryInterface || iface.MAC != in.MAC || iface.Limit != limit[iface.InstanceType] || iface.SubnetID != e.subnet {
			t.Fatalf("Node %s: got %+v, want interface %s of %s", node, iface, in.PrimaryInterface, in.ID)
		}
	}
	// 251 instance IDs: two chunks of at most 200 filter values, each one
	// page (the page size is above the chunk size); one
	// DescribeInstanceTypes for the three types.
	wantDI := describeInstancesPages(t, ids, known, pageSize, false)
	if wantDI != 2 {
		t.Fatalf("derived %d DescribeInstances for 251 IDs, want 2", wantDI)
	}
	if c := e.emu.Counts(); c["DescribeInstances"][ec2emu.Success] != wantDI || c["DescribeInstanceTypes"][ec2emu.Success] != 1 || e.emu.Calls("") != wantDI+1 {
		t.Fatalf("calls %v: want %d DescribeInstances and 1 DescribeInstanceTypes", c, wantDI)
	}
	// Types are cached.
	e.emu.ResetCounts()
	delete(ids, "bad")
	if _, err := e.p.Interfaces(ctx(t), ids); err != nil {
		t.Fatal(err)
	}
	if c := e.emu.Counts(); c["DescribeInstanceTypes"] != nil || c["DescribeInstances"][ec2emu.Success] != wantDI || e.emu.Calls("") != wantDI {
		t.Fatalf("second pass calls %v: want %d DescribeInstances and no DescribeInstanceTypes", c, wantDI)
	}
}

// TestInterfacesFollowsEveryPage: EC2 may cut pages below MaxResults and
// may return a NextToken after a full last page, whose page is then empty.
// Interfaces must follow every NextToken and lose no instance. The chunk
// sizes (200 and 50 filter values, 250 and 50 hits with pages of 50) make
// both chunks end on a full page, so both get a trailing empty page.
func TestInterfacesFollowsEveryPage(t *testing.T) {
	const small = 50
	e := newEnv(t, ec2emu.Config{MaxPageSize: small, TrailingEmptyPage: true}, Options{})
	ids := map[string]string{}
	known := map[string]bool{}
	for i := range 250 {
		in := e.instance(t, m5large)
		ids[fmt.Sprintf("node-%03d", i)], known[in.ID] = in.ProviderID, true
	}
	got, err := e.p.Interfaces(ctx(t), ids)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 250 {
		t.Fatalf("Interfaces returned %d Nodes, want 250", len(got))
	}
	want := describeInstancesPages(t, ids, known, small, true)
	if want != 4+1+1+1 { // 200 = 4 full pages + 1 empty; 50 = 1 full page + 1 empty
		t.Fatalf("derived %d pages, want 7", want)
	}
	if c := e.emu.Counts()["DescribeInstances"]; c[ec2emu.Success] != want || len(c) != 1 {
		t.Fatalf("DescribeInstances %v: want %d successful pages", c, want)
	}
}

func TestParseProviderID(t *testing.T) {
	for _, tc := range []struct {
		in, zone, id string
		ok           bool
	}{
		{"aws:///us-east-1a/" + unknownID, "us-east-1a", unknownID, true},
		{"aws:///eu-west-3c/i-0abc1234", "eu-west-3c", "i-0abc1234", true},
		{"aws:////" + unknownID, "", unknownID, true},
		{"aws://us-east-1a/i-0123456789abcdef0", "", "", false},
		{"aws:///us-east-1a/i-0123", "", "", false},
		{"aws:///us-east-1a/i-0123456789ABCDEF0", "", "", false},
		{"aws:///us-east-1a/x/i-0123456789abcdef0", "", "", false},
		{"aws:///us-east-1a/fargate-ip-10-0-0-1", "", "", false},
		{"gce://project/zone/name", "", "", false},
		{"i-0123456789abcdef0", "", "", false},
		{"", "", "", false},
	} {
		zone, id, err := ParseProviderID(tc.in)
		if tc.ok != (err == nil) || zone != tc.zone || id != tc.id {
			t.Errorf("ParseProviderID(%q) = %q, %q, %v; want %q, %q, ok=%v", tc.in, zone, id, err, tc.zone, tc.id, tc.ok)
		}
		if err != nil && !errors.Is(err, ErrMalformedProviderID) {
			t.Errorf("ParseProviderID(%q): error %v does not wrap ErrMalformedProviderID", tc.in, err)
		}
	}
}

// TestFailoverMovesTwentyIPsInOneCall: a Node holding 20 IPs fails, and one
// Assign with AllowReassignment moves them all to the new holder's ENI.
func TestFailoverMovesTwentyIPsInOneCall(t *testing.T) {
	e := newEnv(t, ec2emu.Config{}, Options{})
	a, b := e.instance(t, c54xlarge), e.instance(t, c54xlarge)
	ips, err := e.p.AssignCount(ctx(t), a.PrimaryInterface, 20)
	if err != nil {
		t.Fatal(err)
	}
	e.emu.ResetCounts()
	if err := e.p.Assign(ctx(t), b.PrimaryInterface, ips); err != nil {
		t.Fatal(err)
	}
	if n := e.emu.Calls(""); n != 1 {
		t.Fatalf("failover took %d calls, want 1", n)
	}
	sa, _ := e.emu.Interface(a.PrimaryInterface)
	sb, _ := e.emu.Interface(b.PrimaryInterface)
	if len(sa.Secondary) != 0 || cmp.Diff(ips, sb.Secondary, addrCmp) != "" {
		t.Fatalf("after failover: old ENI holds %v, new ENI holds %v; want none and %v", sa.Secondary, sb.Secondary, ips)
	}
	// Assigning addresses the interface already holds is a no-op success.
	if err := e.p.Assign(ctx(t), b.PrimaryInterface, ips[:3]); err != nil {
		t.Fatal(err)
	}
}

func TestErrorsMapped(t *testing.T) {
	e := newEnv(t, ec2emu.Config{}, Options{MaxAttempts: 3})
	small, err := e.emu.AddSubnet(ec2emu.Subnet{CIDR: netip.MustParsePrefix("10.9.0.0/28")})
	if err != nil {
		t.Fatal(err)
	}
	medium := e.instance(t, "t3.medium")
	big, err := e.emu.AddInstance(ec2emu.Instance{Type: c54xlarge, SubnetID: small})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		call     func() error
		sentinel error
		code     string
	}{
		{"limit", func() error { _, err := e.p.AssignCount(ctx(t), medium.PrimaryInterface, 6); return err },
			cloud.ErrLimitExceeded, "PrivateIpAddressLimitExceeded"},
		{"subnet full", func() error { _, err := e.p.AssignCount(ctx(t), big.PrimaryInterface, 11); return err },
			cloud.ErrSubnetFull, "InsufficientFreeAddressesInSubnet"},
		{"unknown interface", func() error { return e.p.Unassign(ctx(t), "eni-0123456789abcdef0", addrs("10.0.0.9")) },
			cloud.ErrNotFound, "InvalidNetworkInterfaceID.NotFound"},
		{"throttled past the retries", func() error {
			e.emu.FailNext("AssignPrivateIpAddresses", "RequestLimitExceeded", 3)
			return e.p.Assign(ctx(t), medium.PrimaryInterface, addrs("10.0.1.1"))
		}, cloud.ErrThrottled, "RequestLimitExceeded"},
		{"address in use is no sentinel", func() error {
			return e.p.Assign(ctx(t), medium.PrimaryInterface, []netip.Addr{big.PrivateIP})
		}, nil, "InvalidParameterValue"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if err == nil || !strings.Contains(err.Error(), tc.code) {
				t.Fatalf("error %v: want one carrying EC2 code %s", err, tc.code)
			}
			for _, s := range []error{cloud.ErrLimitExceeded, cloud.ErrSubnetFull, cloud.ErrNotFound, cloud.ErrThrottled} {
				if errors.Is(err, s) != (s == tc.sentinel) {
					t.Fatalf("error %v: errors.Is(%v) = %v", err, s, errors.Is(err, s))
				}
			}
		})
	}
	// The retryer retried throttling: 3 attempts, the last one included.
	if got := e.emu.Counts()["AssignPrivateIpAddresses"]["RequestLimitExceeded"]; got != 3 {
		t.Fatalf("throttled attempts %d, want 3", got)
	}
	// With a fourth attempt allowed, the same fault is absorbed.
	p4, err := NewForEndpoint(e.emu.URL(), e.emu.Region(), ec2emu.AccessKeyID, ec2emu.SecretAccessKey, Options{MaxAttempts: 4, MaxBackoff: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	e.emu.FailNext("AssignPrivateIpAddresses", "RequestLimitExceeded", 3)
	if err := p4.Assign(ctx(t), medium.PrimaryInterface, addrs("10.0.1.1")); err != nil {
		t.Fatalf("4 attempts for 3 throttles: %v", err)
	}
}

func TestEventualConsistencyThroughProvider(t *testing.T) {
	clock := clocktesting.NewFakeClock(time.Now())
	e := newEnv(t, ec2emu.Config{ConsistencyDelay: 5 * time.Second, Now: clock.Now}, Options{})
	a := e.instance(t, m5large)
	ips, err := e.p.AssignCount(ctx(t), a.PrimaryInterface, 4)
	if err != nil {
		t.Fatal(err)
	}
	look := func() ([]netip.Addr, []netip.Addr, int) {
		got, err := e.p.Interfaces(ctx(t), map[string]string{"a": a.ProviderID})
		if err != nil {
			t.Fatal(err)
		}
		byID, err := e.p.InterfaceAddresses(ctx(t), []string{a.PrimaryInterface})
		if err != nil {
			t.Fatal(err)
		}
		sn, err := e.p.Subnets(ctx(t), []string{e.subnet})
		if err != nil {
			t.Fatal(err)
		}
		return got["a"].Secondary, byID[a.PrimaryInterface], sn[e.subnet].Available
	}
	// 4096 - 5 reserved - 1 primary.
	if viaInstances, viaENI, free := look(); len(viaInstances) != 0 || len(viaENI) != 0 || free != 4090 {
		t.Fatalf("right after Assign EC2 shows %v / %v, %d free; want the old state (none, 4090)", viaInstances, viaENI, free)
	}
	clock.Step(5 * time.Second)
	if viaInstances, viaENI, free := look(); cmp.Diff(ips, viaInstances, addrCmp) != "" || cmp.Diff(ips, viaENI, addrCmp) != "" || free != 4086 {
		t.Fatalf("after the delay EC2 shows %v / %v, %d free; want %v, 4086", viaInstances, viaENI, free, ips)
	}
}

func TestMetricsCountAttempts(t *testing.T) {
	e := newEnv(t, ec2emu.Config{}, Options{MaxAttempts: 5})
	a := e.instance(t, m5large)
	e.emu.FailNext("DescribeInstances", "RequestLimitExceeded", 2)
	if _, err := e.p.Interfaces(ctx(t), map[string]string{"a": a.ProviderID}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.p.AssignCount(ctx(t), a.PrimaryInterface, 10); !errors.Is(err, cloud.ErrLimitExceeded) {
		t.Fatalf("AssignCount 10 on m5.large: %v, want ErrLimitExceeded", err)
	}
	calls, observed := callMetrics(t, e.reg)
	want := map[string]map[string]int{
		"DescribeInstances":        {"RequestLimitExceeded": 2, CodeSuccess: 1},
		"DescribeInstanceTypes":    {CodeSuccess: 1},
		"AssignPrivateIpAddresses": {"PrivateIpAddressLimitExceeded": 1},
	}
	if d := cmp.Diff(want, calls); d != "" {
		t.Fatalf("calls_total (-want +got):\n%s", d)
	}
	if d := cmp.Diff(e.emu.Counts(), calls); d != "" {
		t.Fatalf("metrics differ from what the emulator saw (-emulator +metrics):\n%s", d)
	}
	if observed != 5 {
		t.Fatalf("duration histogram has %d observations, want 5 (one per attempt)", observed)
	}
	// A second Provider on the same registry shares the collectors.
	if _, err := New(sdkaws.Config{Region: "us-east-1"}, Options{Registerer: e.reg}); err != nil {
		t.Fatalf("second Provider on one registry: %v", err)
	}
}

// TestThrottlingStorm: 100 AssignCount calls at once against an EC2 that
// admits 20 calls per second (bucket of 20). With enough attempts and no
// client retry quota every call succeeds; with the SDK's defaults (3
// attempts, 500-token retry quota) the excess fails with ErrThrottled. In
// both cases the metrics match the calls EC2 saw and no address is leaked.
func TestThrottlingStorm(t *testing.T) {
	for _, tc := range []struct {
		name  string
		opts  Options
		allOK bool
	}{
		{"patient client", Options{MaxAttempts: 100, MaxBackoff: time.Second, RetryRateLimiter: ratelimit.None}, true},
		{"sdk defaults with 3 attempts", Options{MaxAttempts: 3, MaxBackoff: 20 * time.Millisecond}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, ec2emu.Config{Rate: 20, Burst: 20}, tc.opts)
			enis := make([]string, 0, 4)
			for range 4 {
				enis = append(enis, e.instance(t, c54xlarge).PrimaryInterface)
			}
			type result struct {
				eni string
				ips []netip.Addr
				err error
			}
			results := make(chan result, 100)
			start := time.Now()
			var wg sync.WaitGroup
			for i := range 100 {
				wg.Go(func() {
					eni := enis[i%4]
					ips, err := e.p.AssignCount(ctx(t), eni, 1)
					results <- result{eni, ips, err}
				})
			}
			wg.Wait()
			close(results)
			elapsed := time.Since(start)
			ok, throttled := 0, 0
			held := map[string][]netip.Addr{}
			for r := range results {
				switch {
				case r.err == nil:
					ok++
					held[r.eni] = append(held[r.eni], r.ips...)
				case errors.Is(r.err, cloud.ErrThrottled):
					throttled++
				default:
					t.Errorf("unexpected error: %v", r.err)
				}
			}
			if ok < 20 || ok+throttled != 100 {
				t.Fatalf("%d succeeded and %d throttled of 100; at least the bucket's 20 must pass", ok, throttled)
			}
			if tc.allOK && ok != 100 {
				t.Fatalf("patient client: %d of 100 succeeded", ok)
			}
			if !tc.allOK && throttled == 0 {
				t.Fatalf("3 attempts within ~100ms cannot all pass a 20/s bucket, yet none was throttled")
			}
			seen := e.emu.Counts()
			t.Logf("%d succeeded, %d throttled in %v; EC2 saw %d attempts %v", ok, throttled, elapsed, total(seen), seen["AssignPrivateIpAddresses"])
			if seen["AssignPrivateIpAddresses"][ec2emu.Success] != ok {
				t.Fatalf("EC2 saw %d successful assigns, callers got %d", seen["AssignPrivateIpAddresses"][ec2emu.Success], ok)
			}
			calls, observed := callMetrics(t, e.reg)
			if d := cmp.Diff(seen, calls); d != "" {
				t.Fatalf("metrics differ from what the emulator saw (-emulator +metrics):\n%s", d)
			}
			if observed != total(seen) {
				t.Fatalf("duration observations %d, attempts %d", observed, total(seen))
			}
			// No leak: every attached address was returned to a caller.
			for _, eni := range enis {
				st, _ := e.emu.Interface(eni)
				slices.SortFunc(held[eni], netip.Addr.Compare)
				if d := cmp.Diff(held[eni], st.Secondary, addrCmp, cmpopts.EquateEmpty()); d != "" {
					t.Fatalf("%s: attached addresses differ from those returned (-returned +attached):\n%s", eni, d)
				}
			}
		})
	}
}
