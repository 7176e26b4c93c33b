package bind_test

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/egressip/egressip/internal/agent/bind"
	"github.com/egressip/egressip/internal/testutil/netnstest"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

const (
	crashHelperEnvNS  = "EGRESSIP_BIND_CRASH_HELPER_NS"
	crashHelperEnvIPs = "EGRESSIP_BIND_CRASH_HELPER_IPS"
)

// TestMain doubles as the "agent that crashes" for TestOwnershipSurvivesCrash:
// when started with the helper environment it binds the given IPs in the
// given namespace and kills itself with SIGKILL, leaving no chance to clean
// up.
func TestMain(m *testing.M) {
	if path := os.Getenv(crashHelperEnvNS); path != "" {
		crashHelper(path, os.Getenv(crashHelperEnvIPs))
	}
	if spec := os.Getenv(fallbackHelperEnv); spec != "" {
		fallbackHelper(spec)
	}
	os.Exit(m.Run())
}

func crashHelper(path, ips string) {
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "crash helper:", err)
		os.Exit(2)
	}
	ns, err := netns.GetFromPath(path)
	if err != nil {
		fail(err)
	}
	b, err := bind.New(ns, bind.Config{})
	if err != nil {
		fail(err)
	}
	for s := range strings.SplitSeq(ips, ",") {
		if _, err := b.Bind(netip.MustParseAddr(s)); err != nil {
			fail(err)
		}
	}
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}

// nodeWithSubnets is a node/peer pair where the node has its own addresses
// 192.0.2.2/24 and 2001:db8::2/64 on the veth.
func nodeWithSubnets(t *testing.T) *netnstest.Pair {
	t.Helper()
	p := netnstest.NewPair(t)
	p.Node.MustIP(t, "addr", "add", "192.0.2.2/24", "dev", p.NodeIf)
	p.Node.MustIP(t, "addr", "add", "2001:db8::2/64", "dev", p.NodeIf)
	return p
}

func TestBindAddsHostAddressesWithFlagsAndMark(t *testing.T) {
	p := nodeWithSubnets(t)
	key := "net/ipv4/conf/" + p.NodeIf + "/promote_secondaries"
	p.Node.Sysctl(t, key, "0")
	nodeIf := p.Node.Interface(t, p.NodeIf)
	b := newBinder(t, p.Node, bind.Config{})

	v4, v6 := netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("2001:db8::10")
	for _, ip := range []netip.Addr{v4, v6} {
		changed, err := b.Bind(ip)
		if err != nil || !changed {
			t.Fatalf("Bind(%s) = %v, %v; want true, nil", ip, changed, err)
		}
	}

	a4 := mustAddr(t, p.Node, v4)
	if a4.PrefixLen != 32 || !a4.has(unix.IFA_F_NOPREFIXROUTE) || a4.Proto != bind.DefaultProto || a4.LinkIndex != nodeIf.Index {
		t.Errorf("IPv4 address = %+v; want /32 noprefixroute proto %d on %d", a4, bind.DefaultProto, nodeIf.Index)
	}
	a6 := mustAddr(t, p.Node, v6)
	if a6.PrefixLen != 128 || !a6.has(unix.IFA_F_NOPREFIXROUTE) || !a6.has(unix.IFA_F_NODAD) ||
		a6.has(unix.IFA_F_TENTATIVE) || a6.Proto != bind.DefaultProto || a6.LinkIndex != nodeIf.Index {
		t.Errorf("IPv6 address = %+v; want /128 noprefixroute nodad, not tentative, proto %d on %d", a6, bind.DefaultProto, nodeIf.Index)
	}
	// The IPv6 egress IP is deprecated, so the Node's own address stays
	// the source toward its subnet.
	if !a6.has(unix.IFA_F_DEPRECATED) {
		t.Errorf("IPv6 address = %+v; want deprecated (preferred lifetime 0)", a6)
	}
	if out := p.Node.MustIP(t, "-6", "route", "get", "2001:db8::60"); !strings.Contains(out, "src 2001:db8::2 ") {
		t.Errorf("source toward the subnet is not the Node's address: %s", out)
	}
	// The Node's own addresses carry no mark.
	if own := mustAddr(t, p.Node, netip.MustParseAddr("192.0.2.2")); own.Proto == bind.DefaultProto {
		t.Errorf("node address got our mark: %+v", own)
	}
	if got := p.Node.ReadSysctl(t, key); got != "1" {
		t.Errorf("promote_secondaries = %q after Bind; want 1", got)
	}
	// noprefixroute: no main-table route for the host addresses.
	for _, r := range routeSnapshot(t, p.Node) {
		if strings.Contains(r, "192.0.2.10/32") || strings.Contains(r, "2001:db8::10/128") {
			t.Errorf("unexpected prefix route for an egress IP: %s", r)
		}
	}

	// Idempotent.
	for _, ip := range []netip.Addr{v4, v6} {
		if changed, err := b.Bind(ip); err != nil || changed {
			t.Errorf("second Bind(%s) = %v, %v; want false, nil", ip, changed, err)
		}
	}
	owned, err := b.Owned()
	if err != nil {
		t.Fatal(err)
	}
	want := []bind.Bound{{Addr: v4, Interface: p.NodeIf, LinkIndex: nodeIf.Index}, {Addr: v6, Interface: p.NodeIf, LinkIndex: nodeIf.Index}}
	if !slices.Equal(owned, want) {
		t.Errorf("Owned() = %v; want %v", owned, want)
	}
}

