package datapath_test

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/egressip/egressip/internal/agent/announce"
	"github.com/egressip/egressip/internal/agent/bind"
	"github.com/egressip/egressip/internal/agent/datapath"
	"github.com/egressip/egressip/internal/agent/poolroute"
	dp "github.com/egressip/egressip/test/datapath"
)

// The pool network of issue 19: Node n1 has its uplink eth0 (default
// route, 192.0.2.0/24) and a second link eth1 to router R2 on
// 198.51.100.0/24 (R2 is .1, n1 .2; IPv6 2001:db8:100::/64, ::1 and ::2).
// R2 also sits on br0 (192.0.2.2, 2001:db8::2, default via rtr) and has a
// server srv2 behind it (203.0.113.100, 2001:db8:200::100). The harness's
// own server behind the default router rtr is renumbered out of
// 198.51.100.0/24 for this test, to 203.0.113.70/27 (IPv6 keeps
// 2001:db8:ff::10). rtr routes the R2 networks via 192.0.2.2. The pools
// are subnetInfo {gateway 198.51.100.1, prefixLength 24} and
// {gateway 2001:db8:100::1, prefixLength 64}.
var (
	r2LinkV4  = netip.MustParsePrefix("198.51.100.0/24")
	r2LinkV6  = netip.MustParsePrefix("2001:db8:100::/64")
	r2GwV4    = netip.MustParseAddr("198.51.100.1")
	r2GwV6    = netip.MustParseAddr("2001:db8:100::1")
	poolEIPv4 = netip.MustParseAddr("198.51.100.50")
	poolEIPv6 = netip.MustParseAddr("2001:db8:100::50")
	// A second egress IP of the IPv4 pool, for the restart test.
	poolEIPv4b = netip.MustParseAddr("198.51.100.51")
	srv2V4     = netip.MustParseAddr("203.0.113.100")
	srv2V6     = netip.MustParseAddr("2001:db8:200::100")
	extMovedV4 = netip.MustParseAddr("203.0.113.70")
)

// poolNet is the fixture plus R2, srv2 and n1's second link.
type poolNet struct {
	f        *fixture
	r2, srv2 *dp.NS
	srv2Srv  *dp.Server
	n1MAC    net.HardwareAddr // n1's eth1
	n1UpMAC  net.HardwareAddr // n1's eth0
	r2MAC    net.HardwareAddr // R2's eth0 (toward n1)
	binder   *bind.Binder
	nl       *netlink.Handle // in n1
	// Every Node with a link to R2 (n1 and n3): its binder, netlink
	// handle and eth1 MAC.
	binders map[*dp.Node]*bind.Binder
	nls     map[*dp.Node]*netlink.Handle
	macs    map[*dp.Node]net.HardwareAddr
	// lastN3 is the count of the last counted call for n3's eth1.
	lastN3 uint64
}

// r2DMZMAC is the MAC of R2's bridge on the pool network (set, so that
// the bridge does not take a port's).
var r2DMZMAC = net.HardwareAddr{0x02, 0x19, 0, 0, 0, 1}

