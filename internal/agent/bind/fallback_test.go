package bind_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/egressip/egressip/internal/agent/bind"
	"github.com/egressip/egressip/internal/testutil/netnstest"
	"github.com/egressip/egressip/internal/testutil/poll"
)

// The forced fallback: bind.OwnershipRecord makes the Binder work as on a
// kernel without IFA_PROTO (the attribute is neither written nor read), so
// these tests run the fallback for real on a kernel that has it.

const fallbackHelperEnv = "EGRESSIP_BIND_FALLBACK_HELPER"

// fallbackJob is what the crashing child does: bind IPs (and unbind them
// again when Unbind is set) in namespace NS with the record at Record, and
// kill itself with SIGKILL at hook point Point for IP Crash.
type fallbackJob struct {
	NS, Record, Point string
	IPs               []string
	Crash             string
	Unbind            bool
}

// fallbackHelper runs in the child process (see TestMain).
func fallbackHelper(spec string) {
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "fallback helper:", err)
		os.Exit(2)
	}
	var job fallbackJob
	if err := json.Unmarshal([]byte(spec), &job); err != nil {
		fail(err)
	}
	ns, err := netns.GetFromPath(job.NS)
	if err != nil {
		fail(err)
	}
	b, err := bind.New(ns, bind.Config{Ownership: bind.OwnershipRecord, RecordPath: job.Record})
	if err != nil {
		fail(err)
	}
	crash := netip.MustParseAddr(job.Crash)
	armed := !job.Unbind // with Unbind, crash only while unbinding
	bind.SetTestHook(func(point string, ip netip.Addr) {
		if armed && point == job.Point && (ip == crash || point == bind.HookRecordRename) {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	})
	for _, s := range job.IPs {
		if _, err := b.Bind(netip.MustParseAddr(s)); err != nil {
			fail(err)
		}
	}
	armed = true
	if job.Unbind {
		if err := b.Unbind(crash); err != nil {
			fail(err)
		}
	}
	fail(errors.New("the crash point was never reached"))
}

// runCrashChild runs job in a child process and requires it to die by SIGKILL.
func runCrashChild(t *testing.T, job fallbackJob) {
	t.Helper()
	spec, err := json.Marshal(job)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fallbackHelperEnv+"="+string(spec))
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("crash child (%s): want death by SIGKILL, got %v: %s", job.Point, err, out)
	}
}

// recordPath returns a record path in a fresh directory.
func recordPath(t *testing.T) string {
	t.Helper()
	return filepath.Join(t.TempDir(), "ownership.json")
}

func recordBinder(t *testing.T, ns *netnstest.NS, path string) *bind.Binder {
	t.Helper()
	return newBinder(t, ns, bind.Config{Ownership: bind.OwnershipRecord, RecordPath: path})
}