func TestUnbindLeavesNeighbours(t *testing.T) {
	p := nodeWithSubnets(t)
	b := newBinder(t, p.Node, bind.Config{})
	for _, family := range [][]netip.Addr{
		addrs("192.0.2.10", "192.0.2.11", "192.0.2.12"),
		addrs("2001:db8::10", "2001:db8::11", "2001:db8::12"),
	} {
		for _, ip := range family {
			mustBind(t, b, ip)
		}
		if err := b.Unbind(family[1]); err != nil {
			t.Fatalf("Unbind(%s): %v", family[1], err)
		}
		mustAbsent(t, p.Node, family[1])
		mustAddr(t, p.Node, family[0])
		mustAddr(t, p.Node, family[2])
		// Unbinding again is a no-op.
		if err := b.Unbind(family[1]); err != nil {
			t.Errorf("second Unbind(%s): %v", family[1], err)
		}
	}
	mustAddr(t, p.Node, netip.MustParseAddr("192.0.2.2"))
	mustAddr(t, p.Node, netip.MustParseAddr("2001:db8::2"))
}

func TestUnbindRefusesForeignAddress(t *testing.T) {
	p := nodeWithSubnets(t)
	b := newBinder(t, p.Node, bind.Config{})
	p.Node.MustIP(t, "addr", "add", "192.0.2.20/32", "dev", p.NodeIf)
	for _, s := range []string{"192.0.2.20", "192.0.2.2", "2001:db8::2"} {
		ip := netip.MustParseAddr(s)
		if err := b.Unbind(ip); !errors.Is(err, bind.ErrNotOwned) {
			t.Errorf("Unbind(%s) = %v; want ErrNotOwned", ip, err)
		}
		mustAddr(t, p.Node, ip)
	}
}

func TestBindRefusesForeignAddress(t *testing.T) {
	p := nodeWithSubnets(t)
	b := newBinder(t, p.Node, bind.Config{})
	p.Node.MustIP(t, "addr", "add", "192.0.2.20/32", "dev", p.NodeIf)
	for _, s := range []string{"192.0.2.20", "192.0.2.2", "2001:db8::2"} {
		ip := netip.MustParseAddr(s)
		before := mustAddr(t, p.Node, ip)
		changed, err := b.Bind(ip)
		if !errors.Is(err, bind.ErrForeignAddress) || changed {
			t.Errorf("Bind(%s) = %v, %v; want false, ErrForeignAddress", ip, changed, err)
		}
		if after := mustAddr(t, p.Node, ip); after != before {
			t.Errorf("foreign %s changed: %+v -> %+v", ip, before, after)
		}
	}
	owned, err := b.Owned()
	if err != nil || len(owned) != 0 {
		t.Errorf("Owned() = %v, %v; want none", owned, err)
	}
}

