package datapath_test

import (
	"context"
	"flag"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/egressip/egressip/internal/agent/bind"
	dp "github.com/egressip/egressip/test/datapath"
)

// withoutGuard deletes the source guard's rules from the egress Node's
// table before the renewal: the datapath as it was before the guard.
var withoutGuard = flag.Bool("dad.without-guard", false,
	"TestNodeSourceUnchangedDuringDAD: flush the datapath's source-out and source-post chains on the egress Node (the behaviour before the guard, to show the fault)")

// peerWatch counts, in the router (the Node's next hop toward the
// external server), the IPv6 packets from the Node's segment whose source
// is eip: toward the external server's address (leaks, by protocol) and
// toward a second address of it that only the selected Pods use.
type peerWatch struct {
	ns *dp.NS
}

var watchCounters = []string{"leak-tcp", "leak-udp", "leak-other", "selected"}

func newPeerWatch(t *testing.T, rtr *dp.NS, eip, ext, selected netip.Addr) *peerWatch {
	t.Helper()
	conn, err := nftables.New(nftables.WithNetNSFd(int(rtr.Handle)))
	if err != nil {
		t.Fatal(err)
	}
	tab := conn.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "watch"})
	ch := conn.AddChain(&nftables.Chain{Name: "pre", Table: tab, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRaw})
	for _, n := range watchCounters {
		conn.AddObj(&nftables.NamedObj{Table: tab, Name: n, Type: nftables.ObjTypeCounter, Obj: &expr.Counter{}})
	}
	cmp := func(off uint32, a netip.Addr) []expr.Any {
		return []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 16},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a.AsSlice()},
		}
	}
	base := append([]expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV6}},
	}, cmp(8, eip)...)
	count := func(name string, more ...expr.Any) {
		r := append(append(append([]expr.Any{}, base...), more...),
			&expr.Objref{Type: int(nftables.ObjTypeCounter), Name: name},
			&expr.Verdict{Kind: expr.VerdictAccept})
		conn.AddRule(&nftables.Rule{Table: tab, Chain: ch, Exprs: r})
	}
	proto := func(p byte) []expr.Any {
		return []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}}}
	}
	count("selected", cmp(24, selected)...)
	count("leak-tcp", append(cmp(24, ext), proto(unix.IPPROTO_TCP)...)...)
	count("leak-udp", append(cmp(24, ext), proto(unix.IPPROTO_UDP)...)...)
	count("leak-other", cmp(24, ext)...)
	if err := conn.Flush(); err != nil {
		t.Fatalf("watch table in %s: %v", rtr.Name, err)
	}
	return &peerWatch{ns: rtr}
}

func (w *peerWatch) counts(t *testing.T) map[string]uint64 {
	t.Helper()
	conn, err := nftables.New(nftables.WithNetNSFd(int(w.ns.Handle)))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := conn.GetNamedObjects(&nftables.Table{Family: nftables.TableFamilyINet, Name: "watch"})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, o := range objs {
		if n, ok := o.(*nftables.NamedObj); ok {
			if c, ok := n.Obj.(*expr.Counter); ok {
				out[n.Name] = c.Packets
			}
		}
	}
	return out
}

// tentative reports whether ip is on n's uplink and still tentative
// (duplicate address detection under way).
func tentative(t *testing.T, n *dp.Node, ip netip.Addr) bool {
	t.Helper()
	h, err := n.OpenNetlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	addrs, err := h.AddrList(nil, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if got, ok := netip.AddrFromSlice(a.IP); ok && got == ip {
			return a.Flags&unix.IFA_F_TENTATIVE != 0
		}
	}
	return false
}

// probeResult is one probe of the window: who sent it, the source the
// server saw (invalid when nothing came back) and the error.
type probeResult struct {
	who string
	src netip.Addr
	err error
}

