package aws

import (
	"context"
	"net/netip"
	"testing"

	"github.com/egressip/egressip/internal/cloud/aws/ec2emu"
)

// TestElasticIPProvider: allocations by ID and by tag, association (one
// call), a move of the private address that carries it (no call), and
// disassociation (one call), with the emulator's NAT table as the
// external view.
func TestElasticIPProvider(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, ec2emu.Config{}, Options{})
	n1, n2 := e.instance(t, "m5.large"), e.instance(t, "m5.large")
	a1, pub1, err := e.emu.AddElasticIP(ec2emu.ElasticIP{})
	if err != nil {
		t.Fatal(err)
	}
	a2, _, err := e.emu.AddElasticIP(ec2emu.ElasticIP{Tags: map[string]string{"egressip.io/pool": "p"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.emu.AddElasticIP(ec2emu.ElasticIP{Tags: map[string]string{"egressip.io/pool": "other"}}); err != nil {
		t.Fatal(err)
	}
	got, err := e.p.ElasticIPs(ctx, []string{a1, "eipalloc-0123456789abcdef0"}, map[string]string{"egressip.io/pool": "p"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].AllocationID > got[1].AllocationID || (got[0].AllocationID != a1 && got[1].AllocationID != a1) {
		t.Fatalf("allocations %+v, want %s and %s (the unknown ID absent)", got, a1, a2)
	}
	ip := netip.MustParseAddr("10.0.3.9")
	if err := e.p.Assign(ctx, n1.PrimaryInterface, []netip.Addr{ip}); err != nil {
		t.Fatal(err)
	}
	e.emu.ResetCounts()
	if _, err := e.p.Associate(ctx, a1, n1.PrimaryInterface, ip); err != nil {
		t.Fatal(err)
	}
	if n := e.emu.Calls(""); n != 1 {
		t.Errorf("association: %d calls, want 1", n)
	}
	if nat := e.emu.NAT(); nat[ip] != pub1 {
		t.Fatalf("NAT %v, want %s -> %s", nat, ip, pub1)
	}
	// The private address moves: the association follows, no EIP call.
	e.emu.ResetCounts()
	if err := e.p.Assign(ctx, n2.PrimaryInterface, []netip.Addr{ip}); err != nil {
		t.Fatal(err)
	}
	if n := e.emu.Calls("AssociateAddress"); n != 0 {
		t.Errorf("move: %d AssociateAddress calls, want 0", n)
	}
	got, _ = e.p.ElasticIPs(ctx, []string{a1}, nil)
	if len(got) != 1 || got[0].InterfaceID != n2.PrimaryInterface || got[0].PrivateIP != ip || e.emu.NAT()[ip] != pub1 {
		t.Fatalf("after the move: %+v, NAT %v", got, e.emu.NAT())
	}
	e.emu.ResetCounts()
	if err := e.p.Disassociate(ctx, got[0].AssociationID); err != nil {
		t.Fatal(err)
	}
	if n := e.emu.Calls(""); n != 1 || len(e.emu.NAT()) != 0 {
		t.Fatalf("release: %d calls, NAT %v", n, e.emu.NAT())
	}
}