func TestBindRejectsUnusableIPs(t *testing.T) {
	p := nodeWithSubnets(t)
	b := newBinder(t, p.Node, bind.Config{})
	for _, ip := range []netip.Addr{{}, netip.MustParseAddr("0.0.0.0"), netip.MustParseAddr("127.0.0.5"),
		netip.MustParseAddr("fe80::1"), netip.MustParseAddr("ff02::1"), netip.MustParseAddr("224.0.0.1")} {
		if _, err := b.Bind(ip); !errors.Is(err, bind.ErrInvalidIP) {
			t.Errorf("Bind(%v) = %v; want ErrInvalidIP", ip, err)
		}
	}
	// An IPv4-mapped IPv6 address is bound as the IPv4 address it maps.
	mustBind(t, b, netip.MustParseAddr("::ffff:192.0.2.30"))
	if a := mustAddr(t, p.Node, netip.MustParseAddr("192.0.2.30")); a.PrefixLen != 32 {
		t.Errorf("mapped address bound as %+v; want 192.0.2.30/32", a)
	}
}

func TestSyncTouchesOnlyOwnedAddresses(t *testing.T) {
	p := nodeWithSubnets(t)
	p.Node.MustIP(t, "route", "add", "default", "via", "192.0.2.1", "dev", p.NodeIf)
	p.Node.MustIP(t, "-6", "route", "add", "default", "via", "2001:db8::1", "dev", p.NodeIf)
	b := newBinder(t, p.Node, bind.Config{})

	stale, keep := addrs("192.0.2.10", "2001:db8::10"), addrs("192.0.2.11", "2001:db8::11")
	for _, ip := range append(slices.Clone(stale), keep...) {
		mustBind(t, b, ip)
	}
	// Foreign addresses inside the pool range, one of them a host address
	// with the same flags we use: only the mark tells them apart.
	p.Node.MustIP(t, "addr", "add", "192.0.2.12/32", "dev", p.NodeIf)
	p.Node.MustIP(t, "addr", "add", "2001:db8::12/128", "dev", p.NodeIf, "nodad", "noprefixroute")
	foreign := addrs("192.0.2.12", "2001:db8::12", "192.0.2.2", "2001:db8::2")
	foreignBefore := map[netip.Addr]any{}
	for _, ip := range foreign {
		foreignBefore[ip] = mustAddr(t, p.Node, ip)
	}
	routesBefore := routeSnapshot(t, p.Node)

	fresh := addrs("192.0.2.13", "2001:db8::13")
	desired := append(slices.Clone(keep), fresh...)
	added, removed, err := b.Sync(desired)
	if err != nil {
		t.Fatalf("Sync: %v", err)
	}
	sortAddrs := func(s []netip.Addr) []netip.Addr {
		s = slices.Clone(s)
		slices.SortFunc(s, netip.Addr.Compare)
		return s
	}
	if !slices.Equal(added, sortAddrs(fresh)) {
		t.Errorf("added = %v; want %v", added, sortAddrs(fresh))
	}
	if !slices.Equal(removed, sortAddrs(stale)) {
		t.Errorf("removed = %v; want %v", removed, sortAddrs(stale))
	}
	for _, ip := range stale {
		mustAbsent(t, p.Node, ip)
	}
	for _, ip := range desired {
		if a := mustAddr(t, p.Node, ip); a.Proto != bind.DefaultProto {
			t.Errorf("desired %s lost its mark: %+v", ip, a)
		}
	}
	for _, ip := range foreign {
		if got := mustAddr(t, p.Node, ip); got != foreignBefore[ip] {
			t.Errorf("foreign %s changed: %+v -> %+v", ip, foreignBefore[ip], got)
		}
	}
	routesAfter := routeSnapshot(t, p.Node)
	if !slices.Equal(routesBefore, routesAfter) {
		t.Errorf("main table changed:\nbefore %q\nafter  %q", routesBefore, routesAfter)
	}
	if !slices.ContainsFunc(routesAfter, func(r string) bool { return strings.Contains(r, "Gw: 192.0.2.1") }) {
		t.Errorf("IPv4 default route missing after Sync: %q", routesAfter)
	}

	// A second Sync with the same input changes nothing.
	added, removed, err = b.Sync(desired)
	if err != nil || len(added) != 0 || len(removed) != 0 {
		t.Errorf("second Sync = %v, %v, %v; want nothing", added, removed, err)
	}
	// Sync(nil) releases everything we own and nothing else.
	if _, removed, err = b.Sync(nil); err != nil || len(removed) != len(desired) {
		t.Errorf("Sync(nil) removed %v, %v; want %d addresses", removed, err, len(desired))
	}
	for _, ip := range foreign {
		mustAddr(t, p.Node, ip)
	}
}

