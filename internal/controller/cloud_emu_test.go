package controller

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	egaws "github.com/egressip/egressip/internal/cloud/aws"
	"github.com/egressip/egressip/internal/cloud/aws/ec2emu"
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
		p.Spec.Cloud = &v1.CloudPool{Provider: v1.CloudProviderAWS, AWS: &v1.AWSPool{SubnetID: ec.subnet}, WarmIPTarget: warmTarget, MinimumIPTarget: minimum}
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
	time.Sleep(time.Second)
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

// TestEmuFigures measures, on an emulator with 200 ms per call and 20
// calls/s: the time until 100 Egresses created at once are Ready, and the
// EC2 calls spent, for warm targets 0, 10 and 50; and the calls to fill
// one c5.4xlarge (8 interfaces x 30 addresses) one address at a time
// versus one call per interface. Slow: set EGRESSIP_CLOUD_FIGURES=1.
func TestEmuFigures(t *testing.T) {
	if os.Getenv("EGRESSIP_CLOUD_FIGURES") == "" {
		t.Skip("set EGRESSIP_CLOUD_FIGURES=1 to measure the cloud figures (minutes)")
	}
	cfg := ec2emu.Config{Latency: map[string]time.Duration{"*": 200 * time.Millisecond}, Rate: 20, Burst: 20}
	for i, warmTarget := range []int32{0, 10, 50} {
		t.Run("warm="+strconv.Itoa(int(warmTarget)), func(t *testing.T) {
			ec := newEmuCloud(t, cfg, fmt.Sprintf("10.%d.0.0/22", 10+i))
			prefix := fmt.Sprintf("fig%d", warmTarget)
			cl := newEmuCluster(t, prefix, 5, 29, ec, "c5.4xlarge")
			cl.pool(prefix, emuPool(ec, warmTarget, 0))
			if warmTarget > 0 {
				cl.waitWarm(prefix, warmTarget)
			}
			time.Sleep(2 * time.Second)
			ec.emu.ResetCounts()
			egs := names(prefix, 100)
			start := time.Now()
			var wg sync.WaitGroup
			for _, e := range egs {
				wg.Add(1)
				go func() { defer wg.Done(); cl.egress(e, prefix, "") }()
			}
			wg.Wait()
			deadline := time.Now().Add(3 * time.Minute)
			for {
				n := 0
				for _, e := range egs {
					if ready(cl.get(e)) {
						n++
					}
				}
				if n == len(egs) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("only %d of 100 Ready after 3 min", n)
				}
				time.Sleep(100 * time.Millisecond)
			}
			took := time.Since(start)
			counts := ec.emu.Counts()
			mut := ec.emu.Calls("AssignPrivateIpAddresses") + ec.emu.Calls("UnassignPrivateIpAddresses")
			t.Logf("FIGURE warm=%d: 100 Egresses Ready in %v; EC2 calls %d (Assign/Unassign %d): %v", warmTarget, took.Round(10*time.Millisecond), ec.emu.Calls(""), mut, counts)
		})
	}
	t.Run("controller-fill-primary-eni", func(t *testing.T) {
		// Through the controller, warm target 0: one c5.4xlarge Node's
		// primary interface (29 secondary slots) filled by Egresses
		// created one at a time (each waits for the previous one to be
		// Ready) versus all at once.
		for i, oneByOne := range []bool{true, false} {
			t.Run(fmt.Sprintf("oneByOne=%v", oneByOne), func(t *testing.T) {
				ec := newEmuCloud(t, cfg, fmt.Sprintf("10.%d.0.0/24", 30+i))
				prefix := fmt.Sprintf("figfill%d", i)
				cl := newEmuCluster(t, prefix, 1, 29, ec, "c5.4xlarge")
				cl.pool(prefix, emuPool(ec, 0, 0))
				time.Sleep(2 * time.Second)
				ec.emu.ResetCounts()
				egs := names(prefix, 29)
				start := time.Now()
				if oneByOne {
					for _, e := range egs {
						cl.egress(e, prefix, "")
						cl.waitReady(e)
					}
				} else {
					for _, e := range egs {
						cl.egress(e, prefix, "")
					}
					cl.waitReady(egs...)
				}
				t.Logf("FIGURE controller, 29 Egresses on one primary ENI, one at a time=%v: %d AssignPrivateIpAddresses calls, %v",
					oneByOne, ec.emu.Calls("AssignPrivateIpAddresses"), time.Since(start).Round(10*time.Millisecond))
			})
		}
	})
	t.Run("fill-c5.4xlarge", func(t *testing.T) {
		ec := newEmuCloud(t, cfg, "10.20.0.0/22")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		instance := func() []string {
			in, err := ec.emu.AddInstance(ec2emu.Instance{Type: "c5.4xlarge", SubnetID: ec.subnet})
			if err != nil {
				t.Fatal(err)
			}
			enis := []string{in.PrimaryInterface}
			for range 7 {
				id, err := ec.emu.AddInterface(in.ID, ec2emu.InterfaceOptions{})
				if err != nil {
					t.Fatal(err)
				}
				enis = append(enis, id)
			}
			return enis
		}
		// 30 addresses per interface, the primary included: 29 secondaries.
		one, batch := instance(), instance()
		ec.emu.ResetCounts()
		start := time.Now()
		for _, eni := range one {
			for range 29 {
				if _, err := ec.p.AssignCount(ctx, eni, 1); err != nil {
					t.Fatal(err)
				}
			}
		}
		oneTook, oneCalls := time.Since(start), ec.emu.Calls("AssignPrivateIpAddresses")
		ec.emu.ResetCounts()
		start = time.Now()
		for _, eni := range batch {
			if _, err := ec.p.AssignCount(ctx, eni, 29); err != nil {
				t.Fatal(err)
			}
		}
		batchTook, batchCalls := time.Since(start), ec.emu.Calls("AssignPrivateIpAddresses")
		t.Logf("FIGURE fill one c5.4xlarge, 8 ENIs x 29 secondary IPs: one IP per call %d calls in %v; one call per ENI %d calls in %v",
			oneCalls, oneTook.Round(10*time.Millisecond), batchCalls, batchTook.Round(10*time.Millisecond))
		for _, eni := range append(one, batch...) {
			st, _ := ec.emu.Interface(eni)
			if len(st.Secondary) != 29 {
				t.Fatalf("%s holds %d secondaries, want 29", eni, len(st.Secondary))
			}
		}
	})
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