// TestNodeSourceUnchangedDuringDAD (issue 23 fault 4, the IPv6 gap): the
// egress Node n2's only global IPv6 address is removed and added again
// with duplicate address detection on (accept_dad 1, dad_transmits 2), as
// a DHCPv6 renewal can do, while n2 holds an egress IPv6 bound by the
// agent's binder (deprecated). While the Node's address is tentative the
// kernel's source selection takes the egress IP (checked: `ip -6 route
// get` shows it, the premise of the test). Throughout that window n2's
// host traffic (UDP, and TCP connect), an unselected Pod's masqueraded
// traffic (UDP and TCP) and the selected Pods' traffic (one on n2, one on
// n1 through the tunnel) go out in rounds: the router, n2's next hop,
// must never see a packet toward the external server with the egress IP
// as its source, while the selected Pods' traffic to the server's second
// address still arrives from it (during the window and after), the
// egress Node's guard counts what it stopped, and afterwards the host and
// the masqueraded Pod leave with the Node's own address again and the
// egress IP still answers Neighbor Solicitations. With -dad.without-guard
// the router sees the egress IP (the fault).
func TestNodeSourceUnchangedDuringDAD(t *testing.T) {
	d := newDADCase(t)
	if *withoutGuard {
		flushGuard(t, d.n2)
	}
	d.renew()
	d.checkWindow(d.window())
	d.checkAfter()
}

// dadCase is the setup of TestNodeSourceUnchangedDuringDAD: e1 held by
// n2 (its egress IPv6 bound by the agent's binder), a local member on n2
// and a remote one on n1, an unselected Pod on n2, the router's watch.
type dadCase struct {
	t                         *testing.T
	ctx                       context.Context
	f                         *fixture
	n1, n2                    *dp.Node
	local, remote, unselected *dp.Pod
	// eip is e1's egress IP, own n2's own IPv6 address, ext and ext2 the
	// server's two addresses (ext2 for the selected Pods only).
	eip, own, ext, ext2 netip.Addr
	watch               *peerWatch
}

func newDADCase(t *testing.T) *dadCase {
	fm := families[1]
	f := newFixture(t)
	n1, n2 := f.c.Nodes[0], f.c.Nodes[1]
	d := &dadCase{t: t, ctx: ctxT(t, 120*time.Second), f: f, n1: n1, n2: n2,
		local: n2.Pods[0], remote: n1.Pods[0], unselected: n2.Pods[1],
		eip: fm.eip, own: n2.IPv6, ext: fm.ext, ext2: netip.MustParseAddr("2001:db8:ff::20")}
	// The server's second address, for the selected Pods (TCP only:
	// deprecated, so that the server's UDP answers to its first address
	// keep that address as their source).
	if _, err := f.c.Ext.IP("addr", "add", d.ext2.String()+"/64", "dev", "eth0", "nodad", "preferred_lft", "0"); err != nil {
		t.Fatal(err)
	}
	specs := []spec{{name: "e1", ip: d.eip, node: n2, members: []*dp.Pod{d.local, d.remote}}}
	for _, n := range f.c.Nodes {
		f.applyNode(n, specs)
	}
	b, err := bind.New(n2.Handle, bind.Config{Interface: n2.Uplink})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	if _, err := b.Bind(d.eip); err != nil {
		t.Fatalf("bind %s on %s: %v", d.eip, n2.Name, err)
	}
	if err := f.c.PointNeighbours(n2, d.eip); err != nil {
		t.Fatal(err)
	}
	d.watch = newPeerWatch(t, f.c.Rtr, d.eip, d.ext, d.ext2)
	// Before: everything as designed.
	for _, p := range []*dp.Pod{d.local, d.remote} {
		if got, err := dp.TCPWho(d.ctx, &p.NS, d.ext2); err != nil || got != d.eip {
			t.Fatalf("before the renewal, %s reached the server from %v (%v), want the egress IP %s", p.Name, got, err, d.eip)
		}
	}
	if got, err := dp.TCPWho(d.ctx, &n2.NS, d.ext); err != nil || got != d.own {
		t.Fatalf("before the renewal, %s's host reached the server from %v (%v), want %s", n2.Name, got, err, d.own)
	}
	return d
}

// renew removes n2's own address and adds it again with DAD on.
func (d *dadCase) renew() {
	for _, kv := range [][2]string{{"net/ipv6/conf/eth0/accept_dad", "1"}, {"net/ipv6/conf/eth0/dad_transmits", "2"}} {
		if err := d.n2.WriteSysctl(kv[0], kv[1]); err != nil {
			d.t.Fatal(err)
		}
	}
	for _, args := range [][]string{
		{"addr", "del", d.own.String() + "/64", "dev", "eth0"},
		{"addr", "add", d.own.String() + "/64", "dev", "eth0"},
		{"-6", "route", "replace", "default", "via", dp.RouterV6.String(), "dev", "eth0"},
	} {
		if _, err := d.n2.IP(args...); err != nil {
			d.t.Fatal(err)
		}
	}
}