func TestOwnershipSurvivesCrash(t *testing.T) {
	p := nodeWithSubnets(t)
	ips := addrs("192.0.2.10", "2001:db8::10")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashHelperEnvNS+"="+p.Node.Path, crashHelperEnvIPs+"=192.0.2.10,2001:db8::10")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("crash helper: want death by SIGKILL, got %v: %s", err, out)
	}
	p.Node.MustIP(t, "addr", "add", "192.0.2.12/32", "dev", p.NodeIf)

	// A new Binder (fresh process state, other process) sees what the dead
	// one bound, and nothing else.
	b := newBinder(t, p.Node, bind.Config{})
	owned, err := b.Owned()
	if err != nil {
		t.Fatal(err)
	}
	var got []netip.Addr
	for _, o := range owned {
		if o.Interface != p.NodeIf {
			t.Errorf("owned %v on %q; want %s", o.Addr, o.Interface, p.NodeIf)
		}
		got = append(got, o.Addr)
	}
	if !slices.Equal(got, ips) {
		t.Fatalf("Owned() after crash = %v; want %v", got, ips)
	}
	// ... and can clean them up.
	if _, removed, err := b.Sync(nil); err != nil || !slices.Equal(removed, ips) {
		t.Fatalf("Sync(nil) = %v, %v; want %v removed", removed, err, ips)
	}
	mustAbsent(t, p.Node, ips[0])
	mustAbsent(t, p.Node, ips[1])
	mustAddr(t, p.Node, netip.MustParseAddr("192.0.2.12"))
}

func TestBindMovesOwnedAddressWhenInterfaceChanges(t *testing.T) {
	p := nodeWithSubnets(t)
	p.Node.MustIP(t, "link", "add", "br0", "type", "bridge")
	p.Node.MustIP(t, "link", "set", "br0", "up")
	ip := netip.MustParseAddr("192.0.2.10")
	mustBind(t, newBinder(t, p.Node, bind.Config{}), ip)

	b := newBinder(t, p.Node, bind.Config{Interface: "br0"})
	changed, err := b.Bind(ip)
	if err != nil || !changed {
		t.Fatalf("Bind on br0 = %v, %v; want true, nil", changed, err)
	}
	owned, err := b.Owned()
	if err != nil || len(owned) != 1 || owned[0].Interface != "br0" {
		t.Fatalf("Owned() = %v, %v; want only %s on br0", owned, err, ip)
	}
}

func TestCustomProto(t *testing.T) {
	p := nodeWithSubnets(t)
	if _, err := bind.New(p.Node.Handle, bind.Config{Proto: 2}); err == nil {
		t.Error("bind.New accepted kernel protocol 2")
	}
	b := newBinder(t, p.Node, bind.Config{Proto: 200})
	other := newBinder(t, p.Node, bind.Config{})
	ip := netip.MustParseAddr("192.0.2.10")
	mustBind(t, b, ip)
	if a := mustAddr(t, p.Node, ip); a.Proto != 200 {
		t.Errorf("proto = %d; want 200", a.Proto)
	}
	// A Binder with another mark treats it as foreign.
	if err := other.Unbind(ip); !errors.Is(err, bind.ErrNotOwned) {
		t.Errorf("Unbind with the default mark = %v; want ErrNotOwned", err)
	}
}
