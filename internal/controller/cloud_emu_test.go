package controller

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	egaws "github.com/egressip/egressip/internal/cloud/aws"
	"github.com/egressip/egressip/internal/cloud/aws/ec2emu"
	"github.com/egressip/egressip/internal/testutil/poll"
)

// emuCloud is an EC2 emulator with one subnet and the real SDK-based
// provider on it.
type emuCloud struct {
	emu       *ec2emu.Server
	subnet    string
	p         *egaws.Provider
	instances []ec2emu.InstanceInfo
}

func newEmuCloud(t *testing.T, cfg ec2emu.Config, cidr string) *emuCloud {
	t.Helper()
	emu := ec2emu.New(cfg)
	t.Cleanup(emu.Close)
	// A subnet ID of its own, so that pools other tests left behind (the
	// control plane is shared) never match these Nodes.
	subnet, err := emu.AddSubnet(ec2emu.Subnet{ID: fmt.Sprintf("subnet-%08x", hashName(t.Name()+cidr)), CIDR: netip.MustParsePrefix(cidr)})
	if err != nil {
		t.Fatal(err)
	}
	// The SDK's standard retryer with its default attempts; a short cap on
	// the delay between attempts keeps throttled tests quick, and no
	// client-side retry quota (the emulator's bucket is the limit).
	p, err := egaws.NewForEndpoint(emu.URL(), emu.Region(), ec2emu.AccessKeyID, ec2emu.SecretAccessKey,
		egaws.Options{MaxBackoff: 500 * time.Millisecond, RetryRateLimiter: ratelimit.None})
	if err != nil {
		t.Fatal(err)
	}
	return &emuCloud{emu: emu, subnet: subnet, p: p}
}

// newEmuCluster is newCluster with every Node on an emulated instance of
// the given type and the controller on the real EC2 provider.
func newEmuCluster(t *testing.T, prefix string, nodes, capacity int, ec *emuCloud, instanceType string) *cluster {
	t.Helper()
	cl := newCluster(t, prefix, nodes, capacity)
	cl.stopController()
	for i := 1; i <= nodes; i++ {
		in, err := ec.emu.AddInstance(ec2emu.Instance{Type: instanceType, SubnetID: ec.subnet})
		if err != nil {
			t.Fatal(err)
		}
		ec.instances = append(ec.instances, in)
		cl.setProviderID(fmt.Sprintf("%s-n%d", prefix, i), in.ProviderID)
	}
	cl.opts.Cloud = CloudConfig{Provider: ec.p, RefreshInterval: 2 * time.Second, BackoffInitial: 200 * time.Millisecond, BackoffMax: 2 * time.Second}
	cl.startController()
	return cl
}

func emuPool(ec *emuCloud, warmTarget, minimum int32) func(*v1.ExternalIPPool) {
	return func(p *v1.ExternalIPPool) {
		p.Spec.IPRanges = nil
		p.Spec.Cloud = &v1.CloudPool{Provider: v1.CloudProviderAWS, AWS: &v1.AWSPool{SubnetID: ec.subnet, InterfaceMode: v1.AWSPrimaryInterface}, WarmIPTarget: warmTarget, MinimumIPTarget: minimum}
	}
}

// attached maps every secondary address of the instances' primary
// interfaces (true state) to the interface.
func (ec *emuCloud) attached() map[netip.Addr]string {
	out := map[netip.Addr]string{}
	for _, in := range ec.instances {
		st, _ := ec.emu.Interface(in.PrimaryInterface)
		for _, ip := range st.Secondary {
			out[ip] = in.PrimaryInterface
		}
	}
	return out
}