// window runs probe rounds while n2's address is tentative and the
// kernel's source toward the server is the egress IP (the premise).
func (d *dadCase) window() []probeResult {
	t := d.t
	var results []probeResult
	rounds := 0
	for tentative(t, d.n2, d.own) {
		out, err := d.n2.IP("-6", "route", "get", d.ext.String())
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, "src "+d.eip.String()+" ") {
			t.Logf("route get while tentative: %s", strings.TrimSpace(out))
			continue
		}
		if rounds == 0 {
			// The return tunnel's outer source, chosen alike.
			tun, _ := d.n2.IP("-6", "route", "get", d.n1.IPv6.String())
			t.Logf("route get %s (the remote member's Node) while tentative: %s", d.n1.IPv6, strings.TrimSpace(tun))
		}
		rounds++
		results = append(results, probeRound(d.ctx, d.n2, d.unselected, d.local, d.remote, d.ext, d.ext2)...)
	}
	if rounds == 0 {
		t.Fatalf("the kernel never chose the egress IP as the source while %s was tentative: the case under test did not occur", d.own)
	}
	t.Logf("%d probe rounds while %s was tentative and the kernel's source for %s was the egress IP", rounds, d.own, d.ext)
	return results
}

// checkWindow: nothing but the selected Pods reached the server from the
// egress IP, and both of them did.
func (d *dadCase) checkWindow(results []probeResult) {
	t := d.t
	selectedOK := map[string]int{}
	for _, r := range results {
		t.Logf("window: %-22s src=%v err=%v", r.who, r.src, r.err)
		switch selected := strings.HasPrefix(r.who, "selected"); {
		case selected && r.src == d.eip:
			selectedOK[r.who]++
		case selected && r.err == nil:
			t.Errorf("%s reached the server from %s, want the egress IP %s", r.who, r.src, d.eip)
		case !selected && r.src == d.eip:
			t.Errorf("%s reached the server from the egress IP %s", r.who, d.eip)
		}
	}
	for _, who := range []string{"selected-local-tcp", "selected-remote-tcp"} {
		if selectedOK[who] == 0 {
			t.Errorf("%s never reached the server from the egress IP during the window", who)
		}
	}
}