func newNS(t *testing.T, name string) *dp.NS {
	t.Helper()
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	h, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = h.Close()
		_ = exec.Command("ip", "netns", "del", name).Run()
	})
	ns := &dp.NS{Name: name, Handle: h}
	ipMust(t, ns, []string{"link", "set", "lo", "up"})
	for _, kv := range [][2]string{{"net/ipv4/ip_forward", "1"}, {"net/ipv6/conf/all/forwarding", "1"},
		{"net/ipv6/conf/all/accept_dad", "0"}, {"net/ipv6/conf/default/accept_dad", "0"}} {
		if err := ns.WriteSysctl(kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	return ns
}

func ipMust(t *testing.T, ns *dp.NS, cmds ...[]string) {
	t.Helper()
	for _, c := range cmds {
		if _, err := ns.IP(c...); err != nil {
			t.Fatal(err)
		}
	}
}

func linkMAC(t *testing.T, ns *dp.NS, name string) net.HardwareAddr {
	t.Helper()
	h, err := ns.OpenNetlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return l.Attrs().HardwareAddr
}

func newPoolNet(t *testing.T) *poolNet {
	t.Helper()
	f := newFixture(t)
	c := f.c
	n1 := c.Nodes[0]
	p := &poolNet{f: f, binders: map[*dp.Node]*bind.Binder{}, nls: map[*dp.Node]*netlink.Handle{}, macs: map[*dp.Node]net.HardwareAddr{}}
	p.r2 = newNS(t, c.Prefix+"r2")
	p.srv2 = newNS(t, c.Prefix+"srv2")
	// The default router's server leaves 198.51.100.0/24.
	ipMust(t, c.Rtr,
		[]string{"addr", "del", "198.51.100.1/24", "dev", "ext0"},
		[]string{"addr", "add", "203.0.113.65/27", "dev", "ext0"},
		[]string{"route", "add", r2LinkV4.String(), "via", "192.0.2.2"},
		[]string{"route", "add", "203.0.113.96/27", "via", "192.0.2.2"},
		[]string{"-6", "route", "add", r2LinkV6.String(), "via", "2001:db8::2"},
		[]string{"-6", "route", "add", "2001:db8:200::/64", "via", "2001:db8::2"},
	)
	ipMust(t, c.Ext,
		[]string{"addr", "del", "198.51.100.10/24", "dev", "eth0"},
		[]string{"addr", "add", "203.0.113.70/27", "dev", "eth0"},
		[]string{"route", "add", "default", "via", "203.0.113.65"},
	)
	// R2: toward n1, on br0, toward srv2.
	ipMust(t, c.Fab,
		[]string{"link", "add", "b-r2", "type", "veth", "peer", "name", "eth1", "netns", p.r2.Name},
		[]string{"link", "set", "b-r2", "master", "br0"},
		[]string{"link", "set", "b-r2", "up"},
	)
	ipMust(t, p.r2,
		[]string{"link", "add", "dmz", "address", r2DMZMAC.String(), "type", "bridge"},
		[]string{"addr", "add", "198.51.100.1/24", "dev", "dmz"},
		[]string{"addr", "add", "2001:db8:100::1/64", "dev", "dmz", "nodad"},
		[]string{"link", "set", "dmz", "up"},
	)
	for _, n := range []*dp.Node{n1, c.Nodes[2]} {
		port := fmt.Sprintf("d-n%d", n.Index)
		ipMust(t, &n.NS,
			[]string{"link", "add", "eth1", "type", "veth", "peer", "name", port, "netns", p.r2.Name},
			[]string{"addr", "add", fmt.Sprintf("198.51.100.%d/24", n.Index+1), "dev", "eth1"},
			[]string{"addr", "add", fmt.Sprintf("2001:db8:100::%d/64", n.Index+1), "dev", "eth1", "nodad"},
			[]string{"link", "set", "eth1", "up"},
		)
		ipMust(t, p.r2, []string{"link", "set", port, "master", "dmz"}, []string{"link", "set", port, "up"})
		// A site puts the second link in loose reverse-path mode: replies
		// and tunnel packets from the uplink's networks arrive on it
		// (docs/datapath.md, "Pool networks").
		if err := n.WriteSysctl("net/ipv4/conf/eth1/rp_filter", "2"); err != nil {
			t.Fatal(err)
		}
	}
	ipMust(t, p.r2,
		[]string{"addr", "add", "192.0.2.2/24", "dev", "eth1"},
		[]string{"addr", "add", "2001:db8::2/64", "dev", "eth1", "nodad"},
		[]string{"link", "set", "eth1", "up"},
		[]string{"route", "add", "default", "via", "192.0.2.1"},
		[]string{"-6", "route", "add", "default", "via", "2001:db8::1"},
		[]string{"link", "add", "eth2", "type", "veth", "peer", "name", "eth0", "netns", p.srv2.Name},
		[]string{"addr", "add", "203.0.113.97/27", "dev", "eth2"},
		[]string{"addr", "add", "2001:db8:200::1/64", "dev", "eth2", "nodad"},
		[]string{"link", "set", "eth2", "up"},
	)
	ipMust(t, p.srv2,
		[]string{"addr", "add", "203.0.113.100/27", "dev", "eth0"},
		[]string{"addr", "add", "2001:db8:200::100/64", "dev", "eth0", "nodad"},
		[]string{"link", "set", "eth0", "up"},
		[]string{"route", "add", "default", "via", "203.0.113.97"},
		[]string{"-6", "route", "add", "default", "via", "2001:db8:200::1"},
	)
	var err error
	if p.srv2Srv, err = dp.StartServer(p.srv2); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.srv2Srv.Close)
	p.n1MAC, p.n1UpMAC, p.r2MAC = linkMAC(t, &n1.NS, "eth1"), linkMAC(t, &n1.NS, "eth0"), linkMAC(t, p.r2, "dmz")

	// The agent's binder chooses the interface by the pool's subnet.
	hints := map[netip.Addr]bind.Hint{
		poolEIPv4:  {Subnet: netip.PrefixFrom(r2GwV4, 24)},
		poolEIPv4b: {Subnet: netip.PrefixFrom(r2GwV4, 24)},
		poolEIPv6:  {Subnet: netip.PrefixFrom(r2GwV6, 64)},
	}
	for _, n := range []*dp.Node{n1, c.Nodes[2]} {
		b, err := bind.New(n.Handle, bind.Config{HintFor: func(ip netip.Addr) bind.Hint { return hints[ip] }})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(b.Close)
		h, err := n.OpenNetlink()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(h.Close)
		p.binders[n], p.nls[n], p.macs[n] = b, h, linkMAC(t, &n.NS, "eth1")
	}
	p.binder, p.nl = p.binders[n1], p.nls[n1]
	return p
}