// noLeak checks that every attached address of the instances (except
// others') is allocated to an Egress on that interface's Node or listed
// warm on it.
func (cl *cluster) noLeakEmu(ec *emuCloud, pool string, others map[netip.Addr]bool) {
	cl.t.Helper()
	nodeOf := map[string]string{}
	for i, in := range ec.instances {
		nodeOf[in.PrimaryInterface] = fmt.Sprintf("%s-n%d", pool, i+1)
	}
	cl.eventually("every attached address accounted for", func() (bool, string) {
		where := map[netip.Addr]string{}
		st := cl.poolStatus(pool)
		if st.Cloud != nil {
			for _, w := range st.Cloud.WarmIPs {
				where[netip.MustParseAddr(w.IP)] = w.Node
			}
		}
		var list v1.EgressList
		if err := cl.c.List(cl.ctx, &list); err != nil {
			return false, err.Error()
		}
		for _, e := range list.Items {
			if e.Spec.ExternalIPPool == pool && e.Status.EgressNode != "" {
				where[netip.MustParseAddr(e.Status.EgressIP)] = e.Status.EgressNode
			}
		}
		for ip, eni := range ec.attached() {
			if others[ip] {
				continue
			}
			if where[ip] != nodeOf[eni] {
				return false, fmt.Sprintf("%s attached to %s (Node %s) but accounted on %q", ip, eni, nodeOf[eni], where[ip])
			}
		}
		return true, ""
	})
}

func TestEmuWarmIPAndRefill(t *testing.T) {
	ec := newEmuCloud(t, ec2emu.Config{ConsistencyDelay: 500 * time.Millisecond}, "10.1.0.0/24")
	cl := newEmuCluster(t, "ewarm", 3, 10, ec, "m5.large")
	cl.pool("ewarm", emuPool(ec, 6, 0))
	cs := cl.waitWarm("ewarm", 6)
	if n := ec.emu.Calls("AssignPrivateIpAddresses"); n != 3 {
		t.Fatalf("6 warm IPs on 3 Nodes took %d AssignPrivateIpAddresses calls, want 3 (one per interface)", n)
	}
	warmAt := map[string]string{}
	for _, w := range cs.WarmIPs {
		warmAt[w.IP] = w.Node
	}
	ec.emu.ResetCounts()
	cl.egress("ewarm-a", "ewarm", "")
	e := cl.waitReady("ewarm-a")["ewarm-a"]
	if warmAt[e.Status.EgressIP] != e.Status.EgressNode {
		t.Fatalf("Egress got %s on %s; not a warm IP of that Node (%v)", e.Status.EgressIP, e.Status.EgressNode, warmAt)
	}
	if n := ec.emu.Calls("UnassignPrivateIpAddresses"); n != 0 {
		t.Fatalf("%d Unassign calls", n)
	}
	// At most the refill of the one address taken.
	if n := ec.emu.Calls("AssignPrivateIpAddresses"); n > 1 {
		t.Fatalf("%d Assign calls around a warm allocation, want at most the 1 refill", n)
	}
	cl.waitWarm("ewarm", 6)
	cl.noLeakEmu(ec, "ewarm", nil)
}

func TestEmuFailoverOfTwentyIPs(t *testing.T) {
	ec := newEmuCloud(t, ec2emu.Config{ConsistencyDelay: 500 * time.Millisecond}, "10.2.0.0/24")
	cl := newEmuCluster(t, "efail", 3, 29, ec, "c5.4xlarge")
	// As in TestCloudFailoverOneCallPerDestination: liveness timings a
	// loaded machine keeps, so that only the crashed Node is taken for
	// dead (3 Assign calls instead of 1 per destination once at load ~20:
	// starved fake agents declared dead too).
	cl.stopController()
	cl.opts.Liveness.Timeout, cl.opts.Liveness.DeadAfter = time.Second, 3*time.Second
	cl.startController()
	cl.cordonOrUncordon("efail-n2", true)
	cl.cordonOrUncordon("efail-n3", true)
	cl.pool("efail", emuPool(ec, 0, 0))
	egs := names("efail", 20)
	for _, e := range egs {
		cl.egress(e, "efail", "")
	}
	cl.waitReady(egs...)
	cl.cordonOrUncordon("efail-n2", false)
	cl.cordonOrUncordon("efail-n3", false)
	time.Sleep(time.Second)
	ec.emu.ResetCounts()
	start := time.Now()
	cl.crash("efail-n1")
	cl.eventually("20 IPs failed over", func() (bool, string) {
		for _, n := range egs {
			e := cl.get(n)
			if e.Status.EgressNode == "" || e.Status.EgressNode == "efail-n1" || !ready(e) {
				return false, describe(e)
			}
		}
		return true, ""
	})
	dest := map[string]bool{}
	for _, n := range egs {
		dest[cl.get(n).Status.EgressNode] = true
	}
	n := ec.emu.Calls("AssignPrivateIpAddresses")
	// The time is bounded by the wait's 20 s (expected: dead-after 3 s
	// plus the attaches) and logged only; the calls are asserted.
	t.Logf("crash to 20 Ready elsewhere: %v; %d AssignPrivateIpAddresses calls for %d destination Nodes", time.Since(start), n, len(dest))
	if n != len(dest) {
		t.Fatalf("%d Assign calls for %d destination interfaces, want one each", n, len(dest))
	}
	cl.noLeakEmu(ec, "efail", nil)
}