// recordedIPs reads the record file as the test sees it (nil when missing).
func recordedIPs(t *testing.T, path string) []netip.Addr {
	t.Helper()
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Addresses []struct {
			IP netip.Addr `json:"ip"`
		} `json:"addresses"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatalf("record %s: %v\n%s", path, err, raw)
	}
	var out []netip.Addr
	for _, a := range f.Addresses {
		out = append(out, a.IP)
	}
	return out
}

func ownedIPs(t *testing.T, b *bind.Binder) []netip.Addr {
	t.Helper()
	owned, err := b.Owned()
	if err != nil {
		t.Fatalf("Owned: %v", err)
	}
	var out []netip.Addr
	for _, o := range owned {
		out = append(out, o.Addr)
	}
	return out
}

// fullDump is every address (all fields the test decodes) and every route
// of every table and family, plus `ip addr` and `ip route` for humans.
type fullDump struct {
	Addrs  []seenAddr
	Routes []string
	Text   string
}

func dumpAll(t *testing.T, ns *netnstest.NS) fullDump {
	t.Helper()
	// The kernel installs an IPv6 address's local route from its DAD work
	// item, even with nodad, so a dump right after an add may miss it:
	// dump until every IPv6 address has its local route.
	var d fullDump
	// Every 10 ms; 4 s covers the 200 tries of the hand-written loop this
	// replaces, dumps included.
	if err := poll.Wait(context.Background(), 10*time.Millisecond, 4*time.Second, poll.Cond(func() bool {
		d = dumpOnce(t, ns)
		return d.settled()
	})); err != nil {
		t.Fatalf("the local routes of the IPv6 addresses in %s never appeared: %v", ns.Name, err)
	}
	return d
}

func (d fullDump) settled() bool {
	for _, a := range d.Addrs {
		if !a.IP.Is6() || a.IP.IsLinkLocalUnicast() || a.IP.IsLoopback() || a.has(unix.IFA_F_TENTATIVE) {
			continue
		}
		if !slices.ContainsFunc(d.Routes, func(r string) bool {
			return strings.HasPrefix(r, "table 255 ") && strings.Contains(r, fmt.Sprintf(" Dst: %s/128 ", a.IP))
		}) {
			return false
		}
	}
	return true
}

func dumpOnce(t *testing.T, ns *netnstest.NS) fullDump {
	t.Helper()
	d := fullDump{Addrs: dumpAddrs(t, ns)}
	slices.SortFunc(d.Addrs, func(x, y seenAddr) int {
		if c := x.IP.Compare(y.IP); c != 0 {
			return c
		}
		return x.LinkIndex - y.LinkIndex
	})
	routes, err := ns.Netlink(t).RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		t.Fatalf("list routes: %v", err)
	}
	for _, r := range routes {
		d.Routes = append(d.Routes, fmt.Sprintf("table %d %s", r.Table, r))
	}
	slices.Sort(d.Routes)
	d.Text = ns.MustIP(t, "addr", "show") + ns.MustIP(t, "route", "show", "table", "all") + ns.MustIP(t, "-6", "route", "show", "table", "all")
	return d
}

// withoutLocalOf drops the kernel's local-table host routes of ips (the
// kernel adds one for every address) from routes, as rendered by dumpAll.
func withoutLocalOf(routes []string, ips []netip.Addr) []string {
	return slices.DeleteFunc(slices.Clone(routes), func(r string) bool {
		for _, ip := range ips {
			if strings.HasPrefix(r, "table 255 ") && strings.Contains(r, fmt.Sprintf(" Dst: %s/%d ", ip, ip.BitLen())) {
				return true
			}
		}
		return false
	})
}

func TestFallbackBindUnbindAdopt(t *testing.T) {
	p := nodeWithSubnets(t)
	path := recordPath(t)
	b := recordBinder(t, p.Node, path)
	nodeIf := p.Node.Interface(t, p.NodeIf)

	v4, v6 := netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("2001:db8::10")
	for _, ip := range []netip.Addr{v4, v6} {
		if changed, err := b.Bind(ip); err != nil || !changed {
			t.Fatalf("Bind(%s) = %v, %v; want true, nil", ip, changed, err)
		}
	}
	// Same address shape as with the mark, but no IFA_PROTO at all.
	a4, a6 := mustAddr(t, p.Node, v4), mustAddr(t, p.Node, v6)
	if a4.PrefixLen != 32 || !a4.has(unix.IFA_F_NOPREFIXROUTE) || a4.Proto != 0 || a4.LinkIndex != nodeIf.Index {
		t.Errorf("IPv4 address = %+v; want /32 noprefixroute without proto on %d", a4, nodeIf.Index)
	}
	if a6.PrefixLen != 128 || !a6.has(unix.IFA_F_NODAD) || !a6.has(unix.IFA_F_DEPRECATED) || a6.Proto != 0 {
		t.Errorf("IPv6 address = %+v; want /128 nodad deprecated without proto", a6)
	}
	if got := recordedIPs(t, path); !slices.Equal(got, []netip.Addr{v4, v6}) {
		t.Errorf("record lists %v; want %v", got, []netip.Addr{v4, v6})
	}
	if st := b.Status(); st.Mode != bind.OwnershipRecord || st.Err != nil || st.RecordPath != path {
		t.Errorf("Status() = %+v; want record mode, healthy", st)
	}

	// Adoption: a second Binder (a restarted or surge agent sharing the
	// record) owns them, and re-binding changes nothing.
	b2 := recordBinder(t, p.Node, path)
	if got := ownedIPs(t, b2); !slices.Equal(got, []netip.Addr{v4, v6}) {
		t.Fatalf("adopting Binder owns %v; want %v", got, []netip.Addr{v4, v6})
	}
	if added, removed, err := b2.Sync([]netip.Addr{v4, v6}); err != nil || len(added)+len(removed) != 0 {
		t.Errorf("adopting Sync = %v, %v, %v; want no change", added, removed, err)
	}

	// Unbind through the second one; the first sees it gone.
	if err := b2.Unbind(v4); err != nil {
		t.Fatalf("Unbind(%s): %v", v4, err)
	}
	mustAbsent(t, p.Node, v4)
	if got := ownedIPs(t, b); !slices.Equal(got, []netip.Addr{v6}) {
		t.Errorf("first Binder owns %v after the other unbound %s; want [%s]", got, v4, v6)
	}
	if got := recordedIPs(t, path); !slices.Equal(got, []netip.Addr{v6}) {
		t.Errorf("record lists %v; want [%s]", got, v6)
	}

	// Foreign addresses: one added by hand, one carrying egressip's
	// IFA_PROTO mark (the record mode does not read the attribute, so the
	// mark alone makes nothing its own).
	p.Node.MustIP(t, "addr", "add", "192.0.2.20/32", "dev", p.NodeIf, "noprefixroute")
	marked := netip.MustParseAddr("192.0.2.21")
	mustBind(t, newBinder(t, p.Node, bind.Config{Ownership: bind.OwnershipProto}), marked)
	if a := mustAddr(t, p.Node, marked); a.Proto != bind.DefaultProto {
		t.Fatalf("mark-only Binder left %+v; want proto %d", a, bind.DefaultProto)
	}
	for _, ip := range []netip.Addr{netip.MustParseAddr("192.0.2.20"), marked, netip.MustParseAddr("192.0.2.2")} {
		before := mustAddr(t, p.Node, ip)
		if _, err := b.Bind(ip); !errors.Is(err, bind.ErrForeignAddress) {
			t.Errorf("Bind(foreign %s) = %v; want ErrForeignAddress", ip, err)
		}
		if err := b.Unbind(ip); !errors.Is(err, bind.ErrNotOwned) {
			t.Errorf("Unbind(foreign %s) = %v; want ErrNotOwned", ip, err)
		}
		if after := mustAddr(t, p.Node, ip); after != before {
			t.Errorf("foreign %s changed: %+v -> %+v", ip, before, after)
		}
	}
	if _, removed, err := b.Sync(nil); err != nil || !slices.Equal(removed, []netip.Addr{v6}) {
		t.Errorf("Sync(nil) removed %v, %v; want [%s]", removed, err, v6)
	}
	mustAddr(t, p.Node, marked)
	if got := recordedIPs(t, path); len(got) != 0 {
		t.Errorf("record lists %v after Sync(nil); want nothing", got)
	}
}

// TestFallbackCrashAtEachPoint kills a child agent at each point of a bind
// or unbind and checks, with a new Binder, that nothing of ours is left
// orphaned and no foreign address is touched.
func TestFallbackCrashAtEachPoint(t *testing.T) {
	for _, tc := range []struct {
		point  string
		unbind bool
		// bound: the address is on the Node after the crash (and owned).
		bound bool
		// recorded: the record lists it after the crash.
		recorded bool
	}{
		{point: bind.HookBeforeRecord},
		{point: bind.HookRecordRename}, // the temporary file synced, not yet renamed
		{point: bind.HookRecorded, recorded: true},
		{point: bind.HookBound, bound: true, recorded: true},
		{point: bind.HookUnbound, unbind: true, recorded: true},
	} {
		t.Run(tc.point, func(t *testing.T) {
			p := nodeWithSubnets(t)
			path := recordPath(t)
			// A foreign address inside the pool range, bound before the
			// crash, shaped like ours.
			p.Node.MustIP(t, "addr", "add", "192.0.2.20/32", "dev", p.NodeIf, "noprefixroute")
			for _, ip := range addrs("192.0.2.10", "2001:db8::10") {
				runCrashChild(t, fallbackJob{NS: p.Node.Path, Record: path, Point: tc.point,
					IPs: []string{ip.String()}, Crash: ip.String(), Unbind: tc.unbind})
				present := false
				if _, ok := findAddr(dumpAddrs(t, p.Node), ip); ok {
					present = true
				}
				if present != tc.bound {
					t.Fatalf("%s on the Node after a crash at %s: %v; want %v", ip, tc.point, present, tc.bound)
				}
				if got := slices.Contains(recordedIPs(t, path), ip); got != tc.recorded {
					t.Fatalf("%s in the record after a crash at %s: %v; want %v", ip, tc.point, got, tc.recorded)
				}
				// After the crash someone else adds the same IP with
				// another prefix: it is not ours and must stay.
				if !tc.bound {
					plen := "28"
					if ip.Is6() {
						plen = "120"
					}
					args := []string{"addr", "add", ip.String() + "/" + plen, "dev", p.NodeIf, "noprefixroute"}
					if ip.Is6() {
						args = append(args, "nodad") // no DAD state change during the test
					}
					p.Node.MustIP(t, args...)
				}
			}
			before := dumpAll(t, p.Node)

			b := recordBinder(t, p.Node, path)
			var want []netip.Addr
			if tc.bound {
				want = addrs("192.0.2.10", "2001:db8::10")
			}
			if got := ownedIPs(t, b); !slices.Equal(got, want) {
				t.Fatalf("Owned() after a crash at %s = %v; want %v", tc.point, got, want)
			}
			_, removed, err := b.Sync(nil)
			if err != nil || !slices.Equal(removed, want) {
				t.Fatalf("Sync(nil) = %v, %v; want %v removed", removed, err, want)
			}
			after := dumpAll(t, p.Node)
			// Nothing changed but the removal of our own addresses.
			wantAddrs := slices.DeleteFunc(slices.Clone(before.Addrs), func(a seenAddr) bool {
				return slices.Contains(want, a.IP) && (a.PrefixLen == 32 || a.PrefixLen == 128)
			})
			if !slices.Equal(after.Addrs, wantAddrs) {
				t.Errorf("addresses after Sync(nil):\n%s\nwant only %v gone from:\n%s", after.Text, want, before.Text)
			}
			// Only the kernel's local routes of our removed addresses go.
			if got, want := after.Routes, withoutLocalOf(before.Routes, want); !slices.Equal(got, want) {
				t.Errorf("routes changed:\nwant  %q\nafter %q", want, got)
			}
			if got := recordedIPs(t, path); len(got) != 0 {
				t.Errorf("record lists %v after clean-up; want nothing", got)
			}
		})
	}
}

func TestFallbackStaleAndForeignSideBySide(t *testing.T) {
	p := nodeWithSubnets(t)
	p.Node.MustIP(t, "route", "add", "default", "via", "192.0.2.1", "dev", p.NodeIf)
	p.Node.MustIP(t, "-6", "route", "add", "default", "via", "2001:db8::1", "dev", p.NodeIf)
	p.Node.MustIP(t, "route", "add", "198.51.100.0/24", "via", "192.0.2.1", "table", "100")
	path := recordPath(t)
	b := recordBinder(t, p.Node, path)

	stale, keep := addrs("192.0.2.10", "2001:db8::10"), addrs("192.0.2.11", "2001:db8::11")
	for _, ip := range append(slices.Clone(stale), keep...) {
		mustBind(t, b, ip)
	}
	// Foreign, inside the pool range and shaped exactly like ours, one of
	// them carrying egressip's IFA_PROTO mark (not read in record mode).
	p.Node.MustIP(t, "addr", "add", "192.0.2.12/32", "dev", p.NodeIf, "noprefixroute")
	p.Node.MustIP(t, "addr", "add", "2001:db8::12/128", "dev", p.NodeIf, "nodad", "noprefixroute")
	mustBind(t, newBinder(t, p.Node, bind.Config{}), netip.MustParseAddr("192.0.2.14"))
	foreign := addrs("192.0.2.12", "2001:db8::12", "192.0.2.14", "192.0.2.2", "2001:db8::2")

	before := dumpAll(t, p.Node)
	t.Logf("before:\n%s", before.Text)
	fresh := addrs("192.0.2.13", "2001:db8::13")
	desired := append(slices.Clone(keep), fresh...)
	added, removed, err := b.Sync(desired)
	if err != nil {
		t.Fatalf("Sync: %v", err)
	}
	after := dumpAll(t, p.Node)
	t.Logf("after:\n%s", after.Text)

	sorted := func(s []netip.Addr) []netip.Addr {
		s = slices.Clone(s)
		slices.SortFunc(s, netip.Addr.Compare)
		return s
	}
	if !slices.Equal(added, sorted(fresh)) || !slices.Equal(removed, sorted(stale)) {
		t.Errorf("Sync added %v, removed %v; want %v, %v", added, removed, sorted(fresh), sorted(stale))
	}
	for _, ip := range foreign {
		x, _ := findAddr(before.Addrs, ip)
		y, ok := findAddr(after.Addrs, ip)
		if !ok || x != y {
			t.Errorf("foreign %s changed: %+v -> %+v (present %v)", ip, x, y, ok)
		}
	}
	for _, ip := range stale {
		if _, ok := findAddr(after.Addrs, ip); ok {
			t.Errorf("stale %s still present", ip)
		}
	}
	for _, ip := range keep {
		x, _ := findAddr(before.Addrs, ip)
		if y, ok := findAddr(after.Addrs, ip); !ok || x != y {
			t.Errorf("kept %s changed: %+v -> %+v", ip, x, y)
		}
	}
	if len(after.Addrs) != len(before.Addrs) { // two stale gone, two fresh added
		t.Errorf("%d addresses after, %d before; want as many", len(after.Addrs), len(before.Addrs))
	}
	// The same routes but the kernel's local routes of the addresses
	// removed and added.
	if x, y := withoutLocalOf(before.Routes, stale), withoutLocalOf(after.Routes, fresh); !slices.Equal(x, y) {
		t.Errorf("routes changed:\nbefore %q\nafter  %q", x, y)
	}
	if got := recordedIPs(t, path); !slices.Equal(got, sorted(desired)) {
		t.Errorf("record lists %v; want %v", got, sorted(desired))
	}
}

// watchDeletes collects RTM_DELADDR events in ns until the returned func is
// called, which returns the deleted IPs.
func watchDeletes(t *testing.T, ns *netnstest.NS) func() []netip.Addr {
	t.Helper()
	ch, done := make(chan netlink.AddrUpdate, 64), make(chan struct{})
	if err := netlink.AddrSubscribeWithOptions(ch, done, netlink.AddrSubscribeOptions{Namespace: &ns.Handle}); err != nil {
		t.Fatalf("subscribe to address events: %v", err)
	}
	var deleted []netip.Addr
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for u := range ch {
			if !u.NewAddr {
				ip, _ := netip.AddrFromSlice(u.LinkAddress.IP)
				deleted = append(deleted, ip.Unmap())
			}
		}
	}()
	// A sentinel change to know the subscription is live and drained.
	sentinel := func() {
		p := "192.0.2.250/32"
		ns.MustIP(t, "addr", "add", p, "dev", "lo")
		ns.MustIP(t, "addr", "del", p, "dev", "lo")
	}
	sentinel()
	return func() []netip.Addr {
		sentinel()
		close(done)
		<-stopped
		return slices.DeleteFunc(deleted, func(ip netip.Addr) bool { return ip == netip.MustParseAddr("192.0.2.250") })
	}
}

func TestFallbackMigrationRecordToProto(t *testing.T) {
	p := nodeWithSubnets(t)
	path := recordPath(t)
	ips := addrs("192.0.2.10", "2001:db8::10")
	old := recordBinder(t, p.Node, path)
	for _, ip := range ips {
		mustBind(t, old, ip)
		if a := mustAddr(t, p.Node, ip); a.Proto != 0 {
			t.Fatalf("record mode wrote proto %d on %s", a.Proto, ip)
		}
	}
	p.Node.MustIP(t, "addr", "add", "192.0.2.20/32", "dev", p.NodeIf, "noprefixroute")

	// The kernel keeps IFA_PROTO (as after an upgrade to 5.18+): an auto
	// agent with the same record takes over without unbinding anything.
	stop := watchDeletes(t, p.Node)
	nb := newBinder(t, p.Node, bind.Config{RecordPath: path})
	if got := ownedIPs(t, nb); !slices.Equal(got, ips) {
		t.Fatalf("auto Binder owns %v; want %v", got, ips)
	}
	added, removed, err := nb.Sync(ips)
	if err != nil || len(added)+len(removed) != 0 {
		t.Errorf("migrating Sync = %v, %v, %v; want no change", added, removed, err)
	}
	if del := stop(); len(del) != 0 {
		t.Errorf("migration deleted %v; want nothing deleted", del)
	}
	// The addresses got the mark in place, so they stay ours even
	// without the record.
	for _, ip := range ips {
		if a := mustAddr(t, p.Node, ip); a.Proto != bind.DefaultProto {
			t.Errorf("%s after migration = %+v; want proto %d", ip, a, bind.DefaultProto)
		}
	}
	markOnly := newBinder(t, p.Node, bind.Config{Ownership: bind.OwnershipProto})
	if got := ownedIPs(t, markOnly); !slices.Equal(got, ips) {
		t.Errorf("mark-only Binder owns %v after migration; want %v", got, ips)
	}
	if _, removed, err := nb.Sync(nil); err != nil || !slices.Equal(removed, ips) {
		t.Errorf("Sync(nil) = %v, %v; want %v removed", removed, err, ips)
	}
	mustAddr(t, p.Node, netip.MustParseAddr("192.0.2.20"))
}

func TestFallbackMigrationProtoToRecord(t *testing.T) {
	p := nodeWithSubnets(t)
	path := recordPath(t)
	ips := addrs("192.0.2.10", "2001:db8::10")
	// Bound by an agent relying on the mark alone, without a record (as
	// agents before the fallback existed).
	legacy := newBinder(t, p.Node, bind.Config{Ownership: bind.OwnershipProto})
	for _, ip := range ips {
		mustBind(t, legacy, ip)
	}
	p.Node.MustIP(t, "addr", "add", "192.0.2.20/32", "dev", p.NodeIf, "noprefixroute")

	stop := watchDeletes(t, p.Node)
	// An auto agent with a record adopts them and records them ...
	auto := newBinder(t, p.Node, bind.Config{RecordPath: path})
	if added, removed, err := auto.Sync(ips); err != nil || len(added)+len(removed) != 0 {
		t.Fatalf("auto Sync = %v, %v, %v; want no change", added, removed, err)
	}
	if got := recordedIPs(t, path); !slices.Equal(got, ips) {
		t.Fatalf("record lists %v; want %v", got, ips)
	}
	// ... so that an agent that cannot read the mark (a kernel without
	// IFA_PROTO, forced here) takes over without unbinding anything.
	rb := recordBinder(t, p.Node, path)
	if got := ownedIPs(t, rb); !slices.Equal(got, ips) {
		t.Fatalf("record Binder owns %v; want %v", got, ips)
	}
	if added, removed, err := rb.Sync(ips); err != nil || len(added)+len(removed) != 0 {
		t.Errorf("record Sync = %v, %v, %v; want no change", added, removed, err)
	}
	if del := stop(); len(del) != 0 {
		t.Errorf("migration deleted %v; want nothing deleted", del)
	}
	if _, removed, err := rb.Sync(nil); err != nil || !slices.Equal(removed, ips) {
		t.Errorf("Sync(nil) = %v, %v; want %v removed", removed, err, ips)
	}
	mustAddr(t, p.Node, netip.MustParseAddr("192.0.2.20"))
}

func TestFallbackCorruptOrMissingRecord(t *testing.T) {
	p := nodeWithSubnets(t)
	path := recordPath(t)
	b := recordBinder(t, p.Node, path)
	ips := addrs("192.0.2.10", "2001:db8::10")
	for _, ip := range ips {
		mustBind(t, b, ip)
	}

	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// Corrupt: nothing is bound or removed, and the error says what to do.
	if err := os.WriteFile(path, []byte("{\"version\": 1, \"addresses\": [tru"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, removed, err := b.Sync(nil)
	if !errors.Is(err, bind.ErrRecordUnreadable) || len(removed) != 0 {
		t.Fatalf("Sync(nil) with a corrupt record = %v, %v; want ErrRecordUnreadable, nothing removed", removed, err)
	}
	if st := b.Status(); !errors.Is(st.Err, bind.ErrRecordUnreadable) || !strings.Contains(st.Err.Error(), "fix or delete the file") ||
		!strings.Contains(st.Err.Error(), path) {
		t.Errorf("Status().Err = %v; want ErrRecordUnreadable naming %s and what to do", st.Err, path)
	}
	if _, err := b.Bind(netip.MustParseAddr("192.0.2.30")); !errors.Is(err, bind.ErrRecordUnreadable) {
		t.Errorf("Bind with a corrupt record = %v; want ErrRecordUnreadable", err)
	}
	mustAbsent(t, p.Node, netip.MustParseAddr("192.0.2.30"))
	for _, ip := range ips {
		mustAddr(t, p.Node, ip)
	}
	// A restarted agent starts (Owned reports the error, nothing else).
	if _, err := recordBinder(t, p.Node, path).Owned(); !errors.Is(err, bind.ErrRecordUnreadable) {
		t.Errorf("Owned() with a corrupt record = %v; want ErrRecordUnreadable", err)
	}

	// Missing after it listed addresses (the operator deleted it): the
	// addresses are left alone, and the status names them.
	if err := os.WriteFile(path, good, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Sync(ips); err != nil {
		t.Fatalf("Sync after repair: %v", err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if _, removed, _ := b.Sync(nil); len(removed) != 0 {
		t.Errorf("Sync(nil) after the record vanished removed %v; want nothing", removed)
	}
	st := b.Status()
	if !errors.Is(st.Err, bind.ErrRecordMissing) || !strings.Contains(st.Err.Error(), "192.0.2.10/32") ||
		!strings.Contains(st.Err.Error(), "ip address del") {
		t.Errorf("Status().Err = %v; want ErrRecordMissing naming 192.0.2.10/32 and what to do", st.Err)
	}
	for _, ip := range ips {
		mustAddr(t, p.Node, ip)
		if _, err := b.Bind(ip); !errors.Is(err, bind.ErrForeignAddress) {
			t.Errorf("Bind(%s) of an address the lost record listed = %v; want ErrForeignAddress", ip, err)
		}
	}
	// The operator removes them by hand: the condition clears.
	p.Node.MustIP(t, "addr", "del", "192.0.2.10/32", "dev", p.NodeIf)
	p.Node.MustIP(t, "addr", "del", "2001:db8::10/128", "dev", p.NodeIf)
	if _, _, err := b.Sync(nil); err != nil {
		t.Fatalf("Sync after clean-up: %v", err)
	}
	if st := b.Status(); st.Err != nil {
		t.Errorf("Status().Err after clean-up = %v; want nil", st.Err)
	}

	// A record directory that is not there (hostPath not mounted).
	nb := recordBinder(t, p.Node, filepath.Join(t.TempDir(), "absent", "ownership.json"))
	if _, err := nb.Bind(netip.MustParseAddr("192.0.2.31")); !errors.Is(err, bind.ErrRecordUnreadable) || !strings.Contains(err.Error(), "hostPath") {
		t.Errorf("Bind without the record's directory = %v; want ErrRecordUnreadable mentioning the hostPath", err)
	}
	mustAbsent(t, p.Node, netip.MustParseAddr("192.0.2.31"))

	// A record of another network namespace is refused, not overwritten.
	other := nodeWithSubnets(t)
	mustBind(t, recordBinder(t, other.Node, path), netip.MustParseAddr("192.0.2.40"))
	if _, _, err := b.Sync(nil); !errors.Is(err, bind.ErrRecordUnreadable) || !strings.Contains(err.Error(), "network namespace") {
		t.Errorf("Sync with another namespace's record = %v; want ErrRecordUnreadable naming the namespace", err)
	}
	if got := recordedIPs(t, path); !slices.Equal(got, addrs("192.0.2.40")) {
		t.Errorf("record lists %v; want the other namespace's [192.0.2.40] untouched", got)
	}
}

func TestFallbackInterfaceGoneMidBind(t *testing.T) {
	p := nodeWithSubnets(t)
	p.Node.MustIP(t, "link", "add", "br9", "type", "bridge")
	p.Node.MustIP(t, "link", "set", "br9", "up")
	path := recordPath(t)
	b := newBinder(t, p.Node, bind.Config{Ownership: bind.OwnershipRecord, RecordPath: path, Interface: "br9"})
	ip := netip.MustParseAddr("192.0.2.10")
	bind.SetTestHook(func(point string, got netip.Addr) {
		if point == bind.HookRecorded && got == ip {
			p.Node.MustIP(t, "link", "del", "br9")
		}
	})
	t.Cleanup(func() { bind.SetTestHook(nil) })
	_, err := b.Bind(ip)
	if !errors.Is(err, unix.ENODEV) || !strings.Contains(err.Error(), "disappeared while binding") || !strings.Contains(err.Error(), "next pass") {
		t.Fatalf("Bind on a vanishing interface = %v; want ENODEV saying what happened and what to do", err)
	}
	mustAbsent(t, p.Node, ip)
	if got := recordedIPs(t, path); len(got) != 0 {
		t.Errorf("record lists %v after the failed bind; want the entry withdrawn", got)
	}
}

// TestFallbackAutoWhenKernelDropsMark: addresses come out unmarked, as on a
// kernel before 5.18 (the attribute is left out of the add, a double for
// the old kernel's silent drop). auto with a record keeps the address and
// goes on with the record alone; proto refuses and leaves nothing behind.
func TestFallbackAutoWhenKernelDropsMark(t *testing.T) {
	p := nodeWithSubnets(t)
	bind.SetDropMark(true)
	t.Cleanup(func() { bind.SetDropMark(false) })
	path := recordPath(t)
	auto := newBinder(t, p.Node, bind.Config{RecordPath: path})
	ips := addrs("192.0.2.10", "2001:db8::10")
	for _, ip := range ips {
		if changed, err := auto.Bind(ip); err != nil || !changed {
			t.Fatalf("auto Bind(%s) = %v, %v; want true, nil", ip, changed, err)
		}
		if a := mustAddr(t, p.Node, ip); a.Proto != 0 {
			t.Fatalf("%s carries proto %d; the double should have left it out", ip, a.Proto)
		}
	}
	if st := auto.Status(); !st.MarkDropped || st.Err != nil {
		t.Errorf("Status() = %+v; want MarkDropped, healthy", st)
	}
	// A restarted auto agent adopts them through the record.
	if got := ownedIPs(t, newBinder(t, p.Node, bind.Config{RecordPath: path})); !slices.Equal(got, ips) {
		t.Errorf("restarted auto Binder owns %v; want %v", got, ips)
	}

	proto := newBinder(t, p.Node, bind.Config{Ownership: bind.OwnershipProto})
	other := netip.MustParseAddr("192.0.2.11")
	if _, err := proto.Bind(other); !errors.Is(err, bind.ErrOwnershipUnsupported) {
		t.Errorf("proto Bind = %v; want ErrOwnershipUnsupported", err)
	}
	mustAbsent(t, p.Node, other)

	// auto without the record's directory runs on the mark alone and says so.
	noDir := newBinder(t, p.Node, bind.Config{RecordPath: filepath.Join(t.TempDir(), "absent", "ownership.json")})
	if st := noDir.Status(); st.RecordPath != "" || !strings.Contains(st.Note, "does not exist") {
		t.Errorf("Status() without the record directory = %+v; want no record and a note", st)
	}
	if _, err := noDir.Bind(other); !errors.Is(err, bind.ErrOwnershipUnsupported) {
		t.Errorf("auto Bind without mark or record = %v; want ErrOwnershipUnsupported", err)
	}
	mustAbsent(t, p.Node, other)
}

// TestFallbackRecordFromEarlierBootIsVoid: a record written before a reboot
// (another boot_id) lists addresses that went with that boot; an address
// now on the Node with the same IP, interface and prefix is someone else's
// and stays, and the next write replaces the void record.
func TestFallbackRecordFromEarlierBootIsVoid(t *testing.T) {
	p := nodeWithSubnets(t)
	path := recordPath(t)
	idx := p.Node.Interface(t, p.NodeIf).Index
	old := fmt.Sprintf(`{"version":1,"bootID":"00000000-0000-0000-0000-000000000000","netns":"0:0","addresses":[`+
		`{"ip":"192.0.2.10","linkIndex":%d,"interface":%q,"prefixLen":32}]}`, idx, p.NodeIf)
	if err := os.WriteFile(path, []byte(old), 0o600); err != nil {
		t.Fatal(err)
	}
	p.Node.MustIP(t, "addr", "add", "192.0.2.10/32", "dev", p.NodeIf, "noprefixroute")
	b := recordBinder(t, p.Node, path)
	if got := ownedIPs(t, b); len(got) != 0 {
		t.Fatalf("Owned() with a record of an earlier boot = %v; want nothing", got)
	}
	fresh := netip.MustParseAddr("192.0.2.11")
	if _, removed, err := b.Sync([]netip.Addr{fresh}); err != nil || len(removed) != 0 {
		t.Fatalf("Sync = %v, %v; want nothing removed", removed, err)
	}
	mustAddr(t, p.Node, netip.MustParseAddr("192.0.2.10"))
	if got := recordedIPs(t, path); !slices.Equal(got, []netip.Addr{fresh}) {
		t.Errorf("record lists %v; want only [%s] of this boot", got, fresh)
	}
}
