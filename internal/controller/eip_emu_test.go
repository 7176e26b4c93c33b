package controller

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/cloud/aws/ec2emu"
)

// eipPool is emuPool with Elastic IPs.
func eipPool(ec *emuCloud, warm int32, sel *v1.ElasticIPs) func(*v1.ExternalIPPool) {
	return func(p *v1.ExternalIPPool) {
		emuPool(ec, warm, 0)(p)
		p.Spec.Cloud.AWS.ElasticIPs = sel
	}
}

// TestElasticIPAssociateMoveRelease (issue 17 item 7): an Egress of a pool
// with Elastic IPs (selected by tag) gets one associated with its egress
// IP in one AssociateAddress call; its status and the emulator's NAT table
// (what an external server sees) show the public address; a failover
// moves the private address and the association with it, with no Elastic
// IP call; deleting the Egress disassociates it in one call.
func TestElasticIPAssociateMoveRelease(t *testing.T) {
	ec := newEmuCloud(t, ec2emu.Config{}, "10.10.0.0/24")
	cl := newEmuCluster(t, "eipm", 2, 10, ec, "m5.large")
	tag := map[string]string{"egressip.io/pool": "eipm"}
	var pubs []netip.Addr
	for range 2 {
		_, pub, err := ec.emu.AddElasticIP(ec2emu.ElasticIP{Tags: tag})
		if err != nil {
			t.Fatal(err)
		}
		pubs = append(pubs, pub)
	}
	if _, _, err := ec.emu.AddElasticIP(ec2emu.ElasticIP{Tags: map[string]string{"egressip.io/pool": "another"}}); err != nil {
		t.Fatal(err)
	}
	cl.pool("eipm", eipPool(ec, 0, &v1.ElasticIPs{Tags: tag}))
	ec.emu.ResetCounts()
	cl.egress("eipm-a", "eipm", "")
	var e *v1.Egress
	cl.eventually("eipm-a Ready with a public IP", func() (bool, string) {
		e = cl.get("eipm-a")
		return ready(e) && e.Status.PublicIP != "", describe(e) + " public=" + e.Status.PublicIP
	})
	private, public := netip.MustParseAddr(e.Status.EgressIP), netip.MustParseAddr(e.Status.PublicIP)
	if public != pubs[0] && public != pubs[1] {
		t.Fatalf("public IP %s is not one of the pool's Elastic IPs %v", public, pubs)
	}
	if nat := ec.emu.NAT(); nat[private] != public || len(nat) != 1 {
		t.Fatalf("NAT %v, want %s -> %s only", nat, private, public)
	}
	if n := ec.emu.Calls("AssociateAddress"); n != 1 {
		t.Fatalf("association: %d AssociateAddress calls, want 1", n)
	}
	cl.eventually("pool ElasticIPs=True", func() (bool, string) {
		c := meta.FindStatusCondition(cl.poolStatus("eipm").Conditions, v1.ConditionElasticIPs)
		return c != nil && c.Status == "True", fmt.Sprintf("%+v", c)
	})
	t.Logf("association: %v", ec.emu.Counts())

	// Failover: the private address moves, the association follows.
	ec.emu.ResetCounts()
	from := e.Status.EgressNode
	cl.crash(from)
	cl.eventually("eipm-a Ready elsewhere", func() (bool, string) {
		e = cl.get("eipm-a")
		return ready(e) && e.Status.EgressNode != from && e.Status.EgressNode != "", describe(e)
	})
	if e.Status.EgressIP != private.String() || e.Status.PublicIP != public.String() || ec.emu.NAT()[private] != public {
		t.Fatalf("after the move: %s public %s, NAT %v", describe(e), e.Status.PublicIP, ec.emu.NAT())
	}
	time.Sleep(2500 * time.Millisecond) // a refresh later, still nothing to do
	if a, d := ec.emu.Calls("AssociateAddress"), ec.emu.Calls("DisassociateAddress"); a != 0 || d != 0 {
		t.Fatalf("move: %d AssociateAddress and %d DisassociateAddress calls, want 0", a, d)
	}
	t.Logf("move: %v", ec.emu.Counts())

	// Release.
	ec.emu.ResetCounts()
	if err := cl.c.Delete(cl.ctx, e); err != nil {
		t.Fatal(err)
	}
	cl.eventually("Elastic IP released", func() (bool, string) {
		return len(ec.emu.NAT()) == 0, fmt.Sprint(ec.emu.NAT())
	})
	if n := ec.emu.Calls("DisassociateAddress"); n != 1 {
		t.Fatalf("release: %d DisassociateAddress calls, want 1", n)
	}
	t.Logf("release: %v", ec.emu.Counts())
}

// TestElasticIPBadInput: allocations that do not exist or that another
// party associated are reported in the pool's ElasticIPs condition and
// never touched; the usable one serves, and an Egress beyond it waits
// without losing anything.
func TestElasticIPBadInput(t *testing.T) {
	ec := newEmuCloud(t, ec2emu.Config{}, "10.11.0.0/24")
	cl := newEmuCluster(t, "eipbad", 1, 10, ec, "m5.large")
	good, goodPub, err := ec.emu.AddElasticIP(ec2emu.ElasticIP{})
	if err != nil {
		t.Fatal(err)
	}
	taken, takenPub, err := ec.emu.AddElasticIP(ec2emu.ElasticIP{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := ec.emu.AddInstance(ec2emu.Instance{Type: "m5.large", SubnetID: ec.subnet})
	if err != nil {
		t.Fatal(err)
	}
	if err := ec.emu.AssociateElsewhere(taken, other.PrimaryInterface, other.PrivateIP); err != nil {
		t.Fatal(err)
	}
	unknown := "eipalloc-0123456789abcdef0"
	cl.pool("eipbad", eipPool(ec, 0, &v1.ElasticIPs{AllocationIDs: []string{good, taken, unknown}}))
	cl.egress("eipbad-a", "eipbad", "")
	cl.eventually("eipbad-a Ready with the usable Elastic IP", func() (bool, string) {
		e := cl.get("eipbad-a")
		return ready(e) && e.Status.PublicIP == goodPub.String(), describe(e) + " public=" + e.Status.PublicIP
	})
	cl.egress("eipbad-b", "eipbad", "")
	cl.waitReady("eipbad-b")
	cl.eventually("pool condition naming the unusable allocations", func() (bool, string) {
		c := meta.FindStatusCondition(cl.poolStatus("eipbad").Conditions, v1.ConditionElasticIPs)
		if c == nil || c.Status != "False" || c.Reason != v1.ReasonElasticIPUnusable {
			return false, fmt.Sprintf("%+v", c)
		}
		for _, s := range []string{unknown + " does not exist", taken, other.PrivateIP.String(), other.PrimaryInterface, "1 assigned Egresses have no Elastic IP"} {
			if !strings.Contains(c.Message, s) {
				return false, fmt.Sprintf("message %q lacks %q", c.Message, s)
			}
		}
		return true, ""
	})
	if e := cl.get("eipbad-b"); e.Status.PublicIP != "" {
		t.Fatalf("eipbad-b got %s", e.Status.PublicIP)
	}
	if nat := ec.emu.NAT(); nat[other.PrivateIP] != takenPub || len(nat) != 2 {
		t.Fatalf("NAT %v: the foreign association must stay, the good one serve eipbad-a", nat)
	}
}