func TestEmuThrottlingAndLimitExceeded(t *testing.T) {
	ec := newEmuCloud(t, ec2emu.Config{Rate: 4, Burst: 2, ConsistencyDelay: time.Second}, "10.3.0.0/24")
	cl := newEmuCluster(t, "ethrottle", 2, 20, ec, "m5.large")
	// The CNI fills most of n1's interface after the controller's first
	// read, so the controller's idea of its room is stale.
	poll.Until(t, 20*time.Second, "the controller's first read of the instances", func() error {
		if ec.emu.Calls("DescribeInstances") == 0 {
			return errors.New("no DescribeInstances call yet")
		}
		return nil
	})
	others := map[netip.Addr]bool{}
	got, err := ec.emu.UseSlots(ec.instances[0].PrimaryInterface, 7)
	if err != nil {
		t.Fatal(err)
	}
	for _, ip := range got {
		others[ip] = true
	}
	ec.emu.FailNext("AssignPrivateIpAddresses", "RequestLimitExceeded", 6)
	// n1 has 2 free slots, n2 9: room for the 4 Egresses and 6 warm.
	cl.pool("ethrottle", emuPool(ec, 6, 0))
	egs := names("ethrottle", 4)
	for _, e := range egs {
		cl.egress(e, "ethrottle", "")
	}
	cl.waitReady(egs...)
	cl.waitWarm("ethrottle", 6)
	t.Logf("EC2 calls: %v", ec.emu.Counts())
	cl.noLeakEmu(ec, "ethrottle", others)
}

func TestEmuRestartDetachesNothing(t *testing.T) {
	ec := newEmuCloud(t, ec2emu.Config{}, "10.4.0.0/24")
	cl := newEmuCluster(t, "erestart", 3, 10, ec, "m5.large")
	cl.pool("erestart", emuPool(ec, 3, 0))
	egs := names("erestart", 6)
	for _, e := range egs {
		cl.egress(e, "erestart", "")
	}
	cl.waitReady(egs...)
	cl.waitWarm("erestart", 3)
	before := ec.attached()
	ec.emu.ResetCounts()
	cl.stopController()
	cl.startController()
	time.Sleep(3 * time.Second)
	counts := ec.emu.Counts()
	for action := range counts {
		if action == "AssignPrivateIpAddresses" || action == "UnassignPrivateIpAddresses" {
			t.Errorf("restart made %s calls: %v", action, counts[action])
		}
	}
	after := ec.attached()
	if !maps2Equal(before, after) {
		t.Fatalf("attachments changed across the restart:\nbefore %v\nafter  %v", before, after)
	}
	for _, e := range egs {
		if !ready(cl.get(e)) {
			t.Errorf("%s not Ready after the restart: %s", e, describe(cl.get(e)))
		}
	}
}