// programOnSecondLink programs, through a pool router of the first Node
// n1, Egress e4 (poolEIPv4) and e6 (poolEIPv6) held by n1 for members,
// and fails unless both egress IPs are routed through eth1 with a pool
// table. It returns the router and its result.
func (p *poolNet) programOnSecondLink(t *testing.T, members ...*dp.Pod) (*poolroute.Router, poolroute.Result) {
	t.Helper()
	n1 := p.f.c.Nodes[0]
	r, err := poolroute.New(p.nl, poolroute.Config{IDMask: p.f.dps[n1].Config().IDMask})
	if err != nil {
		t.Fatal(err)
	}
	res := p.program(t, r, []spec{
		{name: "e4", ip: poolEIPv4, node: n1, members: members},
		{name: "e6", ip: poolEIPv6, node: n1, members: members},
	})
	for _, x := range res.Routes {
		if x.Link != "eth1" || x.Table == 0 {
			t.Fatalf("egress IP %s: link %q table %d, want eth1 and a pool table", x.IP, x.Link, x.Table)
		}
	}
	return r, res
}

// program applies the datapath on every Node for specs (without the
// fixture's binding on the uplink), binds the egress IPs held by n1
// with the agent's binder, and syncs n1's pool routing.
func (p *poolNet) program(t *testing.T, r *poolroute.Router, specs []spec) poolroute.Result {
	t.Helper()
	var eips []netip.Addr
	for _, s := range specs {
		if s.node == p.f.c.Nodes[0] && s.ip.IsValid() {
			eips = append(eips, s.ip)
		}
	}
	if _, _, err := p.binder.Sync(eips); err != nil {
		t.Fatalf("bind: %v", err)
	}
	p.hook(p.f.c.Nodes[0], r)
	for _, n := range p.f.c.Nodes {
		p.f.applyNode(n, specs)
	}
	res, err := r.Sync(p.egresses(specs))
	if err != nil {
		t.Fatalf("pool routing: %v", err)
	}
	if err := res.Err(); err != nil {
		t.Fatalf("pool routing: %v", err)
	}
	return res
}

// egresses is what the agent hands the Router for n1: every egress IP it
// holds, the marks of the Egresses SNATing to it, the pool's subnetInfo.
func (p *poolNet) egresses(specs []spec) []poolroute.Egress {
	return p.egressesOn(p.f.c.Nodes[0], specs)
}

// hook adds n's pool routes and rules inside every datapath Apply on n,
// before its table is written, as the agent does (PoolRouting.beforeTable).
func (p *poolNet) hook(n *dp.Node, r *poolroute.Router) {
	cfg := p.f.dps[n].Config()
	p.f.dps[n].SetBeforeTable(func(plan datapath.Plan) error {
		var out []poolroute.Egress
		byIP := map[netip.Addr]int{}
		names := slices.Sorted(maps.Keys(plan.EIPs))
		for _, name := range names {
			ip := plan.EIPs[name]
			i, ok := byIP[ip]
			if !ok {
				gw, bits := r2GwV4, 24
				if ip.Is6() {
					gw, bits = r2GwV6, 64
				}
				i = len(out)
				byIP[ip] = i
				out = append(out, poolroute.Egress{IP: ip, Gateway: gw, PrefixLen: bits})
			}
			out[i].Marks = append(out[i].Marks, cfg.Mark(plan.IDs[name]))
		}
		_, err := r.Add(out)
		return err
	})
}

// egressesOn is egresses for any Node.
func (p *poolNet) egressesOn(n1 *dp.Node, specs []spec) []poolroute.Egress {
	d := p.f.dps[n1]
	ids := d.IDs()
	byIP := map[netip.Addr]*poolroute.Egress{}
	var out []poolroute.Egress
	for _, s := range specs {
		if s.node != n1 || !s.ip.IsValid() {
			continue
		}
		e := byIP[s.ip]
		if e == nil {
			gw, bits := r2GwV4, 24
			if s.ip.Is6() {
				gw, bits = r2GwV6, 64
			}
			out = append(out, poolroute.Egress{IP: s.ip, Gateway: gw, PrefixLen: bits})
			e = &out[len(out)-1]
			byIP[s.ip] = e
		}
		e.Marks = append(e.Marks, d.Config().Mark(ids[s.name]))
	}
	return out
}

