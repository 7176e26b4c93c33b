package controller

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/cloud/aws/ec2emu"
	"github.com/egressip/egressip/internal/cloud/warm"
	"github.com/egressip/egressip/internal/testutil/poll"
)

// ownPool is a cloud pool in interface mode OwnInterfaces (the default:
// the mode field is left out) on the emulator's subnet.
func ownPool(ec *emuCloud, warmTarget int32, mutate func(*v1.AWSPool)) func(*v1.ExternalIPPool) {
	return func(p *v1.ExternalIPPool) {
		p.Spec.IPRanges = nil
		a := &v1.AWSPool{SubnetID: ec.subnet}
		if mutate != nil {
			mutate(a)
		}
		p.Spec.Cloud = &v1.CloudPool{Provider: v1.CloudProviderAWS, AWS: a, WarmIPTarget: warmTarget}
	}
}

// ownPool creates a pool with ownPool's spec and, at clean-up (before
// the controller stops), deletes the test's Egresses of it and the pool
// and waits for the controller to finish its clean-up, so that the
// finalizer never outlives the test.
func (cl *cluster) ownPool(name string, spec func(*v1.ExternalIPPool)) {
	cl.t.Helper()
	cl.pool(name, spec)
	cl.t.Cleanup(func() {
		var list v1.EgressList
		if err := cl.c.List(context.Background(), &list); err == nil {
			for i := range list.Items {
				if list.Items[i].Spec.ExternalIPPool == name {
					_ = cl.c.Delete(context.Background(), &list.Items[i])
				}
			}
		}
		p := &v1.ExternalIPPool{}
		p.Name = name
		_ = cl.c.Delete(context.Background(), p)
		if poll.Wait(context.Background(), poll.Interval, 30*time.Second, func() error {
			if err := cl.c.Get(context.Background(), client.ObjectKey{Name: name}, p); !apierrors.IsNotFound(err) {
				return fmt.Errorf("pool %s still there (%v)", name, err)
			}
			return nil
		}) != nil {
			cl.t.Errorf("pool %s not gone 30 s after deletion: %+v", name, p.Status)
		}
	})
}

// ourENIs returns the emulator's interfaces that carry our cluster tag.
func (ec *emuCloud) ourENIs() []ec2emu.InterfaceState {
	var out []ec2emu.InterfaceState
	for _, st := range ec.emu.Interfaces() {
		if st.Tags[TagCluster] != "" {
			out = append(out, st)
		}
	}
	return out
}

// snapshotForeign records every interface without our tags and its
// addresses, to check later that nothing of it changed.
func (ec *emuCloud) snapshotForeign() map[string][]netip.Addr {
	out := map[string][]netip.Addr{}
	for _, st := range ec.emu.Interfaces() {
		if st.Tags[TagCluster] == "" {
			out[st.ID] = st.Secondary
		}
	}
	return out
}

// foreignUntouched fails unless every interface of before still exists
// with the same addresses, and no API call of the controller changed an
// interface without our tags.
func (ec *emuCloud) foreignUntouched(t *testing.T, before map[string][]netip.Addr) {
	t.Helper()
	byIpamd := map[string]bool{} // the CNI's own changes are not ours to check
	for _, m := range ec.emu.Mutations() {
		if strings.HasPrefix(m.Action, "ipamd:") {
			byIpamd[m.Interface] = true
		}
	}
	for id, ips := range before {
		st, ok := ec.emu.Interface(id)
		if !ok {
			t.Errorf("foreign interface %s was deleted", id)
			continue
		}
		if !byIpamd[id] && !slices.Equal(st.Secondary, ips) {
			t.Errorf("foreign interface %s changed: %v, was %v", id, st.Secondary, ips)
		}
	}
	ours := map[string]bool{}
	for _, m := range ec.emu.Mutations() {
		if m.Action == "CreateNetworkInterface" {
			ours[m.Interface] = true
		}
	}
	for _, m := range ec.emu.Mutations() {
		if strings.HasPrefix(m.Action, "ipamd:") || ours[m.Interface] {
			continue
		}
		if _, foreign := before[m.Interface]; foreign {
			t.Errorf("the controller called %s on foreign interface %s (%v)", m.Action, m.Interface, m.Addresses)
		}
	}
}

