package controller

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/cloud/aws/ec2emu"
)

// Multi-IP Egresses (spec.ips, issue 20) with IPs from cloud-backed pools,
// against a real kube-apiserver and the EC2 emulator with the real
// SDK-based provider: one pool per subnet, one subnet per zone.

// TestMultiIPCloudTwoZones: an Egress with one IP from each of two cloud
// pools (subnets in zones a and b) gets each IP attached, in the emulator,
// to the primary interface of a Node of its zone, status.ips naming that
// Node with its interface's MAC, and is Ready 2/2 once the fake agents
// bind them. When the zone-a IP's Node dies, only that IP moves: one
// Assign call reassigns it from the dead Node's interface to the other
// zone-a Node's, and the zone-b IP stays on its Node and interface.
func TestMultiIPCloudTwoZones(t *testing.T) {
	ec := newEmuCloud(t, ec2emu.Config{ConsistencyDelay: 500 * time.Millisecond}, "10.20.0.0/24")
	subnetB, err := ec.emu.AddSubnet(ec2emu.Subnet{ID: fmt.Sprintf("subnet-%08x", hashName(t.Name()+"zone-b")), CIDR: netip.MustParsePrefix("10.20.1.0/24"),
		AvailabilityZone: ec.emu.Region() + "b"})
	if err != nil {
		t.Fatal(err)
	}
	cl := newCluster(t, "mipc", 3, 10)
	cl.stopController()
	// Liveness timings a loaded machine keeps, as in
	// TestEmuFailoverOfTwentyIPs: only the crashed Node is taken for dead.
	cl.opts.Liveness.Timeout, cl.opts.Liveness.DeadAfter = time.Second, 3*time.Second
	// Nodes n1 and n2 in zone a (the pool's first subnet), n3 in zone b.
	subnets, zones := []string{ec.subnet, ec.subnet, subnetB}, []string{"mipc-za", "mipc-za", "mipc-zb"}
	for i := range 3 {
		in, err := ec.emu.AddInstance(ec2emu.Instance{Type: "m5.large", SubnetID: subnets[i]})
		if err != nil {
			t.Fatal(err)
		}
		ec.instances = append(ec.instances, in)
		node := fmt.Sprintf("mipc-n%d", i+1)
		cl.setProviderID(node, in.ProviderID)
		cl.updateNode(node, func(n *corev1.Node) { n.Labels[corev1.LabelTopologyZone] = zones[i] }, false)
	}
	cl.opts.Cloud = CloudConfig{Provider: ec.p, RefreshInterval: 2 * time.Second, BackoffInitial: 200 * time.Millisecond, BackoffMax: 2 * time.Second}
	cl.startController()
	inst := func(node string) ec2emu.InstanceInfo { return ec.instances[nodeIndex(node)-1] }
	for i, sn := range []string{ec.subnet, subnetB} {
		cl.pool(fmt.Sprintf("mipc-%c", 'a'+i), func(p *v1.ExternalIPPool) {
			p.Spec.IPRanges = nil
			p.Spec.Cloud = &v1.CloudPool{Provider: v1.CloudProviderAWS, AWS: &v1.AWSPool{SubnetID: sn, InterfaceMode: v1.AWSPrimaryInterface}}
		})
	}
	cl.multiEgress("mipc", ipsEntry("mipc-a", 1, "mipc-za"), ipsEntry("mipc-b", 1, "mipc-zb"))

	// onENI checks that every IP of e is on its Node's primary interface in
	// the emulator, with that interface's MAC in status.ips.
	onENI := func(e *v1.Egress) (bool, string) {
		at := ec.attached()
		for k, s := range e.Status.IPs {
			if s.Node == "" || !s.Ready {
				return false, describeIPs(e)
			}
			in := inst(s.Node)
			if got := at[netip.MustParseAddr(s.IP)]; got != in.PrimaryInterface {
				return false, fmt.Sprintf("status.ips[%d] %s on %s, but the emulator has it on %q, not %s", k, s.IP, s.Node, got, in.PrimaryInterface)
			}
			if !strings.EqualFold(s.InterfaceMAC, in.MAC) {
				return false, fmt.Sprintf("status.ips[%d] interfaceMAC %q, want %s's %s", k, s.InterfaceMAC, s.Node, in.MAC)
			}
		}
		return true, ""
	}
	e := cl.waitReadyIPs("mipc", "2/2")
	cl.eventually("each IP on its Node's interface", func() (bool, string) { e = cl.get("mipc"); return onENI(e) })
	for k, want := range []struct{ pool, zone string }{{"mipc-a", "mipc-za"}, {"mipc-b", "mipc-zb"}} {
		s := e.Status.IPs[k]
		if s.Pool != want.pool || s.Zone != want.zone || !slices.Contains(cl.nodesOfZone(want.zone), s.Node) {
			t.Fatalf("status.ips[%d] = %+v, want pool %s on a Node of zone %s", k, s, want.pool, want.zone)
		}
		if !netip.MustParsePrefix(map[string]string{"mipc-a": "10.20.0.0/24", "mipc-b": "10.20.1.0/24"}[s.Pool]).Contains(netip.MustParseAddr(s.IP)) {
			t.Fatalf("status.ips[%d] %s is not in its pool's subnet", k, s.IP)
		}
	}
	before := e.Status.IPs
	oldA, keepB := before[0], before[1]

	time.Sleep(time.Second) // let the refill and re-reads settle before counting
	ec.emu.ResetCounts()
	cl.crash(oldA.Node)
	newA := map[string]string{"mipc-n1": "mipc-n2", "mipc-n2": "mipc-n1"}[oldA.Node]
	cl.eventually("the zone-a IP Ready on the other zone-a Node", func() (bool, string) {
		e = cl.get("mipc")
		if e.Status.ReadyIPs != "2/2" || e.Status.IPs[0].Node != newA {
			return false, describeIPs(e)
		}
		return onENI(e)
	})
	if s := e.Status.IPs[0]; s.IP != oldA.IP {
		t.Errorf("the zone-a IP changed from %s to %s; a move keeps the address", oldA.IP, s.IP)
	}
	if s := e.Status.IPs[1]; s.IP != keepB.IP || s.Node != keepB.Node || s.InterfaceMAC != keepB.InterfaceMAC {
		t.Errorf("the zone-b IP moved: %+v, was %+v", s, keepB)
	}
	if st, _ := ec.emu.Interface(inst(oldA.Node).PrimaryInterface); slices.Contains(st.Secondary, netip.MustParseAddr(oldA.IP)) {
		t.Errorf("%s is still on the dead Node's interface %s", oldA.IP, st.ID)
	}
	if st, _ := ec.emu.Interface(inst(keepB.Node).PrimaryInterface); !slices.Contains(st.Secondary, netip.MustParseAddr(keepB.IP)) {
		t.Errorf("%s left %s's interface", keepB.IP, keepB.Node)
	}
	t.Logf("before: %s on %s (%s), %s on %s (%s); after the crash of %s: %s on %s (%s)", oldA.IP, oldA.Node, oldA.InterfaceMAC, keepB.IP, keepB.Node, keepB.InterfaceMAC,
		oldA.Node, e.Status.IPs[0].IP, e.Status.IPs[0].Node, e.Status.IPs[0].InterfaceMAC)
	if n, u := ec.emu.Calls("AssignPrivateIpAddresses"), ec.emu.Calls("UnassignPrivateIpAddresses"); n != 1 || u != 0 {
		t.Errorf("moving one IP took %d Assign and %d Unassign calls, want 1 reassigning Assign", n, u)
	}
	if ev := cl.events("mipc", v1.EventAssigned); !slices.ContainsFunc(ev, func(n string) bool { return strings.Contains(n, oldA.IP+" assigned to Node "+newA) }) {
		t.Errorf("no Assigned Event for %s on %s: %q", oldA.IP, newA, ev)
	}
}

// nodesOfZone lists the cluster's Nodes labelled with zone.
func (cl *cluster) nodesOfZone(zone string) []string {
	cl.t.Helper()
	var list corev1.NodeList
	if err := cl.c.List(cl.ctx, &list); err != nil {
		cl.t.Fatal(err)
	}
	var out []string
	for _, n := range list.Items {
		if n.Labels[corev1.LabelTopologyZone] == zone {
			out = append(out, n.Name)
		}
	}
	return out
}