func maps2Equal(a, b map[netip.Addr]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// A Node whose spec.providerID is not an AWS one (a Fargate or on-premises
// Node in the same cluster) neither blocks the others nor gets IPs.
func TestEmuMalformedProviderIDBlocksNoOtherNode(t *testing.T) {
	ec := newEmuCloud(t, ec2emu.Config{}, "10.5.0.0/24")
	cl := newCluster(t, "emal", 3, 10)
	cl.stopController()
	for i := 1; i <= 2; i++ {
		in, err := ec.emu.AddInstance(ec2emu.Instance{Type: "m5.large", SubnetID: ec.subnet})
		if err != nil {
			t.Fatal(err)
		}
		ec.instances = append(ec.instances, in)
		cl.setProviderID(fmt.Sprintf("emal-n%d", i), in.ProviderID)
	}
	cl.setProviderID("emal-n3", "kind://docker/egressip/emal-n3")
	cl.opts.Cloud = CloudConfig{Provider: ec.p, RefreshInterval: 2 * time.Second, BackoffInitial: 200 * time.Millisecond, BackoffMax: 2 * time.Second}
	cl.startController()
	cl.pool("emal", emuPool(ec, 4, 0))
	cs := cl.waitWarm("emal", 4)
	for _, w := range cs.WarmIPs {
		if w.Node == "emal-n3" {
			t.Fatalf("warm IP %s on the Node without an AWS instance", w.IP)
		}
	}
	cl.egress("emal-a", "emal", "")
	if e := cl.waitReady("emal-a")["emal-a"]; e.Status.EgressNode == "emal-n3" {
		t.Fatalf("Egress placed on the Node without an AWS instance")
	}
	cl.noLeakEmu(ec, "emal", nil)
}

// A user-named IP in a cloud pool is attached by EC2 with one call and bound
// on the interface of the Node the status names.
func TestEmuUserNamedIP(t *testing.T) {
	ec := newEmuCloud(t, ec2emu.Config{ConsistencyDelay: 500 * time.Millisecond}, "10.6.0.0/24")
	cl := newEmuCluster(t, "enamed", 2, 10, ec, "m5.large")
	cl.pool("enamed", emuPool(ec, 0, 0))
	ec.emu.ResetCounts()
	cl.egress("enamed-a", "enamed", "10.6.0.200")
	e := cl.waitReady("enamed-a")["enamed-a"]
	eni := ec.attached()[netip.MustParseAddr("10.6.0.200")]
	want := ""
	for i, in := range ec.instances {
		if fmt.Sprintf("enamed-n%d", i+1) == e.Status.EgressNode {
			want = in.PrimaryInterface
		}
	}
	if eni == "" || eni != want || e.Status.InterfaceMAC == "" {
		t.Fatalf("10.6.0.200 attached to %q, want %q (Node %s), MAC %q", eni, want, e.Status.EgressNode, e.Status.InterfaceMAC)
	}
	if n := ec.emu.Calls("AssignPrivateIpAddresses"); n != 1 {
		t.Fatalf("%d AssignPrivateIpAddresses calls for one named IP, want 1", n)
	}
	cl.noLeakEmu(ec, "enamed", nil)
}

// Lowering the warm target detaches the excess with one call per interface,
// down to the minimum; a second scale-down waits out the 30 s spacing.
func TestEmuScaleDownSpacingAndMinimum(t *testing.T) {
	ec := newEmuCloud(t, ec2emu.Config{}, "10.7.0.0/24")
	cl := newEmuCluster(t, "edown", 2, 20, ec, "m5.large")
	cl.pool("edown", emuPool(ec, 6, 4))
	cl.waitWarm("edown", 6)
	ec.emu.ResetCounts()
	cl.patchPool("edown", func(p *v1.ExternalIPPool) { p.Spec.Cloud.WarmIPTarget = 0 })
	cl.waitWarm("edown", 4) // the minimum holds
	first := ec.emu.Calls("UnassignPrivateIpAddresses")
	firstSeen := time.Now()
	if first == 0 || first > 2 {
		t.Fatalf("%d UnassignPrivateIpAddresses calls, want one per interface (1 or 2)", first)
	}
	cl.patchPool("edown", func(p *v1.ExternalIPPool) { p.Spec.Cloud.MinimumIPTarget = 0 })
	time.Sleep(5 * time.Second)
	if st := cl.poolStatus("edown").Cloud; st.Warm != 4 || ec.emu.Calls("UnassignPrivateIpAddresses") != first {
		t.Fatalf("a second detach came before the 30 s spacing: %+v", st)
	}
	// Judged below: up to 60 s for the warm IPs to go.
	_ = poll.Wait(context.Background(), 200*time.Millisecond, 60*time.Second, func() error {
		if w := cl.poolStatus("edown").Cloud.Warm; w != 0 {
			return fmt.Errorf("%d warm", w)
		}
		return nil
	})
	if st := cl.poolStatus("edown").Cloud; st.Warm != 0 {
		t.Fatalf("warm IPs not detached after the spacing: %+v", st)
	}
	// firstSeen is at or after the first detach, so this gap is at most
	// the real one; without the spacing it would be about 5 s.
	if gap := time.Since(firstSeen); gap < 25*time.Second {
		t.Fatalf("second scale-down %v after the first was seen, want about 30 s", gap)
	}
	if len(ec.attached()) != 0 {
		t.Fatalf("addresses still attached after scale-down to 0: %v", ec.attached())
	}
}