// capture counts, at R2, packets from the egress IPs: those entering on
// its link to n1 from n1's eth1 MAC to R2's own MAC (the second link,
// R2 as next hop), and those entering from br0 (the uplink's segment).
func (p *poolNet) capture(t *testing.T) {
	t.Helper()
	conn, err := nftables.New(nftables.WithNetNSFd(int(p.r2.Handle)))
	if err != nil {
		t.Fatal(err)
	}
	tab := conn.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "capture"})
	ch := conn.AddChain(&nftables.Chain{Name: "pre", Table: tab, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRaw})
	iif := func(n string) []expr.Any {
		return []expr.Any{&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifnameBytes(n)}}
	}
	ether := func(off uint32, mac net.HardwareAddr) []expr.Any {
		return []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseLLHeader, Offset: off, Len: 6},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: mac}}
	}
	for _, eip := range []netip.Addr{poolEIPv4, poolEIPv4b, poolEIPv6} {
		saddr := []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: eip.AsSlice()}}
		if eip.Is6() {
			saddr = []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV6}},
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 8, Len: 16}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: eip.AsSlice()}}
		}
		for _, c := range []struct {
			name string
			m    []expr.Any
		}{
			{"second-" + eip.String(), slices.Concat(iif("dmz"), ether(6, p.n1MAC), ether(0, p.r2MAC))},
			{"second3-" + eip.String(), slices.Concat(iif("dmz"), ether(6, p.macs[p.f.c.Nodes[2]]), ether(0, p.r2MAC))},
			{"uplink-" + eip.String(), iif("eth1")},
		} {
			conn.AddObj(&nftables.NamedObj{Table: tab, Name: strings.ReplaceAll(c.name, ":", "_"), Type: nftables.ObjTypeCounter, Obj: &expr.Counter{}})
			conn.AddRule(&nftables.Rule{Table: tab, Chain: ch, Exprs: slices.Concat(c.m, saddr,
				[]expr.Any{&expr.Objref{Type: int(nftables.ObjTypeCounter), Name: strings.ReplaceAll(c.name, ":", "_")}})})
		}
	}
	if err := conn.Flush(); err != nil {
		t.Fatalf("capture table in R2: %v", err)
	}
}

// counted returns R2's capture counters: packets from eip on the second
// link (n1 -> R2's MAC) and on br0.
func (p *poolNet) counted(t *testing.T, eip netip.Addr) (second, uplink uint64) {
	t.Helper()
	conn, err := nftables.New(nftables.WithNetNSFd(int(p.r2.Handle)))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := conn.GetNamedObjects(&nftables.Table{Family: nftables.TableFamilyINet, Name: "capture"})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		var name string
		var n uint64
		switch o := o.(type) {
		case *nftables.NamedObj:
			if c, ok := o.Obj.(*expr.Counter); ok {
				name, n = o.Name, c.Packets
			}
		case *nftables.CounterObj:
			name, n = o.Name, o.Packets
		}
		switch name {
		case strings.ReplaceAll("second-"+eip.String(), ":", "_"):
			second = n
		case strings.ReplaceAll("uplink-"+eip.String(), ":", "_"):
			uplink = n
		case strings.ReplaceAll("second3-"+eip.String(), ":", "_"):
			p.lastN3 = n
		}
	}
	return second, uplink
}