// nothingUnused fails unless every address on our interfaces is an Egress
// status's or in the pool's warm list (want: expected warm count, -1 any),
// and every interface of ours is attached to the Node it was made for.
func (cl *cluster) nothingUnused(ec *emuCloud, wantENIs int) {
	cl.t.Helper()
	cl.eventually("nothing of ours unused in EC2", func() (bool, string) {
		var list v1.EgressList
		if err := cl.c.List(cl.ctx, &list); err != nil {
			return false, err.Error()
		}
		used := map[netip.Addr]bool{}
		for _, e := range list.Items {
			if ip, err := netip.ParseAddr(e.Status.EgressIP); err == nil {
				used[ip] = true
			}
		}
		var pools v1.ExternalIPPoolList
		if err := cl.c.List(cl.ctx, &pools); err != nil {
			return false, err.Error()
		}
		for _, p := range pools.Items {
			if p.Status.Cloud != nil {
				for _, w := range p.Status.Cloud.WarmIPs {
					used[netip.MustParseAddr(w.IP)] = true
				}
			}
		}
		enis := ec.ourENIs()
		for _, e := range enis {
			if !e.Attached {
				return false, fmt.Sprintf("interface %s of ours is detached but not deleted", e.ID)
			}
			for _, ip := range e.Secondary {
				if !used[ip] {
					return false, fmt.Sprintf("%s on our interface %s (%v) is used by nothing (warm lists %s)", ip, e.ID, e.Tags, warmLists(pools.Items))
				}
			}
		}
		if wantENIs >= 0 && len(enis) != wantENIs {
			return false, fmt.Sprintf("%d interfaces of ours, want %d", len(enis), wantENIs)
		}
		return true, ""
	})
}

// ipamdScenario runs the VPC CNI's ipamd (warm-IP mode, WARM_IP_TARGET=1)
// on one Node while an Egress of a pool in the given interface mode gets
// its IP, and returns the egress IP, what the actor adopted and freed,
// and whether the address is still attached where the status says.
func ipamdScenario(t *testing.T, prefix, cidr string, mode v1.AWSInterfaceMode) (netip.Addr, []ec2emu.Adoption, []ec2emu.Adoption, bool) {
	ec := newEmuCloud(t, ec2emu.Config{}, cidr)
	cl := newEmuCluster(t, prefix, 1, 10, ec, "m5.large")
	actor, err := ec.emu.NewIpamd(ec2emu.IpamdConfig{InstanceID: ec.instances[0].ID, WarmIPTarget: 1})
	if err != nil {
		t.Fatal(err)
	}
	// The CNI fills its warm pool and a Pod takes that address; the next
	// reconcile refills the warm one.
	actor.Step()
	if _, ok := actor.AssignPod(); !ok {
		t.Fatal("the actor has no address for a Pod")
	}
	actor.Step()
	cl.ownPool(prefix, ownPool(ec, 0, func(a *v1.AWSPool) { a.InterfaceMode = mode }))
	cl.egress(prefix+"-a", prefix, "")
	e := cl.waitReady(prefix + "-a")[prefix+"-a"]
	ip := netip.MustParseAddr(e.Status.EgressIP)
	for range 3 {
		actor.Step()
	}
	owner := ec.emu.Owner(ec.subnet, ip)
	st, _ := ec.emu.Interface(owner)
	stillThere := owner != "" && st.MAC == e.Status.InterfaceMAC
	return ip, actor.Adopted(), actor.Freed(), stillThere
}

func lostTo(ip netip.Addr, adopted, freed []ec2emu.Adoption) string {
	var why []string
	for _, a := range adopted {
		if a.Addr == ip {
			why = append(why, fmt.Sprintf("adopted from %s at reconcile %d", a.Interface, a.Step))
		}
	}
	for _, a := range freed {
		if a.Addr == ip {
			why = append(why, fmt.Sprintf("unassigned from %s at reconcile %d", a.Interface, a.Step))
		}
	}
	return strings.Join(why, ", ")
}

