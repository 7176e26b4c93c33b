package datapath

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/egressip/egressip/internal/testutil/netnstest"
)

// poisonEgressRole makes the kernel refuse the ids element of Egress name
// while it has role r: the element gets a comment longer than the
// kernel's NFT_USERDATA_MAXLEN, a real kernel refusal (ERANGE) of exactly
// that Egress's part of the table.
func poisonEgressRole(r Role, name string) func(*Ruleset) {
	return func(rs *Ruleset) {
		for i := range rs.Sets {
			if rs.Sets[i].Set.Name != setIDs {
				continue
			}
			for j := range rs.Sets[i].Elements {
				if e := &rs.Sets[i].Elements[j]; e.Comment == idComment(r, name) {
					e.Comment = strings.Repeat("x", 300)
				}
			}
		}
	}
}

// kernelMembers reads the member classification back from the kernel
// (through a new process's read-back, as a restarted agent sees it).
func kernelMembers(t *testing.T, cfg Config, d *Datapath) map[netip.Addr]uint32 {
	t.Helper()
	d2, err := New(cfg, d.ns)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = d2.Close() }()
	return d2.members
}

// TestOneEgressFailsOthersKeepApplying makes the kernel refuse one
// Egress's part of the table (fault injection, see poisonEgressRole) while
// the other Egresses keep changing: every Apply must program all the
// others, name only the refused one, keep its Pods' traffic rejected
// (failurePolicy Fail, through its reduced part), and program it once it
// changes and the kernel takes it.
func TestOneEgressFailsOthersKeepApplying(t *testing.T) {
	netnstest.RequireRoot(t)
	ns := kernelNS(t)
	ctx := context.Background()
	cfg, d := newKernelDatapath(t, ns)
	d.rulesetHook = poisonEgressRole(RoleEgress, "bad")
	mark := d.Config().Mark

	badMember := ap("10.244.9.9")
	bad := Egress{Name: "bad", IP: ap("192.0.2.200"), Role: RoleEgress, FailurePolicy: FailurePolicyFail, Local: []netip.Addr{badMember},
		Remote: []Member{{IP: ap("10.244.8.8"), HostIP: ap("192.0.2.12")}}}
	base := sampleState()
	for i := range 12 {
		st := base
		st.Egresses = append([]Egress{bad}, base.Egresses...)
		// The others change every round: members come and go, an Egress
		// moves to this Node and back, new Egresses appear.
		for j := range st.Egresses {
			e := &st.Egresses[j]
			if e.Name == "egr" {
				e.Local = append(e.Local, netip.AddrFrom4([4]byte{10, 244, 5, byte(i + 1)}))
			}
			if e.Name == "src" && i%2 == 1 {
				e.Role = RoleEgress
			}
		}
		for k := range i {
			st.Egresses = append(st.Egresses, Egress{Name: fmt.Sprintf("new-%d", k), IP: netip.AddrFrom4([4]byte{192, 0, 2, byte(210 + k)}), Role: RoleSource,
				Local: []netip.Addr{netip.AddrFrom4([4]byte{10, 244, 6, byte(k + 1)})}})
		}
		err := d.Apply(ctx, st)
		ref, ok := errors.AsType[*RefusedError](err)
		if !ok || !errors.Is(err, ErrEgressRefused) || len(ref.Egresses) != 1 || ref.Egresses["bad"] == nil {
			t.Fatalf("round %d: Apply = %v, want a RefusedError naming only bad", i, err)
		}
		if got := d.Refused(); len(got) != 1 || got["bad"] == nil {
			t.Fatalf("round %d: Refused() = %v", i, got)
		}
		members := kernelMembers(t, cfg, d)
		ids := d.IDs()
		for _, e := range st.Egresses {
			if e.Name == "bad" || effectiveRole(e) == RoleNone {
				continue
			}
			for _, ip := range e.Local {
				if members[ip] != mark(ids[e.Name]) || ids[e.Name] == 0 {
					t.Fatalf("round %d: member %s of Egress %s has mark %#x in the kernel, want %#x", i, ip, e.Name, members[ip], mark(ids[e.Name]))
				}
			}
		}
		// bad keeps the rejection of its local Pod (its failed part is
		// accepted), and nothing of its egress part.
		if d.roles["bad"] != RoleFailed || members[badMember] != mark(ids["bad"]) {
			t.Fatalf("round %d: bad has role %v and member mark %#x, want its fallback (failed, %#x)", i, d.roles["bad"], members[badMember], mark(ids["bad"]))
		}
		if _, ok := members[ap("10.244.8.8")]; ok {
			t.Fatalf("round %d: bad's remote member is programmed", i)
		}
	}

	// A fallback the kernel refuses too is dropped: bad then has nothing.
	d.rulesetHook = func(rs *Ruleset) { poisonEgressRole(RoleEgress, "bad")(rs); poisonEgressRole(RoleFailed, "bad")(rs) }
	bad.Local = append(bad.Local, ap("10.244.9.10"))
	st := base
	st.Egresses = append([]Egress{bad}, base.Egresses...)
	if err := d.Apply(ctx, st); !errors.Is(err, ErrEgressRefused) {
		t.Fatalf("Apply with the fallback refused too = %v", err)
	}
	if _, ok := d.IDs()["bad"]; ok {
		t.Fatalf("bad still has an ID: %v", d.IDs())
	}
	if m := kernelMembers(t, cfg, d); m[ap("10.244.1.3")] == 0 || m[badMember] != 0 {
		t.Fatalf("members after dropping bad: %v", m)
	}

	// The kernel takes bad again: an unchanged bad stays refused, a changed
	// one is tried and programmed.
	d.rulesetHook = nil
	if err := d.Apply(ctx, st); !errors.Is(err, ErrEgressRefused) {
		t.Fatalf("Apply of an unchanged refused Egress = %v, want it still refused", err)
	}
	bad.Local = bad.Local[:1]
	st.Egresses[0] = bad
	if err := d.Apply(ctx, st); err != nil {
		t.Fatalf("Apply of the changed Egress: %v", err)
	}
	if d.roles["bad"] != RoleEgress || len(d.Refused()) != 0 {
		t.Fatalf("bad after the kernel took it: role %v, refused %v", d.roles["bad"], d.Refused())
	}
	if m := kernelMembers(t, cfg, d); m[ap("10.244.8.8")] == 0 {
		t.Fatalf("bad's remote member not programmed: %v", m)
	}
}
