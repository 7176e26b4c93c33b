package controller

import (
	"slices"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/cloud"
	"github.com/egressip/egressip/internal/cloud/aws/ec2emu"
)

// nicCluster is one t3.micro Node (2 interfaces x 2 addresses: one
// egress IP on an interface of ours, none when another party's interface
// takes the second slot) on the emulator, with the periodic re-read at
// ten minutes so that only an event can make the controller see a change
// within the test. attachForeign attaches the CNI's interface first.
func nicCluster(t *testing.T, prefix, cidr string, attachForeign bool) (*cluster, *emuCloud, *CloudActuator, string) {
	t.Helper()
	ec := newEmuCloud(t, ec2emu.Config{}, cidr)
	cl := newCluster(t, prefix, 1, 30)
	cl.stopController()
	in, err := ec.emu.AddInstance(ec2emu.Instance{Type: "t3.micro", SubnetID: ec.subnet})
	if err != nil {
		t.Fatal(err)
	}
	ec.instances = append(ec.instances, in)
	node := prefix + "-n1"
	cl.setProviderID(node, in.ProviderID)
	nics := []string{ec.mac(t, in.PrimaryInterface)}
	foreign := ""
	if attachForeign {
		if foreign, err = ec.emu.AddInterface(in.ID, ec2emu.InterfaceOptions{}); err != nil {
			t.Fatal(err)
		}
		nics = append(nics, ec.mac(t, foreign))
	}
	cl.agents[node].setNICs(nics)
	var c *CloudActuator
	cl.opts.onCloud = func(x *CloudActuator) { c = x }
	cl.opts.Cloud = CloudConfig{Provider: ec.p, RefreshInterval: 10 * time.Minute, BackoffInitial: 200 * time.Millisecond, BackoffMax: 2 * time.Second}
	cl.startController()
	return cl, ec, c, foreign
}

// mac is an emulated interface's MAC.
func (ec *emuCloud) mac(t *testing.T, id string) string {
	t.Helper()
	st, ok := ec.emu.Interface(id)
	if !ok {
		t.Fatalf("no interface %s", id)
	}
	return st.MAC
}

// TestCloudForeignInterfaceSeen: an interface another party (the VPC
// CNI) attaches to or detaches from a Node's instance is in the
// controller's view, and changes what the Node can hold, within seconds
// (cl.eventually's 20 s) although the periodic re-read is ten minutes
// away: the agent's report lists the Node's NICs, and a list that differs
// from the cloud view makes the controller re-read.
func TestCloudForeignInterfaceSeen(t *testing.T) {
	t.Run("attached", func(t *testing.T) {
		cl, ec, c, _ := nicCluster(t, "fnat", "10.36.0.0/24", false)
		node, in := "fnat-n1", ec.instances[0]
		// No pool yet: a new pool's first pass asks for a re-read (to
		// describe its subnet), which would see the interface too.
		cl.eventually("the Node in the cloud view", func() (bool, string) {
			ifc, ok := c.view(node)
			return ok && len(ifc.Others) == 0, "no view yet"
		})
		foreign, err := ec.emu.AddInterface(in.ID, ec2emu.InterfaceOptions{}) // the CNI grows
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		instBefore, eniBefore := ec.emu.Calls("DescribeInstances"), ec.emu.Calls("DescribeNetworkInterfaces")
		cl.agents[node].setNICs([]string{ec.mac(t, in.PrimaryInterface), ec.mac(t, foreign)})
		cl.eventually("the CNI's interface in the controller's view", func() (bool, string) {
			ifc, _ := c.view(node)
			return slices.ContainsFunc(ifc.Others, func(e cloud.ENI) bool { return e.ID == foreign }), "others: " + eniIDs(ifc.Others)
		})
		t.Logf("FIGURE attached interface in the view %v after the agent listed it (periodic re-read: 10 min)", time.Since(start).Round(time.Millisecond))
		// One call re-read that Node's instance; no full refresh (which
		// would also list our interfaces by tag).
		if n, m := ec.emu.Calls("DescribeInstances")-instBefore, ec.emu.Calls("DescribeNetworkInterfaces")-eniBefore; n != 1 || m != 0 {
			t.Fatalf("%d DescribeInstances and %d DescribeNetworkInterfaces calls for the re-read, want 1 and 0: %v", n, m, ec.emu.Counts())
		}
		// The instance's interface slots are all taken now: an Egress
		// waits, and the controller does not even try to create one.
		cl.ownPool("fnat", ownPool(ec, 0, nil))
		cl.egress("fnat-a", "fnat", "")
		cl.poolInterfacesCondition("fnat", v1.ReasonInterfaceLimit, node)
		if n := ec.emu.Calls("CreateNetworkInterface"); n != 0 {
			t.Fatalf("%d CreateNetworkInterface calls on an instance whose slots the CNI took", n)
		}
	})
	t.Run("detached", func(t *testing.T) {
		cl, ec, c, foreign := nicCluster(t, "fndt", "10.37.0.0/24", true)
		node, in := "fndt-n1", ec.instances[0]
		cl.ownPool("fndt", ownPool(ec, 0, nil))
		cl.egress("fndt-a", "fndt", "")
		cl.poolInterfacesCondition("fndt", v1.ReasonInterfaceLimit, node)
		if n := ec.emu.Calls("CreateNetworkInterface"); n != 0 {
			t.Fatalf("%d CreateNetworkInterface calls on an instance at its limit", n)
		}
		if !ec.emu.Detach(foreign) { // the CNI gives its interface back
			t.Fatalf("could not detach %s", foreign)
		}
		start := time.Now()
		cl.agents[node].setNICs([]string{ec.mac(t, in.PrimaryInterface)})
		e := cl.waitReady("fndt-a")["fndt-a"]
		t.Logf("FIGURE waiting Egress Ready %v after the agent stopped listing the detached interface (periodic re-read: 10 min)", time.Since(start).Round(time.Millisecond))
		if e.Status.EgressNode != node {
			t.Fatalf("fndt-a on %q, want %s", e.Status.EgressNode, node)
		}
		ifc, _ := c.view(node)
		if slices.ContainsFunc(ifc.Others, func(e cloud.ENI) bool { return e.ID == foreign }) {
			t.Fatalf("the detached %s is still in the view: %s", foreign, eniIDs(ifc.Others))
		}
	})
}