// TestPoolNetworkRouting: selected Pods (one on the egress Node n1, one on
// n2 through the tunnel) reach a server behind R2 and one behind the
// default router from the egress IP bound on n1's second link; their
// packets leave that link with R2's MAC as next hop and the replies come
// back; an unselected Pod still leaves with n1's Node IP through the
// uplink; both families. The main table is not changed.
func TestPoolNetworkRouting(t *testing.T) {
	p := newPoolNet(t)
	c := p.f.c
	n1, n2 := c.Nodes[0], c.Nodes[1]
	local, remote, unselected := n1.Pods[0], n2.Pods[0], n1.Pods[1]
	mainBefore := ipOut(t, &n1.NS, "route", "show", "table", "main") + ipOut(t, &n1.NS, "-6", "route", "show", "table", "main")
	r, res := p.programOnSecondLink(t, local, remote)
	t.Logf("pool routing: %s\n%s%s", res, ipOut(t, &n1.NS, "rule"), ipOut(t, &n1.NS, "-6", "rule"))
	p.capture(t)

	p.checkTraffic(t, local, remote, unselected)
	mainAfter := ipOut(t, &n1.NS, "route", "show", "table", "main") + ipOut(t, &n1.NS, "-6", "route", "show", "table", "main")
	if mainAfter != mainBefore {
		t.Errorf("main table changed:\nbefore:\n%s\nafter:\n%s", mainBefore, mainAfter)
	}

	// Not needed any more: everything of ours goes, nothing else.
	for _, n := range c.Nodes {
		p.f.applyNode(n, nil)
	}
	if _, _, err := p.binder.Sync(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Sync(nil); err != nil {
		t.Fatal(err)
	}
	if got := ownedDump(t, &n1.NS, r.Config()); got != "" {
		t.Errorf("pool routing left after the Egresses went:\n%s", got)
	}
}

// checkTraffic: local and remote (selected, members of the Egresses of
// poolEIPv4 and poolEIPv6 held by n1) reach srv2 behind R2 and the server
// behind the default router from the egress IP, TCP and UDP, through n1's
// second link (at least 8 packets per server counted at R2 from n1's eth1
// MAC to R2's MAC, none through br0), and the replies come back;
// unselected still leaves with n1's Node IP. Both families, as subtests.
func (p *poolNet) checkTraffic(t *testing.T, local, remote, unselected *dp.Pod) {
	t.Helper()
	c := p.f.c
	n1 := c.Nodes[0]
	for _, fm := range []struct {
		name    string
		v6      bool
		eip     netip.Addr
		servers []netip.Addr // behind R2, behind the default router
		srvs    []*dp.Server
	}{
		{"ipv4", false, poolEIPv4, []netip.Addr{srv2V4, extMovedV4}, []*dp.Server{p.srv2Srv, c.Server}},
		{"ipv6", true, poolEIPv6, []netip.Addr{srv2V6, dp.ExtV6}, []*dp.Server{p.srv2Srv, c.Server}},
	} {
		t.Run(fm.name, func(t *testing.T) {
			ctx := ctxT(t, 60*time.Second)
			for i, dst := range fm.servers {
				before, _ := p.counted(t, fm.eip)
				for _, pod := range []*dp.Pod{local, remote} {
					got, err := dp.TCPWho(ctx, &pod.NS, dst)
					if err != nil || got != fm.eip {
						t.Errorf("TCP %s -> %s: server saw %v (err %v), want the egress IP %s", pod.Name, dst, got, err, fm.eip)
					}
					got, err = dp.UDPWho(ctx, &pod.NS, dst)
					if err != nil || got != fm.eip {
						t.Errorf("UDP %s -> %s: server saw %v (err %v), want the egress IP %s", pod.Name, dst, got, err, fm.eip)
					}
				}
				second, uplink := p.counted(t, fm.eip)
				t.Logf("to %s: R2 counted %d packets from %s from n1's eth1 %s to its MAC %s, %d through br0",
					dst, second-before, fm.eip, p.n1MAC, p.r2MAC, uplink)
				// Two TCP connections (SYN, ACK, data, FIN... at least 3
				// packets each) and two datagrams.
				if second-before < 8 {
					t.Errorf("to %s: R2 saw %d packets from %s on its link to n1 (from n1's eth1 %s to its own MAC %s), want every flow's", dst, second-before, fm.eip, p.n1MAC, p.r2MAC)
				}
				if uplink != 0 {
					t.Errorf("to %s: R2 saw %d packets from %s arrive through br0: they left n1's uplink", dst, uplink, fm.eip)
				}
				if n := fm.srvs[i].Sources()[fm.eip]; n == 0 {
					t.Errorf("server %s never saw %s", dst, fm.eip)
				}
				// Unselected: unchanged, the Node IP through the uplink.
				got, err := dp.TCPWho(ctx, &unselected.NS, dst)
				if err != nil || got != n1.NodeIP(fm.v6) {
					t.Errorf("TCP unselected %s -> %s: server saw %v (err %v), want n1's Node IP %s", unselected.Name, dst, got, err, n1.NodeIP(fm.v6))
				}
			}
		})
	}
}

func ipOut(t *testing.T, ns *dp.NS, args ...string) string {
	t.Helper()
	out, err := ns.IP(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// ownedDump is `ip rule` (both families) at the pool priorities and `ip
// route show table all` in the pool tables, one object per line, sorted.
func ownedDump(t *testing.T, ns *dp.NS, cfg poolroute.Config) string {
	t.Helper()
	var lines []string
	for _, fam := range []string{"-4", "-6"} {
		for l := range strings.SplitSeq(ipOut(t, ns, fam, "rule"), "\n") {
			pref, _, _ := strings.Cut(l, ":")
			if pref == fmt.Sprint(cfg.RulePriority) || pref == fmt.Sprint(cfg.RulePriority+1) {
				lines = append(lines, fam+" rule "+strings.Join(strings.Fields(l), " "))
			}
		}
		for l := range strings.SplitSeq(ipOut(t, ns, fam, "route", "show", "table", "all"), "\n") {
			f := strings.Fields(l)
			if i := slices.Index(f, "table"); i >= 0 && i+1 < len(f) {
				var n int
				if _, err := fmt.Sscan(f[i+1], &n); err == nil && n >= cfg.TableBase && n < cfg.TableBase+cfg.MaxTables {
					lines = append(lines, fam+" route "+strings.Join(f, " "))
				}
			}
		}
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// TestPoolNetworkCrashCleanup: an agent programmed two IPv4 egress IPs
// and one IPv6 on the second link and crashed; meanwhile one Egress went
// away. The next agent's first Sync leaves exactly what the remaining
// Egresses need (compared with what a Node that never had the third one
// gets), a foreign rule at the pool priority and a foreign route in a
// table of the pool range are untouched, and that table number is never
// used. Dumps before and after are logged.
func TestPoolNetworkCrashCleanup(t *testing.T) {
	p := newPoolNet(t)
	n1, n2 := p.f.c.Nodes[0], p.f.c.Nodes[1]
	local, remote := n1.Pods[0], n2.Pods[0]
	cfg := poolroute.Config{IDMask: p.f.dps[n1].Config().IDMask}
	// Foreign objects: a route in the first table of the range, a rule
	// at the fwmark priority (iproute2 marks it proto boot).
	ipMust(t, &n1.NS,
		[]string{"route", "add", "203.0.113.200/32", "dev", "eth0", "table", fmt.Sprint(poolroute.DefaultTableBase)},
		[]string{"rule", "add", "pref", fmt.Sprint(poolroute.DefaultRulePriority), "fwmark", "0x5", "lookup", "main"},
	)
	foreign := func() string {
		return ipOut(t, &n1.NS, "route", "show", "table", fmt.Sprint(poolroute.DefaultTableBase)) +
			ipOut(t, &n1.NS, "rule", "show", "fwmark", "0x5")
	}
	foreignBefore := foreign()
	r1, err := poolroute.New(p.nl, cfg)
	if err != nil {
		t.Fatal(err)
	}
	all := []spec{
		{name: "e4", ip: poolEIPv4, node: n1, members: []*dp.Pod{local, remote}},
		{name: "e4b", ip: poolEIPv4b, node: n1, members: []*dp.Pod{n1.Pods[1]}},
		{name: "e6", ip: poolEIPv6, node: n1, members: []*dp.Pod{local, remote}},
	}
	res := p.program(t, r1, all)
	for _, x := range res.Routes {
		if x.Table == poolroute.DefaultTableBase {
			t.Errorf("egress IP %s got table %d, which holds a foreign route", x.IP, x.Table)
		}
	}
	before := ownedDump(t, &n1.NS, r1.Config())
	t.Logf("before the crash:\n%s", before)

	// The crash: r1 is dropped without any cleanup (a Router keeps no
	// state); e4b is deleted while no agent runs. The next agent opens a
	// new datapath, binder and Router and programs what is left.
	p.f.open(n1)
	left := []spec{all[0], all[2]}
	r2, err := poolroute.New(p.nl, cfg)
	if err != nil {
		t.Fatal(err)
	}
	p.program(t, r2, left)
	after := ownedDump(t, &n1.NS, r2.Config())
	t.Logf("after the restart:\n%s", after)

	// What the remaining Egresses need: one table for eth1 with the
	// subnet and default routes of both families, a fwmark rule per
	// Egress, a source rule per egress IP.
	ids := p.f.dps[n1].IDs()
	dcfg := p.f.dps[n1].Config()
	var table int
	for _, x := range res.Routes {
		if x.IP == poolEIPv4 {
			table = x.Table
		}
	}
	want := []string{
		fmt.Sprintf("-4 route 198.51.100.0/24 dev eth1 table %d proto 101 scope link", table),
		fmt.Sprintf("-4 route default via 198.51.100.1 dev eth1 table %d proto 101 onlink", table),
		fmt.Sprintf("-4 rule %d: from all fwmark %#x/%#x lookup %d proto 101", r2.Config().RulePriority, dcfg.Mark(ids["e4"]), dcfg.IDMask, table),
		fmt.Sprintf("-4 rule %d: from %s lookup %d proto 101", r2.Config().RulePriority+1, poolEIPv4, table),
		fmt.Sprintf("-6 route 2001:db8:100::/64 dev eth1 table %d proto 101 metric 1024 pref medium", table),
		fmt.Sprintf("-6 route default via 2001:db8:100::1 dev eth1 table %d proto 101 metric 1024 onlink pref medium", table),
		fmt.Sprintf("-6 rule %d: from all fwmark %#x/%#x lookup %d proto 101", r2.Config().RulePriority, dcfg.Mark(ids["e6"]), dcfg.IDMask, table),
		fmt.Sprintf("-6 rule %d: from %s lookup %d proto 101", r2.Config().RulePriority+1, poolEIPv6, table),
	}
	slices.Sort(want)
	// The foreign rule sits at our priority and the foreign route in our
	// range: both are in the dump, untouched (checked below).
	var got []string
	for l := range strings.SplitSeq(after, "\n") {
		if !strings.Contains(l, "fwmark 0x5 ") && !strings.Contains(l, "203.0.113.200") {
			got = append(got, l)
		}
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("after the restart, pool routing is not exactly what the Egresses need:\ngot:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if f := foreign(); f != foreignBefore {
		t.Errorf("foreign route or rule changed:\nbefore:\n%s\nafter:\n%s", foreignBefore, f)
	}
	// The restarted Node still routes by the pool network.
	ctx := ctxT(t, 30*time.Second)
	if got, err := dp.TCPWho(ctx, &remote.NS, srv2V4); err != nil || got != poolEIPv4 {
		t.Errorf("after the restart: srv2 saw %v (err %v), want %s", got, err, poolEIPv4)
	}
	var none []spec
	for _, n := range p.f.c.Nodes {
		p.f.applyNode(n, none)
	}
	if _, err := r2.Sync(nil); err != nil {
		t.Fatal(err)
	}
	if f := foreign(); f != foreignBefore {
		t.Errorf("foreign route or rule changed by the final cleanup:\nbefore:\n%s\nafter:\n%s", foreignBefore, f)
	}
}

func ifnameBytes(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}

// TestPoolNetworkFailover moves an egress IP of the pool network between
// n1 and n3, both with a link to R2, while a member on n2 streams UDP
// probes every 10 ms to the server behind R2 and holds a TCP session:
// three planned moves (release on the old Node, then bind, Apply, pool
// routing and a GARP or unsolicited NA on the new Node's eth1) and three
// crash failovers (the old Node cut off both networks, the new one told
// at once). After each, R2's neighbour entry for the egress IP on its pool
// network names the new Node's eth1 MAC (the announcement went out on the
// right link) and R2 sees the egress IP's packets from that MAC. Logs the
// largest probe gap of each move and the medians.
func TestPoolNetworkFailover(t *testing.T) {
	p := newPoolNet(t)
	c := p.f.c
	n1, n2, n3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	member := n2.Pods[0]
	routers := map[*dp.Node]*poolroute.Router{}
	anns := map[*dp.Node]*announce.Announcer{}
	for _, n := range []*dp.Node{n1, n3} {
		r, err := poolroute.New(p.nls[n], poolroute.Config{IDMask: p.f.dps[n].Config().IDMask})
		if err != nil {
			t.Fatal(err)
		}
		routers[n] = r
		p.hook(n, r)
		a, err := announce.New(n.Handle, announce.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = a.Close() })
		anns[n] = a
	}
	p.capture(t)
	other := map[*dp.Node]*dp.Node{n1: n3, n3: n1}
	sync := func(t *testing.T, n *dp.Node, specs []spec, eips []netip.Addr) {
		t.Helper()
		if _, _, err := p.binders[n].Sync(eips); err != nil {
			t.Fatalf("bind on %s: %v", n.Name, err)
		}
		p.f.applyNode(n, specs)
		res, err := routers[n].Sync(p.egressesOn(n, specs))
		if err == nil {
			err = res.Err()
		}
		if err != nil {
			t.Fatalf("pool routing on %s: %v", n.Name, err)
		}
	}
	// acquire: the new Node binds, programs and starts the agent's
	// announcement burst (0, 1, 2, 4 s) on eth1.
	acquire := func(t *testing.T, n *dp.Node, specs []spec, eip netip.Addr) {
		t.Helper()
		sync(t, n, specs, []netip.Addr{eip})
		p.f.applyNode(n2, specs)
		anns[n].Start(eip, "eth1")
	}
	// gapOf is the largest interval without a probe at srv2 between the
	// first probe and stop, the silence after the last probe included
	// (a stream that never resumed is one long gap).
	gapOf := func(stream string, stopAt time.Time) (time.Duration, int) {
		ts := p.srv2Srv.Probes(stream)
		if len(ts) == 0 {
			return 0, 0
		}
		gap := stopAt.Sub(ts[len(ts)-1])
		for i := 1; i < len(ts); i++ {
			gap = max(gap, ts[i].Sub(ts[i-1]))
		}
		return gap, len(ts)
	}
	for _, fm := range []struct {
		name string
		eip  netip.Addr
		srv  netip.Addr
	}{{"ipv4", poolEIPv4, srv2V4}, {"ipv6", poolEIPv6, srv2V6}} {
		t.Run(fm.name, func(t *testing.T) {
			ctx := ctxT(t, 120*time.Second)
			specsAt := func(n *dp.Node) []spec {
				return []spec{{name: "e-" + fm.name, ip: fm.eip, node: n, members: []*dp.Pod{member}}}
			}
			at := n1
			acquire(t, at, specsAt(at), fm.eip)
			var planned, crash []time.Duration
			survived := 0
			for i := range 6 {
				isCrash := i >= 3
				next := other[at]
				conn, rd := echoSession(ctx, t, member, fm.srv)
				if err := echo(conn, rd, "before"); err != nil {
					t.Fatalf("move %d: echo before: %v", i, err)
				}
				stream := fmt.Sprintf("pool-%s-%d", fm.name, i)
				stop := probeStream(ctx, t, member, fm.srv, stream)
				time.Sleep(300 * time.Millisecond)
				specs := specsAt(next)
				if isCrash {
					if err := c.Cut(at); err != nil {
						t.Fatal(err)
					}
					ipMust(t, p.r2, []string{"link", "set", fmt.Sprintf("d-n%d", at.Index), "down"})
				} else {
					anns[at].Stop(fm.eip)
					sync(t, at, specs, nil) // release before acquire
				}
				acquire(t, next, specs, fm.eip)
				time.Sleep(700 * time.Millisecond)
				stopAt := time.Now()
				stop()
				gap, n := gapOf(stream, stopAt)
				err := echo(conn, rd, "after")
				_ = conn.Close()
				if err == nil {
					survived++
				}
				kind := "planned move"
				if isCrash {
					kind = "crash failover"
					crash = append(crash, gap)
				} else {
					planned = append(planned, gap)
				}
				t.Logf("%s %d %s -> %s: largest UDP gap %v over %d probes; TCP session survived: %v (%v)", kind, i, at.Name, next.Name, gap, n, err == nil, err)
				// The announcement went out on the pool link: R2's entry
				// for the egress IP on that network names next's eth1.
				var neigh string
				for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
					if neigh = ipOut(t, p.r2, "neigh", "show", fm.eip.String(), "dev", "dmz"); strings.Contains(neigh, p.macs[next].String()) {
						break
					}
				}
				if !strings.Contains(neigh, p.macs[next].String()) {
					t.Errorf("%s %d: R2's neighbour entry for %s on its pool network is %q, want %s (%s's eth1)", kind, i, fm.eip, strings.TrimSpace(neigh), p.macs[next], next.Name)
				}
				before1, _ := p.counted(t, fm.eip)
				before3 := p.lastN3
				if got, err := dp.UDPWho(ctx, &member.NS, fm.srv); err != nil || got != fm.eip {
					t.Errorf("%s %d: srv2 saw %v (err %v), want %s", kind, i, got, err, fm.eip)
				}
				after1, uplink := p.counted(t, fm.eip)
				after3 := p.lastN3
				if grew := map[*dp.Node]bool{n1: after1 > before1, n3: after3 > before3}; !grew[next] || grew[at] || uplink != 0 {
					t.Errorf("%s %d: R2 saw the egress IP from n1's eth1 %d, n3's eth1 %d, through br0 %d packets; want only %s's eth1", kind, i, after1-before1, after3-before3, uplink, next.Name)
				}
				if isCrash {
					// The dead Node comes back without the IP.
					anns[at].Stop(fm.eip)
					sync(t, at, specs, nil)
					if err := c.Heal(at); err != nil {
						t.Fatal(err)
					}
					ipMust(t, p.r2, []string{"link", "set", fmt.Sprintf("d-n%d", at.Index), "up"})
				}
				at = next
			}
			slices.Sort(planned)
			slices.Sort(crash)
			t.Logf("%s on the pool network: planned move median largest gap %v (all %v); crash failover median %v (all %v); TCP survived %d/6",
				fm.name, planned[1], planned, crash[1], crash, survived)
			if planned[1] > 3*time.Second || crash[1] > 3*time.Second { // generous, as TestCrashFailover
				t.Errorf("median gaps %v / %v", planned[1], crash[1])
			}
			if survived < 5 {
				t.Errorf("TCP session survived only %d of 6 moves", survived)
			}
			// Leave the Node pair clean for the next family.
			for _, n := range []*dp.Node{n1, n3} {
				anns[n].Stop(fm.eip)
				sync(t, n, nil, nil)
			}
			p.f.applyNode(n2, nil)
		})
	}
}