// TestIpamdActorKeepsEgressIPs: with the VPC CNI's ipamd running, an
// egress IP of a pool in the default interface mode is never adopted or
// freed. EGRESSIP_TEST_IPAMD_MODE=PrimaryInterface runs the same test on
// the old design (egress IPs on the primary ENI), where it fails.
func TestIpamdActorKeepsEgressIPs(t *testing.T) {
	mode := v1.AWSInterfaceMode(os.Getenv("EGRESSIP_TEST_IPAMD_MODE")) // "" = the pool's default
	ip, adopted, freed, still := ipamdScenario(t, "ipkeep", "10.21.0.0/24", mode)
	if why := lostTo(ip, adopted, freed); why != "" || !still {
		t.Fatalf("egress IP %s lost to the VPC CNI: %s (still attached where the status says: %v)", ip, why, still)
	}
}

// TestIpamdActorTakesEgressIPOnPrimaryENI shows the fault of the primary
// ENI mode (the design before OwnInterfaces, kept as an opt-in for
// clusters without the VPC CNI): ipamd adopts the egress IP as a Pod
// address and, being above its warm target, unassigns it.
func TestIpamdActorTakesEgressIPOnPrimaryENI(t *testing.T) {
	ip, adopted, freed, still := ipamdScenario(t, "iplose", "10.22.0.0/24", v1.AWSPrimaryInterface)
	why := lostTo(ip, adopted, freed)
	t.Logf("PrimaryInterface mode: egress IP %s: %s", ip, why)
	if !strings.Contains(why, "adopted") || !strings.Contains(why, "unassigned") || still {
		t.Fatalf("want %s adopted and unassigned by ipamd in PrimaryInterface mode, got %q (still attached: %v)", ip, why, still)
	}
}