func eniIDs(es []cloud.ENI) string {
	ids := make([]string, 0, len(es))
	for _, e := range es {
		ids = append(ids, e.ID)
	}
	return "[" + strings.Join(ids, ",") + "]"
}

// TestCloudNICRereadsBounded: a NIC list that differs from the cloud view
// asks for a re-read at once, then at most twice more, spaced; a list that
// matches asks for none, and a new list asks again.
func TestCloudNICRereadsBounded(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	c := NewCloudActuator(nil, CloudConfig{Provider: nil, Clock: clk})
	c.ready = true
	c.ifaces["n1"] = cloud.Interface{ID: "eni-1", MAC: "0a:00:00:00:00:01", Others: []cloud.ENI{{ID: "eni-2", MAC: "0a:00:00:00:00:02"}}}
	asked := func() bool {
		select {
		case <-c.nicNow:
			return true
		default:
			return false
		}
	}
	same := []string{"0a:00:00:00:00:01", "0a:00:00:00:00:02"}
	for range 5 {
		if c.nicsReported("n1", same); asked() {
			t.Fatal("a re-read asked for a NIC list that matches the view")
		}
	}
	if c.nicsReported("n1", []string{"0a:00:00:00:00:01"}); !asked() {
		t.Fatal("no re-read for a NIC list without eni-2")
	}
	if c.nicsReported("n1", []string{"0a:00:00:00:00:01"}); asked() {
		t.Fatal("a second re-read before the spacing")
	}
	// The second re-read comes nicRereadSpacing after the first, the
	// third twice that after the second, and none after that.
	n := 1
	for spacing := nicRereadSpacing; spacing <= 8*nicRereadSpacing; spacing *= 2 {
		clk.Step(spacing - time.Millisecond)
		if c.nicsReported("n1", []string{"0a:00:00:00:00:01"}); asked() {
			t.Fatalf("re-read %d came before its spacing %v", n+1, spacing)
		}
		clk.Step(time.Millisecond)
		if c.nicsReported("n1", []string{"0a:00:00:00:00:01"}); asked() {
			n++
		} else if n < maxNICRereads {
			t.Fatalf("no re-read %d after its spacing %v", n+1, spacing)
		}
	}
	if n != maxNICRereads {
		t.Fatalf("%d re-reads for one differing list, want %d", n, maxNICRereads)
	}
	if c.nicsReported("n1", []string{"0a:00:00:00:00:01", "0a:00:00:00:00:03"}); !asked() {
		t.Fatal("no re-read for a new NIC list")
	}
	if c.nicsReported("unknown", []string{"0a:00:00:00:00:09"}); asked() {
		t.Fatal("a re-read for a Node the view does not know")
	}
}
