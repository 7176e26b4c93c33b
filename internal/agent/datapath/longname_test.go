package datapath

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/egressip/egressip/internal/testutil/netnstest"
)

// longName returns a valid Kubernetes object name (DNS-1123 subdomain) of n
// bytes, n <= 253, distinct per seed letter.
func longName(seed byte, n int) string {
	var b strings.Builder
	b.WriteByte(seed)
	for b.Len() < n {
		if b.Len()%64 == 63 && b.Len() < n-1 {
			b.WriteByte('.')
			continue
		}
		b.WriteByte('a' + byte(b.Len()%26))
	}
	return b.String()
}

// TestLongNameAppliesAndKeepsOthers is the reproduction of issue 15 fault 1:
// an Egress with a 245..253-byte name made the whole table's transaction
// fail (ERANGE: its ids element's comment exceeded the kernel's 256-byte
// NFT_USERDATA_MAXLEN), so no Egress on the Node was programmed any more.
// Every role, with the longest names the API allows, must apply, survive a
// restart of the process with the same IDs, and leave the others working.
func TestLongNameAppliesAndKeepsOthers(t *testing.T) {
	netnstest.RequireRoot(t)
	ns := kernelNS(t)
	ctx := context.Background()
	cfg, d := newKernelDatapath(t, ns)

	st := sampleState()
	for i, n := range []int{245, 247, 250, 253} {
		seed := byte('a' + i)
		name := longName(seed, n)
		if len(name) != n {
			t.Fatalf("longName(%d) has %d bytes", n, len(name))
		}
		role := []Role{RoleEgress, RoleSource, RoleFailed, RoleEgress}[i]
		e := Egress{Name: name, Role: role, FailurePolicy: FailurePolicyFail,
			Local: []netip.Addr{netip.AddrFrom4([4]byte{10, 244, 3, byte(10 + i)})}}
		if role != RoleFailed {
			e.IP = netip.AddrFrom4([4]byte{192, 0, 2, byte(150 + i)})
		}
		st.Egresses = append(st.Egresses, e)
	}
	if err := d.Apply(ctx, st); err != nil {
		t.Fatalf("Apply with names of 245..253 bytes: %v", err)
	}
	members := d.applied.Members
	for i := range 4 {
		ip := netip.AddrFrom4([4]byte{10, 244, 3, byte(10 + i)})
		if members[ip] == 0 {
			t.Errorf("member %s of a long-named Egress not classified: %v", ip, members)
		}
	}
	if members[ap("10.244.1.3")] == 0 {
		t.Errorf("member of Egress egr not classified after the long names: %v", members)
	}
	dump1, err := d.Dump(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids1 := d.IDs()
	_ = d.Close()

	// A restarted process reads the IDs back (long names are kept under
	// a digest in the ids set) and reproduces the same table.
	d2, err := New(cfg, ns.Handle)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d2.Close() })
	if err := d2.Apply(ctx, st); err != nil {
		t.Fatalf("Apply after restart: %v", err)
	}
	for n, id := range ids1 {
		if got := d2.IDs()[n]; got != id {
			t.Errorf("ID of %.20s... after restart = %d, want %d", n, got, id)
		}
	}
	if dump2, _ := d2.Dump(ctx); dump2 != dump1 {
		t.Errorf("ruleset after restart differs:\n--- before\n%s\n--- after\n%s", dump1, dump2)
	}
	// A later change on the Node still applies.
	st.Egresses = st.Egresses[1:]
	if err := d2.Apply(ctx, st); err != nil {
		t.Fatalf("Apply of a later change: %v", err)
	}
}