// TestIpamdActorFiftyEgressesTenPeriods: ipamd on every Node of three, 50
// Egresses, ten actor periods: no egress IP ever on an interface without
// no_manage, none adopted or freed, all stay Ready.
func TestIpamdActorFiftyEgressesTenPeriods(t *testing.T) {
	ec := newEmuCloud(t, ec2emu.Config{ConsistencyDelay: 300 * time.Millisecond}, "10.23.0.0/22")
	cl := newEmuCluster(t, "ip50", 3, 30, ec, "m5.xlarge")
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var actors []*ec2emu.Ipamd
	for _, in := range ec.instances {
		a, err := ec.emu.NewIpamd(ec2emu.IpamdConfig{InstanceID: in.ID, WarmIPTarget: 2, Period: 500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		a.Step()
		a.AssignPod()
		actors = append(actors, a)
		go a.Run(ctx)
	}
	foreign := ec.snapshotForeign()
	cl.ownPool("ip50", ownPool(ec, 4, nil))
	egs := names("ip50", 50)
	for _, e := range egs {
		cl.egress(e, "ip50", "")
	}
	cl.waitReady(egs...)
	start := make([]int, len(actors))
	for i, a := range actors {
		start[i] = a.Steps()
	}
	check := func() (bool, string) {
		ours := map[netip.Addr]bool{}
		for _, n := range egs {
			e := cl.get(n)
			if !ready(e) {
				return false, "not Ready: " + describe(e)
			}
			ip := netip.MustParseAddr(e.Status.EgressIP)
			ours[ip] = true
			st, ok := ec.emu.Interface(ec.emu.Owner(ec.subnet, ip))
			if !ok || st.Tags[ec2emu.NoManageTag] != "true" || st.MAC != e.Status.InterfaceMAC {
				t.Fatalf("%s of %s is on interface %+v, not on one of ours tagged no_manage with MAC %s", ip, n, st, e.Status.InterfaceMAC)
			}
		}
		for _, a := range actors {
			for _, x := range append(a.Adopted(), a.Freed()...) {
				if ours[x.Addr] {
					t.Fatalf("ipamd took egress IP %s (%+v)", x.Addr, x)
				}
			}
		}
		for i, a := range actors {
			if a.Steps()-start[i] < 10 {
				return false, fmt.Sprintf("actor %d at %d periods", i, a.Steps()-start[i])
			}
		}
		return true, ""
	}
	cl.eventually("10 ipamd periods with every egress IP kept", check)
	cl.nothingUnused(ec, -1)
	ec.foreignUntouched(t, foreign)
	byNode := map[string]int{}
	for _, e := range ec.ourENIs() {
		byNode[e.Tags[TagNode]]++
	}
	t.Logf("our interfaces per Node: %v; EC2 calls: %v", byNode, ec.emu.Counts())
}

// TestCloudCapacityOwnInterfaces: m5.large (3 interfaces x 10 addresses)
// with the primary interface the CNI's: 2 interfaces of ours x 9
// secondary addresses = 18 egress IPs; a Node fills a second interface
// when the first is full; the 19th Egress finds no room.
func TestCloudCapacityOwnInterfaces(t *testing.T) {
	ec := newEmuCloud(t, ec2emu.Config{}, "10.24.0.0/24")
	cl := newEmuCluster(t, "ecap", 1, 100, ec, "m5.large")
	cl.ownPool("ecap", ownPool(ec, 0, nil))
	egs := names("ecap", 18)
	for _, e := range egs[:12] {
		cl.egress(e, "ecap", "")
	}
	cl.waitReady(egs[:12]...)
	enis := ec.ourENIs()
	if len(enis) != 2 {
		t.Fatalf("%d interfaces of ours for 12 addresses on 9-address interfaces, want 2: %+v", len(enis), enis)
	}
	slices.SortFunc(enis, func(a, b ec2emu.InterfaceState) int { return a.DeviceIndex - b.DeviceIndex })
	if enis[0].DeviceIndex != 1 || enis[1].DeviceIndex != 2 || len(enis[0].Secondary) != 9 || len(enis[1].Secondary) != 3 {
		t.Fatalf("want device 1 full (9) and device 2 with 3: %+v", enis)
	}
	for _, e := range enis {
		if !e.DeleteOnTermination || e.Tags[ec2emu.NoManageTag] != "true" || e.Tags[TagPool] != "ecap" || e.Tags[TagNode] != "ecap-n1" {
			t.Fatalf("interface %s: DeleteOnTermination %v, tags %v", e.ID, e.DeleteOnTermination, e.Tags)
		}
		if !slices.Equal(e.Groups, []string{ec2emu.DefaultSecurityGroup}) {
			t.Fatalf("interface %s has groups %v, want the primary interface's", e.ID, e.Groups)
		}
	}
	for _, e := range egs[12:] {
		cl.egress(e, "ecap", "")
	}
	cl.waitReady(egs...)
	cl.egress("ecap-19", "ecap", "")
	cl.eventually("the 19th Egress finds no room", func() (bool, string) {
		e := cl.get("ecap-19")
		c := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionAssigned)
		return c != nil && c.Status == "False" && e.Status.EgressNode == "", describe(e)
	})
	if n := len(ec.ourENIs()); n != 2 {
		t.Fatalf("%d interfaces of ours, want 2 (the instance's limit is 3, the primary included)", n)
	}
	// The pool says why it cannot grow.
	cl.eventually("pool condition InterfaceLimitReached", func() (bool, string) {
		c := meta.FindStatusCondition(cl.poolStatus("ecap").Conditions, v1.ConditionCloudInterfaces)
		return c != nil && c.Reason == v1.ReasonInterfaceLimit, fmt.Sprintf("%+v", c)
	})
}

// deletePool deletes a pool and waits until it is gone (its finalizer
// removed).
func (cl *cluster) deletePool(name string) {
	cl.t.Helper()
	p := &v1.ExternalIPPool{}
	p.Name = name
	if err := cl.c.Delete(cl.ctx, p); err != nil && !apierrors.IsNotFound(err) {
		cl.t.Fatal(err)
	}
	cl.eventually("pool "+name+" gone", func() (bool, string) {
		err := cl.c.Get(cl.ctx, client.ObjectKey{Name: name}, p)
		return apierrors.IsNotFound(err), fmt.Sprintf("%v %+v", err, p.Status)
	})
}

func (cl *cluster) deleteEgresses(egs ...string) {
	cl.t.Helper()
	for _, n := range egs {
		e := &v1.Egress{}
		e.Name = n
		if err := cl.c.Delete(cl.ctx, e); err != nil && !apierrors.IsNotFound(err) {
			cl.t.Fatal(err)
		}
	}
}

// TestCloudCleanupPoolDeletion: deleting a pool unassigns every address
// (warm and cooling ones too) and deletes its empty interfaces before the
// finalizer goes; a foreign interface with addresses is not touched.
func TestCloudCleanupPoolDeletion(t *testing.T) {
	ec := newEmuCloud(t, ec2emu.Config{}, "10.25.0.0/24")
	cl := newEmuCluster(t, "ecdel", 2, 20, ec, "m5.large")
	// Another party's interface (the CNI's second ENI) with Pod addresses.
	if _, err := ec.emu.AddInterface(ec.instances[0].ID, ec2emu.InterfaceOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := ec.emu.UseSlots(ec.instances[0].PrimaryInterface, 3); err != nil {
		t.Fatal(err)
	}
	foreign := ec.snapshotForeign()
	cl.ownPool("ecdel", ownPool(ec, 3, nil))
	egs := names("ecdel", 4)
	for _, e := range egs {
		cl.egress(e, "ecdel", "")
	}
	cl.waitReady(egs...)
	cl.waitWarm("ecdel", 3)
	if len(ec.ourENIs()) == 0 {
		t.Fatal("no interface of ours")
	}
	cl.deleteEgresses(egs...) // their addresses cool down
	cl.deletePool("ecdel")
	if left := ec.ourENIs(); len(left) != 0 {
		t.Fatalf("interfaces of ours left after the pool was deleted: %+v", left)
	}
	ec.foreignUntouched(t, foreign)
}

// TestCloudCleanupNodeIneligible: the addresses of a Node that leaves the
// pool (label removed), is cordoned or is deleted are released, warm ones
// included, and its empty interfaces deleted.
func TestCloudCleanupNodeIneligible(t *testing.T) {
	ec := newEmuCloud(t, ec2emu.Config{}, "10.26.0.0/24")
	cl := newEmuCluster(t, "ecnode", 3, 20, ec, "m5.large")
	foreign := ec.snapshotForeign()
	cl.ownPool("ecnode", ownPool(ec, 6, nil))
	cl.waitWarm("ecnode", 6)
	onNode := func(node string) int {
		n := 0
		for _, e := range ec.ourENIs() {
			if e.Tags[TagNode] == node {
				n++
			}
		}
		return n
	}
	for _, n := range []string{"ecnode-n1", "ecnode-n2", "ecnode-n3"} {
		if onNode(n) == 0 {
			t.Fatalf("no interface of ours on %s before", n)
		}
	}
	cl.cordonOrUncordon("ecnode-n1", true)
	cl.updateNode("ecnode-n2", func(n *corev1.Node) { delete(n.Labels, "egress") }, false)
	cl.eventually("n1 and n2 emptied", func() (bool, string) {
		return onNode("ecnode-n1") == 0 && onNode("ecnode-n2") == 0, fmt.Sprintf("%+v", ec.ourENIs())
	})
	// All on n3 now. Emptying n1 and n2 may have detached addresses, and
	// the next scale-down (here 7 to 6) then waits for ScaleDownInterval.
	cl.waitWarmWithin("ecnode", 6, warm.ScaleDownInterval+20*time.Second)
	cl.nothingUnused(ec, -1)
	// The last Node is deleted (its instance keeps running): the
	// collector deletes its interfaces, warm addresses and all.
	if err := cl.c.Delete(cl.ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "ecnode-n3"}}); err != nil {
		t.Fatal(err)
	}
	cl.eventually("n3's interfaces deleted", func() (bool, string) {
		return len(ec.ourENIs()) == 0, fmt.Sprintf("%+v", ec.ourENIs())
	})
	cl.nothingUnused(ec, 0)
	ec.foreignUntouched(t, foreign)
}