// checkAfter: the Node's own address again for the host and the
// masqueraded Pod; the egress IP still serves the selected Pods and
// answers Neighbor Solicitations; the router's watch saw no leak; the
// guard counted what it stopped.
func (d *dadCase) checkAfter() {
	t, ctx := d.t, d.ctx
	if out, err := d.n2.IP("-6", "route", "get", d.ext.String()); err != nil || !strings.Contains(out, "src "+d.own.String()+" ") {
		t.Errorf("after DAD, route get %s: %s; want src %s", d.ext, strings.TrimSpace(out), d.own)
	}
	for _, ns := range []*dp.NS{&d.n2.NS, &d.unselected.NS} {
		if got, err := dp.TCPWho(ctx, ns, d.ext); err != nil || got != d.own {
			t.Errorf("after DAD, TCP from %s reached the server from %v (%v), want %s", ns.Name, got, err, d.own)
		}
		if got, err := dp.UDPWho(ctx, ns, d.ext); err != nil || got != d.own {
			t.Errorf("after DAD, UDP from %s reached the server from %v (%v), want %s", ns.Name, got, err, d.own)
		}
	}
	if _, err := d.f.c.Rtr.IP("neigh", "del", d.eip.String(), "dev", "eth0"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*dp.Pod{d.local, d.remote} {
		if got, err := dp.TCPWho(ctx, &p.NS, d.ext2); err != nil || got != d.eip {
			t.Errorf("after DAD, TCP from %s reached the server from %v (%v), want the egress IP %s", p.Name, got, err, d.eip)
		}
	}
	mac := uplinkMAC(t, d.n2)
	if out, _ := d.f.c.Rtr.IP("-6", "neigh", "show", d.eip.String()); !strings.Contains(out, "lladdr "+mac) {
		t.Errorf("the router did not resolve the egress IP to %s's uplink %s again (Neighbor Solicitation unanswered?): %q", d.n2.Name, mac, out)
	}

	got := d.watch.counts(t)
	t.Logf("router: packets with source %s: %v", d.eip, got)
	if leaks := got["leak-tcp"] + got["leak-udp"] + got["leak-other"]; leaks != 0 {
		t.Errorf("the router saw %d packets toward %s with the egress IP as source (tcp %d, udp %d, other %d)",
			leaks, d.ext, got["leak-tcp"], got["leak-udp"], got["leak-other"])
	}
	if got["selected"] == 0 {
		t.Errorf("the router saw none of the selected Pods' packets from the egress IP: the watch proves nothing")
	}
	if !*withoutGuard {
		cs, err := d.f.dps[d.n2].Counters(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if cs["@eip-source"] == 0 {
			t.Errorf("the source guard on %s counted nothing: %v", d.n2.Name, cs)
		}
		t.Logf("%s: source guard stopped %d packets", d.n2.Name, cs["@eip-source"])
	}
}

// probeRound sends, at once, one probe of each kind and waits for them:
// n2's host (UDP, TCP) and the unselected Pod (UDP, TCP) toward ext, the
// selected Pods (TCP) toward ext2. TCP connects are bounded to 1.5 s: a
// SYN the guard drops in postrouting is retransmitted only after 1 s.
func probeRound(ctx context.Context, n2 *dp.Node, unselected, local, remote *dp.Pod, ext, ext2 netip.Addr) []probeResult {
	var mu sync.Mutex
	var out []probeResult
	var wg sync.WaitGroup
	add := func(who string, fn func(context.Context) (netip.Addr, error), timeout time.Duration) {
		wg.Go(func() {
			c, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			src, err := fn(c)
			mu.Lock()
			out = append(out, probeResult{who, src, err})
			mu.Unlock()
		})
	}
	for _, p := range []struct {
		name string
		ns   *dp.NS
	}{{"host", &n2.NS}, {"masqueraded", &unselected.NS}} {
		add(p.name+"-udp", func(c context.Context) (netip.Addr, error) { return udpOnce(c, p.ns, ext) }, time.Second)
		add(p.name+"-tcp", func(c context.Context) (netip.Addr, error) { return dp.TCPWho(c, p.ns, ext) }, 1500*time.Millisecond)
	}
	add("selected-local-tcp", func(c context.Context) (netip.Addr, error) { return dp.TCPWho(c, &local.NS, ext2) }, 1500*time.Millisecond)
	add("selected-remote-tcp", func(c context.Context) (netip.Addr, error) { return dp.TCPWho(c, &remote.NS, ext2) }, 1500*time.Millisecond)
	wg.Wait()
	return out
}

// udpOnce sends one datagram from ns to dst:ServerPort and waits for the
// server's answer (the source it saw) until ctx ends.
func udpOnce(ctx context.Context, ns *dp.NS, dst netip.Addr) (netip.Addr, error) {
	c, err := dp.Dial(ctx, ns, "udp", dst, dp.ServerPort)
	if err != nil {
		return netip.Addr{}, err
	}
	defer func() { _ = c.Close() }()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := c.Write([]byte("who")); err != nil {
		return netip.Addr{}, err
	}
	buf := make([]byte, 100)
	n, err := c.Read(buf)
	if err != nil {
		return netip.Addr{}, err
	}
	return netip.ParseAddr(string(buf[:n]))
}

// flushGuard deletes the rules of the source guard's base chains in n's
// datapath table (-dad.without-guard).
func flushGuard(t *testing.T, n *dp.Node) {
	t.Helper()
	conn, err := nftables.New(nftables.WithNetNSFd(int(n.Handle)))
	if err != nil {
		t.Fatal(err)
	}
	tab := &nftables.Table{Family: nftables.TableFamilyINet, Name: "egressip"}
	for _, c := range []string{"source-out", "source-post"} {
		conn.FlushChain(&nftables.Chain{Name: c, Table: tab})
	}
	if err := conn.Flush(); err != nil {
		t.Fatalf("flush the source guard on %s: %v", n.Name, err)
	}
	t.Logf("source guard flushed on %s (-dad.without-guard)", n.Name)
}

// uplinkMAC is the MAC address of n's uplink.
func uplinkMAC(t *testing.T, n *dp.Node) string {
	t.Helper()
	h, err := n.OpenNetlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(n.Uplink)
	if err != nil {
		t.Fatal(err)
	}
	return l.Attrs().HardwareAddr.String()
}