// TestCloudCleanupWarmTargetLowered: lowering warmIPTarget detaches the
// surplus with one call per interface.
func TestCloudCleanupWarmTargetLowered(t *testing.T) {
	ec := newEmuCloud(t, ec2emu.Config{}, "10.27.0.0/24")
	cl := newEmuCluster(t, "ecwarm", 2, 20, ec, "m5.large")
	cl.ownPool("ecwarm", ownPool(ec, 8, nil))
	cl.waitWarm("ecwarm", 8)
	ec.emu.ResetCounts()
	cl.patchPool("ecwarm", func(p *v1.ExternalIPPool) { p.Spec.Cloud.WarmIPTarget = 2 })
	cl.waitWarm("ecwarm", 2)
	if n, enis := ec.emu.Calls("UnassignPrivateIpAddresses"), len(ec.ourENIs()); n == 0 || n > enis {
		t.Fatalf("%d Unassign calls for %d interfaces, want one per interface at most", n, enis)
	}
	cl.nothingUnused(ec, -1)
}

// TestCloudCleanupAfterDowntime: the controller is down while Egresses
// and their pool are deleted, and a crash left an interface of ours
// created but never attached; once started again it releases and deletes
// all of it, and touches no foreign interface (one of them detached and
// untagged, one tagged by another cluster).
func TestCloudCleanupAfterDowntime(t *testing.T) {
	ec := newEmuCloud(t, ec2emu.Config{}, "10.28.0.0/24")
	// m5.xlarge (4 interfaces): the test adds two interfaces of its own
	// to Nodes the controller has already given one or, under load,
	// sometimes two interfaces of ours (fault noted in the stop 29 note;
	// on m5.large the test's own AddInterface then failed, "already has 3
	// interfaces").
	cl := newEmuCluster(t, "ecdown", 2, 20, ec, "m5.xlarge")
	cl.ownPool("ecdown", ownPool(ec, 2, nil))
	egs := names("ecdown", 3)
	for _, e := range egs {
		cl.egress(e, "ecdown", "")
	}
	cl.waitReady(egs...)
	// Foreign: another cluster's egressip interface on n2, attached.
	other, err := ec.emu.AddInterface(ec.instances[1].ID, ec2emu.InterfaceOptions{Tags: map[string]string{TagCluster: "another", TagNoManage: "true", TagPool: "ecdown"}})
	if err != nil {
		t.Fatalf("%v; interfaces: %+v", err, ec.emu.Interfaces())
	}
	foreign := ec.snapshotForeign()
	cl.stopController()
	// An orphan of ours: created, never attached.
	orphan, err := ec.emu.AddInterface(ec.instances[0].ID, ec2emu.InterfaceOptions{Tags: map[string]string{TagCluster: "egressip", TagNoManage: "true", TagPool: "ecdown", TagNode: "ecdown-n1"}})
	if err != nil {
		t.Fatalf("%v; interfaces: %+v", err, ec.emu.Interfaces())
	}
	detachByHand(t, ec, orphan)
	cl.deleteEgresses(egs...)
	p := &v1.ExternalIPPool{}
	p.Name = "ecdown"
	if err := cl.c.Delete(cl.ctx, p); err != nil {
		t.Fatal(err)
	}
	cl.startController()
	cl.eventually("pool gone", func() (bool, string) {
		err := cl.c.Get(cl.ctx, client.ObjectKey{Name: "ecdown"}, p)
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	cl.eventually("nothing of ours left", func() (bool, string) {
		var left []string
		for _, e := range ec.ourENIs() {
			if e.Tags[TagCluster] == "egressip" {
				left = append(left, e.ID)
			}
		}
		return len(left) == 0, fmt.Sprint(left)
	})
	if _, ok := ec.emu.Interface(other); !ok {
		t.Fatal("another cluster's interface was deleted")
	}
	ec.foreignUntouched(t, foreign)
}

// detachByHand detaches an interface outside the controller (as a crash
// between CreateNetworkInterface and AttachNetworkInterface leaves one).
func detachByHand(t *testing.T, ec *emuCloud, id string) {
	t.Helper()
	if !ec.emu.Detach(id) {
		t.Fatalf("cannot detach %s", id)
	}
}

func warmLists(pools []v1.ExternalIPPool) string {
	var out []string
	for _, p := range pools {
		if p.Status.Cloud != nil {
			out = append(out, fmt.Sprintf("%s: %+v", p.Name, *p.Status.Cloud))
		}
	}
	return strings.Join(out, "; ")
}

// poolInterfacesCondition waits for the pool's CloudInterfaces condition
// to have the reason and a message containing every part.
func (cl *cluster) poolInterfacesCondition(pool, reason string, parts ...string) {
	cl.t.Helper()
	cl.eventually(pool+" condition "+reason, func() (bool, string) {
		c := meta.FindStatusCondition(cl.poolStatus(pool).Conditions, v1.ConditionCloudInterfaces)
		if c == nil || c.Reason != reason {
			return false, fmt.Sprintf("%+v", c)
		}
		for _, p := range parts {
			if !strings.Contains(c.Message, p) {
				return false, fmt.Sprintf("message %q lacks %q", c.Message, p)
			}
		}
		return true, ""
	})
}

// TestCloudOwnInterfacesBadInput: each bad input gives a pool condition
// that says what to do, and nothing already working is detached.
func TestCloudOwnInterfacesBadInput(t *testing.T) {
	t.Run("missing IAM permission", func(t *testing.T) {
		ec := newEmuCloud(t, ec2emu.Config{}, "10.29.0.0/24")
		cl := newEmuCluster(t, "ebiam", 1, 30, ec, "m5.large")
		cl.ownPool("ebiam", ownPool(ec, 0, nil))
		first := names("ebiam", 10)
		for _, e := range first[:9] {
			cl.egress(e, "ebiam", "")
		}
		before := cl.waitReady(first[:9]...)
		ec.emu.Deny("CreateNetworkInterface")
		cl.egress(first[9], "ebiam", "") // needs a second interface
		cl.poolInterfacesCondition("ebiam", v1.ReasonInterfaceFailed, "ec2:CreateNetworkInterface")
		cl.eventually("the Egress says why it waits", func() (bool, string) {
			c := meta.FindStatusCondition(cl.get(first[9]).Status.Conditions, v1.ConditionIPAllocated)
			return c != nil && strings.Contains(c.Message, "ec2:CreateNetworkInterface"), describe(cl.get(first[9]))
		})
		for n, e := range before {
			if now := cl.get(n); !ready(now) || now.Status.EgressIP != e.Status.EgressIP || ec.emu.Owner(ec.subnet, netip.MustParseAddr(e.Status.EgressIP)) == "" {
				t.Fatalf("%s changed while the permission was missing: %s", n, describe(now))
			}
		}
		ec.emu.Allow("CreateNetworkInterface")
		cl.waitReady(first...)
		cl.poolInterfacesCondition("ebiam", v1.ReasonInterfacesReady)
	})
	t.Run("security group that does not exist", func(t *testing.T) {
		ec := newEmuCloud(t, ec2emu.Config{}, "10.30.0.0/24")
		cl := newEmuCluster(t, "ebsg", 1, 30, ec, "m5.large")
		cl.ownPool("ebsg", ownPool(ec, 1, func(a *v1.AWSPool) { a.SecurityGroupIDs = []string{"sg-0123456789abcdef0"} }))
		cl.poolInterfacesCondition("ebsg", v1.ReasonInterfaceFailed, "sg-0123456789abcdef0", "InvalidGroup.NotFound")
		if n := len(ec.ourENIs()); n != 0 {
			t.Fatalf("%d interfaces of ours left after the failed create", n)
		}
		ec.emu.AddSecurityGroup("sg-0123456789abcdef0")
		cl.waitWarm("ebsg", 1)
		if g := ec.ourENIs()[0].Groups; !slices.Equal(g, []string{"sg-0123456789abcdef0"}) {
			t.Fatalf("groups %v, want the pool's", g)
		}
	})
	t.Run("subnet in another availability zone", func(t *testing.T) {
		ec := newEmuCloud(t, ec2emu.Config{}, "10.31.0.0/24")
		cl := newEmuCluster(t, "ebaz", 1, 30, ec, "m5.large")
		other, err := ec.emu.AddSubnet(ec2emu.Subnet{ID: fmt.Sprintf("subnet-%08x", hashName(t.Name())), CIDR: netip.MustParsePrefix("10.32.0.0/24"), AvailabilityZone: "us-east-1b"})
		if err != nil {
			t.Fatal(err)
		}
		cl.ownPool("ebaz", func(p *v1.ExternalIPPool) {
			ownPool(ec, 1, nil)(p)
			p.Spec.Cloud.AWS.SubnetID = other
		})
		cl.poolInterfacesCondition("ebaz", v1.ReasonSubnetUnusable, other, "us-east-1b", "pick a subnet in the Nodes' zone")
	})
	t.Run("subnet that does not exist", func(t *testing.T) {
		ec := newEmuCloud(t, ec2emu.Config{}, "10.33.0.0/24")
		cl := newEmuCluster(t, "ebns", 1, 30, ec, "m5.large")
		cl.ownPool("ebns", func(p *v1.ExternalIPPool) {
			ownPool(ec, 1, nil)(p)
			p.Spec.Cloud.AWS.SubnetID = "subnet-0badc0de"
		})
		cl.poolInterfacesCondition("ebns", v1.ReasonSubnetUnusable, "subnet-0badc0de", "fix spec.cloud.aws.subnetID")
	})
	t.Run("instance at its interface limit", func(t *testing.T) {
		ec := newEmuCloud(t, ec2emu.Config{}, "10.34.0.0/24")
		cl := newEmuCluster(t, "eblim", 1, 30, ec, "t3.micro") // 2 interfaces
		if _, err := ec.emu.AddInterface(ec.instances[0].ID, ec2emu.InterfaceOptions{}); err != nil {
			t.Fatal(err) // the CNI's second ENI
		}
		cl.ownPool("eblim", ownPool(ec, 0, nil))
		cl.egress("eblim-a", "eblim", "")
		cl.poolInterfacesCondition("eblim", v1.ReasonInterfaceLimit, "eblim-n1", "maxInterfacesPerNode")
		if n := ec.emu.Calls("CreateNetworkInterface"); n != 0 {
			t.Fatalf("%d CreateNetworkInterface calls for an instance at its limit", n)
		}
	})
}

// TestCloudLateFacts: with the periodic re-read at one minute, a Node
// whose spec.providerID is set after it registered and a Node whose
// instance type changes are seen within the 20 s of cl.eventually: the
// Node event triggers a pass, and the pass a re-read.
func TestCloudLateFacts(t *testing.T) {
	ec := newEmuCloud(t, ec2emu.Config{}, "10.35.0.0/24")
	cl := newCluster(t, "elate", 2, 30)
	cl.stopController()
	for range 2 {
		in, err := ec.emu.AddInstance(ec2emu.Instance{Type: "t3.micro", SubnetID: ec.subnet}) // 2 ENIs x 2: 1 egress IP
		if err != nil {
			t.Fatal(err)
		}
		ec.instances = append(ec.instances, in)
	}
	cl.setProviderID("elate-n1", ec.instances[0].ProviderID)
	cl.updateNode("elate-n1", func(n *corev1.Node) { n.Labels[corev1.LabelInstanceTypeStable] = "t3.micro" }, false)
	cl.opts.Cloud = CloudConfig{Provider: ec.p, RefreshInterval: time.Minute, BackoffInitial: 200 * time.Millisecond, BackoffMax: 2 * time.Second}
	cl.startController()
	cl.ownPool("elate", ownPool(ec, 0, nil))
	cl.egress("elate-a", "elate", "")
	cl.waitReady("elate-a")
	cl.egress("elate-b", "elate", "")
	cl.eventually("elate-b waits for room", func() (bool, string) {
		e := cl.get("elate-b")
		return e.Status.EgressNode == "" && !ready(e), describe(e)
	})
	// n2 gets its providerID late: b lands there.
	cl.setProviderID("elate-n2", ec.instances[1].ProviderID)
	e := cl.waitReady("elate-b")["elate-b"]
	if e.Status.EgressNode != "elate-n2" {
		t.Fatalf("elate-b on %s, want elate-n2", e.Status.EgressNode)
	}
	// n1 is resized to m5.large (3 ENIs x 10): room for c at once.
	cl.egress("elate-c", "elate", "")
	cl.eventually("elate-c waits for room", func() (bool, string) {
		e := cl.get("elate-c")
		return e.Status.EgressNode == "" && !ready(e), describe(e)
	})
	if err := ec.emu.SetInstanceType(ec.instances[0].ID, "m5.large"); err != nil {
		t.Fatal(err)
	}
	cl.updateNode("elate-n1", func(n *corev1.Node) { n.Labels[corev1.LabelInstanceTypeStable] = "m5.large" }, false)
	if e := cl.waitReady("elate-c")["elate-c"]; e.Status.EgressNode != "elate-n1" {
		t.Fatalf("elate-c on %s, want the resized elate-n1", e.Status.EgressNode)
	}
}
