// Package datapath builds a small cluster of network namespaces for
// datapath tests: Nodes on a bridge, Pods as veth namespaces behind each
// Node, a stand-in CNI (direct routes between Nodes' Pod CIDRs, masquerade
// of non-cluster traffic at srcnat, a DNAT ClusterIP), a router and an
// external server that records the source addresses it sees.
//
// Layout (documentation ranges only: RFC 5737, RFC 3849):
//
//	fab:  br0                                     (the Nodes' L2 segment)
//	rtr:  eth0 192.0.2.1/24 2001:db8::1/64 on br0; ext0 198.51.100.1/24 2001:db8:ff::1/64
//	ext:  eth0 198.51.100.10/24 2001:db8:ff::10/64, default via rtr
//	nK:   eth0 192.0.2.1K/24 2001:db8::1K/64 on br0, default via rtr,
//	      Pod CIDR 203.0.113.16K/28 and 2001:db8:1:K::/64
//	Pods: eth0 with a /32 and a /128, default via 169.254.1.1 / fe80::1
//	      (the Node side answers with proxy ARP / owns fe80::1)
//	Service: ClusterIP 203.0.113.241 and 2001:db8:2::241, port 80
//
// Every namespace is named <prefix><role> with a random prefix per run and
// deleted by Close (tests register it with t.Cleanup).
package datapath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/egressip/egressip/internal/testutil/netnstest"
)

// Fixed addresses of the harness.
var (
	RouterV4 = netip.MustParseAddr("192.0.2.1")
	RouterV6 = netip.MustParseAddr("2001:db8::1")
	ExtV4    = netip.MustParseAddr("198.51.100.10")
	ExtV6    = netip.MustParseAddr("2001:db8:ff::10")
	// ServiceV4/V6 are the stand-in ClusterIPs (DNAT to the last Pod of
	// the first Node, port 80 -> ServerPort).
	ServiceV4 = netip.MustParseAddr("203.0.113.241")
	ServiceV6 = netip.MustParseAddr("2001:db8:2::241")
	// PodRangeV4/V6 hold every Pod CIDR; ServiceRange* the ClusterIPs.
	PodRangeV4     = netip.MustParsePrefix("203.0.113.0/26")
	PodRangeV6     = netip.MustParsePrefix("2001:db8:1::/48")
	ServiceRangeV4 = netip.MustParsePrefix("203.0.113.240/28")
	ServiceRangeV6 = netip.MustParsePrefix("2001:db8:2::/64")
	NodeNetV4      = netip.MustParsePrefix("192.0.2.0/24")
	NodeNetV6      = netip.MustParsePrefix("2001:db8::/64")
)

// ServerPort is the TCP and UDP port of the external server and of the
// Pods' own servers.
const ServerPort = 8080

// NS is a network namespace of the harness (package netnstest's: Do, IP,
// WriteSysctl, OpenNetlink).
type NS = netnstest.NS

// Node is a Node namespace.
type Node struct {
	NS
	Index  int // 1-based
	IPv4   netip.Addr
	IPv6   netip.Addr
	PodV4  netip.Prefix
	PodV6  netip.Prefix
	Uplink string // "eth0"
	Pods   []*Pod
}

// Pod is a Pod namespace behind a Node.
type Pod struct {
	NS
	Node *Node
	IPv4 netip.Addr
	IPv6 netip.Addr
	Veth string // the Node-side interface
}

// IP returns the Pod's address of the family of like.
func (p *Pod) IP(v6 bool) netip.Addr {
	if v6 {
		return p.IPv6
	}
	return p.IPv4
}

// NodeIP returns the Node's address of one family.
func (n *Node) NodeIP(v6 bool) netip.Addr {
	if v6 {
		return n.IPv6
	}
	return n.IPv4
}

// Cluster is the whole harness.
type Cluster struct {
	Prefix        string
	Fab, Rtr, Ext *NS
	Nodes         []*Node
	Server        *Server
	all           []*NS
}

// Options shape a Cluster.
type Options struct {
	// Nodes is the number of Nodes (default 3, at most 3).
	Nodes int
	// PodsPerNode is the number of Pods behind each Node (default 2, at most 14).
	PodsPerNode int
}

// New builds the harness and registers its removal with t.Cleanup. It
// fails the test on any setup error.
func New(t testing.TB, o Options) *Cluster {
	t.Helper()
	netnstest.RequireRoot(t)
	if o.Nodes == 0 {
		o.Nodes = 3
	}
	if o.PodsPerNode == 0 {
		o.PodsPerNode = 2
	}
	c := &Cluster{Prefix: netnstest.Prefix("egd")}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("remove datapath harness: %v", err)
		}
	})
	if err := c.build(o); err != nil {
		t.Fatalf("build datapath harness: %v", err)
	}
	return c
}

// newNS creates namespace <Prefix><role> (netnstest.Create: lo up, DAD
// off) with forwarding on, and records it for Close.
func (c *Cluster) newNS(role string) (*NS, error) {
	n, err := netnstest.Create(c.Prefix + role)
	if err != nil {
		return nil, err
	}
	c.all = append(c.all, n)
	for _, kv := range [][2]string{{"net/ipv4/ip_forward", "1"}, {"net/ipv6/conf/all/forwarding", "1"}} {
		if err := n.WriteSysctl(kv[0], kv[1]); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// Close stops the server and deletes every namespace of the run.
func (c *Cluster) Close() error {
	if c.Server != nil {
		c.Server.Close()
		c.Server = nil
	}
	var errs []error
	for _, n := range c.all {
		if err := n.Delete(); err != nil {
			errs = append(errs, err)
		}
	}
	c.all = nil
	return errors.Join(errs...)
}

// ipAll runs several ip commands in one namespace, stopping at the first
// error.
func ipAll(n *NS, cmds ...[]string) error {
	for _, c := range cmds {
		if _, err := n.IP(c...); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) build(o Options) error {
	var err error
	if c.Fab, err = c.newNS("fab"); err != nil {
		return err
	}
	if c.Rtr, err = c.newNS("rtr"); err != nil {
		return err
	}
	if c.Ext, err = c.newNS("ext"); err != nil {
		return err
	}
	if err := ipAll(c.Fab, []string{"link", "add", "br0", "type", "bridge"}, []string{"link", "set", "br0", "up"}); err != nil {
		return err
	}
	// Router on br0, and toward ext.
	if err := c.plug(c.Rtr, "rtr", "eth0"); err != nil {
		return err
	}
	if err := ipAll(c.Rtr,
		[]string{"addr", "add", "192.0.2.1/24", "dev", "eth0"},
		[]string{"addr", "add", "2001:db8::1/64", "dev", "eth0", "nodad"},
		[]string{"link", "set", "eth0", "up"},
	); err != nil {
		return err
	}
	if err := netnstest.Veth(c.Rtr.Name, "ext0", c.Ext.Name, "eth0"); err != nil {
		return err
	}
	if err := ipAll(c.Rtr,
		[]string{"addr", "add", "198.51.100.1/24", "dev", "ext0"},
		[]string{"addr", "add", "2001:db8:ff::1/64", "dev", "ext0", "nodad"},
		[]string{"link", "set", "ext0", "up"},
	); err != nil {
		return err
	}
	if err := ipAll(c.Ext,
		[]string{"addr", "add", "198.51.100.10/24", "dev", "eth0"},
		[]string{"addr", "add", "2001:db8:ff::10/64", "dev", "eth0", "nodad"},
		[]string{"link", "set", "eth0", "up"},
		[]string{"route", "add", "default", "via", "198.51.100.1"},
		[]string{"-6", "route", "add", "default", "via", "2001:db8:ff::1"},
	); err != nil {
		return err
	}
	for i := 1; i <= o.Nodes; i++ {
		n, err := c.addNode(i)
		if err != nil {
			return err
		}
		for j := 1; j <= o.PodsPerNode; j++ {
			if err := c.addPod(n, j); err != nil {
				return err
			}
		}
	}
	// Stand-in CNI: direct routes between Pod CIDRs, masquerade, ClusterIP.
	for _, n := range c.Nodes {
		for _, m := range c.Nodes {
			if m == n {
				continue
			}
			if err := ipAll(&n.NS,
				[]string{"route", "add", m.PodV4.String(), "via", m.IPv4.String()},
				[]string{"-6", "route", "add", m.PodV6.String(), "via", m.IPv6.String()},
			); err != nil {
				return err
			}
		}
		if err := c.installCNI(n); err != nil {
			return err
		}
	}
	c.Server, err = StartServer(c.Ext)
	return err
}

// plug creates a veth between ns (named ifname there) and br0 in fab.
func (c *Cluster) plug(ns *NS, tag, ifname string) error {
	if err := netnstest.Veth(c.Fab.Name, "b-"+tag, ns.Name, ifname); err != nil {
		return err
	}
	return ipAll(c.Fab,
		[]string{"link", "set", "b-" + tag, "master", "br0"},
		[]string{"link", "set", "b-" + tag, "up"},
	)
}

func (c *Cluster) addNode(i int) (*Node, error) {
	ns, err := c.newNS(fmt.Sprintf("n%d", i))
	if err != nil {
		return nil, err
	}
	n := &Node{
		NS: *ns, Index: i, Uplink: "eth0",
		IPv4:  netip.AddrFrom4([4]byte{192, 0, 2, byte(10 + i)}),
		IPv6:  netip.MustParseAddr(fmt.Sprintf("2001:db8::%d", 10+i)),
		PodV4: netip.PrefixFrom(netip.AddrFrom4([4]byte{203, 0, 113, byte(16 * i)}), 28),
		PodV6: netip.MustParsePrefix(fmt.Sprintf("2001:db8:1:%d::/64", i)),
	}
	if err := c.plug(ns, fmt.Sprintf("n%d", i), "eth0"); err != nil {
		return nil, err
	}
	if err := ipAll(ns,
		[]string{"addr", "add", n.IPv4.String() + "/24", "dev", "eth0"},
		[]string{"addr", "add", n.IPv6.String() + "/64", "dev", "eth0", "nodad"},
		[]string{"link", "set", "eth0", "up"},
		[]string{"route", "add", "default", "via", RouterV4.String()},
		[]string{"-6", "route", "add", "default", "via", RouterV6.String()},
	); err != nil {
		return nil, err
	}
	for _, kv := range [][2]string{
		{"net/ipv4/conf/all/rp_filter", "1"},
		{"net/ipv4/conf/default/rp_filter", "1"},
		{"net/ipv4/conf/eth0/rp_filter", "1"},
	} {
		if err := ns.WriteSysctl(kv[0], kv[1]); err != nil {
			return nil, err
		}
	}
	c.Nodes = append(c.Nodes, n)
	return n, nil
}

func (c *Cluster) addPod(n *Node, j int) error {
	p, err := c.WirePod(n, j)
	if err != nil {
		return err
	}
	n.Pods = append(n.Pods, p)
	return nil
}

// WirePod creates Pod slot j (1..14) behind n as a main CNI plugin would:
// the Pod's namespace, a veth into it, its /32 and /128 (203.0.113.16K+j,
// 2001:db8:1:K::j) and the routes of both sides. The Pod is not added to
// n.Pods; UnwirePod removes it.
func (c *Cluster) WirePod(n *Node, j int) (*Pod, error) {
	if j < 1 || j > 14 {
		return nil, fmt.Errorf("pod slot %d: out of 1..14", j)
	}
	ns, err := c.newNS(fmt.Sprintf("n%dp%d", n.Index, j))
	if err != nil {
		return nil, err
	}
	p := &Pod{
		NS: *ns, Node: n, Veth: fmt.Sprintf("vp%d", j),
		IPv4: netip.AddrFrom4([4]byte{203, 0, 113, byte(16*n.Index + j)}),
		IPv6: netip.MustParseAddr(fmt.Sprintf("2001:db8:1:%d::%d", n.Index, j)),
	}
	if err := netnstest.Veth(n.Name, p.Veth, ns.Name, "eth0"); err != nil {
		return nil, err
	}
	if err := ipAll(&n.NS,
		[]string{"addr", "add", "fe80::1/64", "dev", p.Veth, "nodad"},
		[]string{"link", "set", p.Veth, "up"},
		[]string{"route", "add", p.IPv4.String() + "/32", "dev", p.Veth},
		[]string{"-6", "route", "add", p.IPv6.String() + "/128", "dev", p.Veth},
	); err != nil {
		return nil, err
	}
	if err := n.WriteSysctl("net/ipv4/conf/"+p.Veth+"/proxy_arp", "1"); err != nil {
		return nil, err
	}
	if err := ipAll(ns,
		[]string{"addr", "add", p.IPv4.String() + "/32", "dev", "eth0"},
		[]string{"addr", "add", p.IPv6.String() + "/128", "dev", "eth0", "nodad"},
		[]string{"link", "set", "eth0", "up"},
		[]string{"route", "add", "169.254.1.1", "dev", "eth0", "scope", "link"},
		[]string{"route", "add", "default", "via", "169.254.1.1", "dev", "eth0"},
		[]string{"-6", "route", "add", "default", "via", "fe80::1", "dev", "eth0"},
	); err != nil {
		return nil, err
	}
	return p, nil
}

// UnwirePod deletes a Pod made by WirePod: its namespace (and with it the
// veth and the Node's routes to it).
func (c *Cluster) UnwirePod(p *Pod) error {
	if _, err := p.Node.IP("link", "del", p.Veth); err != nil {
		return err
	}
	if err := p.Delete(); err != nil {
		return err
	}
	c.all = slices.DeleteFunc(c.all, func(n *NS) bool { return n.Name == p.Name })
	return nil
}

// prefixMatch loads an address (offset/len in the network header) and
// compares it, masked, with prefix p.
func prefixMatch(off, n uint32, p netip.Prefix, op expr.CmpOp) []expr.Any {
	mask := net.CIDRMask(p.Bits(), p.Addr().BitLen())
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: n, Mask: mask, Xor: make([]byte, n)},
		&expr.Cmp{Op: op, Register: 1, Data: p.Masked().Addr().AsSlice()},
	}
}

func nfproto(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}},
	}
}

// installCNI adds the stand-in CNI's table "inet cni" on a Node:
// masquerade of Pod traffic leaving the cluster (srcnat, priority 100) and
// the ClusterIP DNAT (dstnat, priority -100) to the last Pod of Node 1.
func (c *Cluster) installCNI(n *Node) error {
	conn, err := nftables.New(nftables.WithNetNSFd(int(n.Handle)))
	if err != nil {
		return err
	}
	t := conn.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "cni"})
	post := conn.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	pre := conn.AddChain(&nftables.Chain{Name: "prerouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest})
	oifEth0 := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname("eth0")},
	}
	target := c.Nodes[0].Pods[len(c.Nodes[0].Pods)-1]
	for _, f := range []struct {
		proto           byte
		saddr, daddr, n uint32
		pods, nodes     netip.Prefix
		svc, dst        netip.Addr
	}{
		{unix.NFPROTO_IPV4, 12, 16, 4, PodRangeV4, NodeNetV4, ServiceV4, target.IPv4},
		{unix.NFPROTO_IPV6, 8, 24, 16, PodRangeV6, NodeNetV6, ServiceV6, target.IPv6},
	} {
		r := slices.Concat(oifEth0, nfproto(f.proto),
			prefixMatch(f.saddr, f.n, f.pods, expr.CmpOpEq),
			prefixMatch(f.daddr, f.n, f.pods, expr.CmpOpNeq),
			prefixMatch(f.daddr, f.n, f.nodes, expr.CmpOpNeq),
			[]expr.Any{&expr.Counter{}, &expr.Masq{}})
		conn.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: r})
		dn := append(nfproto(f.proto),
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: f.daddr, Len: f.n},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: f.svc.AsSlice()},
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0, 80}},
			&expr.Immediate{Register: 1, Data: f.dst.AsSlice()},
			&expr.Immediate{Register: 2, Data: []byte{ServerPort >> 8, ServerPort & 0xff}},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(f.proto), RegAddrMin: 1, RegProtoMin: 2},
		)
		conn.AddRule(&nftables.Rule{Table: t, Chain: pre, Exprs: dn})
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("stand-in CNI table on %s: %w", n.Name, err)
	}
	return nil
}

func ifname(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}

// ClusterCIDRs are the Pod and Service ranges of the harness.
func (c *Cluster) ClusterCIDRs() []netip.Prefix {
	return []netip.Prefix{PodRangeV4, ServiceRangeV4, PodRangeV6, ServiceRangeV6}
}

// NodeIPs are every Node's addresses.
func (c *Cluster) NodeIPs() []netip.Addr {
	out := make([]netip.Addr, 0, 2*len(c.Nodes))
	for _, n := range c.Nodes {
		out = append(out, n.IPv4, n.IPv6)
	}
	return out
}

// BindEIP puts an egress IP on a Node's uplink the way the agent's bind
// package does: /32 of scope host, or /128 without DAD and deprecated
// (preferred lifetime 0), no prefix route.
func (c *Cluster) BindEIP(n *Node, ip netip.Addr) error {
	args := []string{"addr", "add", ip.String() + "/32", "dev", n.Uplink, "scope", "host", "noprefixroute"}
	if ip.Is6() {
		args = []string{"addr", "add", ip.String() + "/128", "dev", n.Uplink, "nodad", "noprefixroute", "preferred_lft", "0"}
	}
	_, err := n.IP(args...)
	return err
}

// UnbindEIP removes an egress IP from a Node's uplink.
func (c *Cluster) UnbindEIP(n *Node, ip netip.Addr) error {
	bits := "/32"
	if ip.Is6() {
		bits = "/128"
	}
	_, err := n.IP("addr", "del", ip.String()+bits, "dev", n.Uplink)
	return err
}

// PointNeighbours makes the router and every other Node resolve ip to n's
// uplink MAC at once, as a gratuitous ARP or unsolicited NA would.
func (c *Cluster) PointNeighbours(n *Node, ip netip.Addr) error {
	h, err := n.OpenNetlink()
	if err != nil {
		return err
	}
	l, err := h.LinkByName(n.Uplink)
	h.Close()
	if err != nil {
		return err
	}
	mac := l.Attrs().HardwareAddr.String()
	var errs []error
	for _, ns := range append([]*NS{c.Rtr}, c.nodeNS(n)...) {
		if _, err := ns.IP("neigh", "replace", ip.String(), "lladdr", mac, "dev", "eth0", "nud", "reachable"); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Cut takes a Node off the bridge (its bridge port down), as a crash or a
// pulled cable would; Heal puts it back.
func (c *Cluster) Cut(n *Node) error {
	_, err := c.Fab.IP("link", "set", fmt.Sprintf("b-n%d", n.Index), "down")
	return err
}

// Heal reconnects a Node cut by Cut.
func (c *Cluster) Heal(n *Node) error {
	_, err := c.Fab.IP("link", "set", fmt.Sprintf("b-n%d", n.Index), "up")
	return err
}

func (c *Cluster) nodeNS(except *Node) []*NS {
	var out []*NS
	for _, m := range c.Nodes {
		if m != except {
			out = append(out, &m.NS)
		}
	}
	return out
}

// LinkStats returns the packet counters of a link in a namespace.
func LinkStats(ns *NS, name string) (rx, tx uint64, err error) {
	h, err := ns.OpenNetlink()
	if err != nil {
		return 0, 0, err
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if err != nil {
		return 0, 0, err
	}
	s := l.Attrs().Statistics
	if s == nil {
		return 0, 0, errors.New("no statistics")
	}
	return s.RxPackets, s.TxPackets, nil
}

// ForeignRuleset renders the chains and rules of an inet table that the
// datapath does not own (the stand-in CNI's "cni"), to prove it untouched;
// "" when the table is absent.
func ForeignRuleset(ns *NS, table string) (string, error) {
	conn, err := nftables.New(nftables.WithNetNSFd(int(ns.Handle)))
	if err != nil {
		return "", err
	}
	t, err := conn.ListTableOfFamily(table, nftables.TableFamilyINet)
	if err != nil {
		return "", nil
	}
	chains, err := conn.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, ch := range chains {
		if ch.Table.Name != t.Name {
			continue
		}
		rules, err := conn.GetRules(t, ch)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "chain %s: %d rules\n", ch.Name, len(rules))
		for _, r := range rules {
			for _, e := range r.Exprs {
				if _, ok := e.(*expr.Counter); ok {
					continue // counters move with traffic
				}
				fmt.Fprintf(&b, " %T%+v", e, e)
			}
			b.WriteString("\n")
		}
	}
	return b.String(), nil
}

// CPUs are the two CPUs SplitCPUs charges the harness's work to.
type CPUs struct {
	// Home carries the home Node, its Pods and the clients in them.
	Home int
	// Away carries the rest: the fabric bridge, the other Nodes and their
	// Pods, the router and the external server.
	Away int
}

// SplitCPUs makes the harness charge its work to two CPUs the way two
// groups of machines would, instead of to whichever CPU sent the packet:
// the home Node and its Pods on the first CPU this process may use, every
// other namespace (the fabric, the other Nodes, the router, the external
// server) on the second. It returns the two CPUs; Bulk pinned to Home is a
// client on the home Node's machine.
//
// Without it, a veth hands every packet to the backlog of the CPU that
// sent it, so one transfer's forwarding on every hop (both Nodes, the
// bridge, the router) runs in the sender's softirq on one CPU and a path
// through more namespaces is slower by their whole cost. With it, each
// namespace's veths steer what they receive to their group's CPU (RPS:
// rps_cpus of every receive queue, the backlog of the CPU it names, as a
// machine's NIC interrupts its own CPUs), and the server handles each
// connection on a thread pinned to Away. The split is fixed per namespace,
// not per path, so the tunnel path (home Node, then the egress Node, the
// router, the server) and the direct path (home Node, then the router,
// the server) are modelled alike; the egress Node shares Away with the
// router and the server, which charges the tunnel more than separate
// machines would.
//
// Errors: fewer than two CPUs allowed to this process, or a failure to
// list a namespace's links or to write rps_cpus (through `ip netns exec`,
// which mounts the namespace's own sysfs).
func (c *Cluster) SplitCPUs(home *Node) (CPUs, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return CPUs{}, fmt.Errorf("CPUs of this process: %w", err)
	}
	var cpus []int
	for i := 0; i < 1024 && len(cpus) < 2; i++ { // the CPUs a CPUSet holds
		if set.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	if len(cpus) < 2 {
		return CPUs{}, fmt.Errorf("split CPUs: this process may use %d CPU(s), needs 2", set.Count())
	}
	split := CPUs{Home: cpus[0], Away: cpus[1]}
	homeNS := map[string]bool{home.Name: true}
	for _, p := range home.Pods {
		homeNS[p.Name] = true
	}
	for _, n := range c.all {
		cpu := split.Away
		if homeNS[n.Name] {
			cpu = split.Home
		}
		if err := steerVeths(n, cpu); err != nil {
			return CPUs{}, err
		}
	}
	c.Server.pin.Store(int32(split.Away))
	return split, nil
}

// steerVeths writes rps_cpus of every receive queue of every veth in ns
// to the mask of one CPU.
func steerVeths(ns *NS, cpu int) error {
	h, err := ns.OpenNetlink()
	if err != nil {
		return err
	}
	links, err := h.LinkList()
	h.Close()
	if err != nil {
		return fmt.Errorf("links of %s: %w", ns.Name, err)
	}
	script := `m=$1; shift; for d; do for q in /sys/class/net/$d/queues/rx-*/rps_cpus; do echo $m > $q || exit 1; done; done`
	args := []string{"netns", "exec", ns.Name, "sh", "-c", script, "sh", cpuMask(cpu)}
	for _, l := range links {
		if l.Type() == "veth" {
			args = append(args, l.Attrs().Name)
		}
	}
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("rps_cpus in %s: %w: %s", ns.Name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// cpuMask is the sysfs bitmap (hexadecimal 32-bit words, most significant
// first, separated by commas) with only cpu set.
func cpuMask(cpu int) string {
	words := make([]string, cpu/32+1)
	for i := range words {
		words[i] = "00000000"
	}
	words[0] = fmt.Sprintf("%08x", uint32(1)<<(cpu%32))
	return strings.Join(words, ",")
}

// pinThread binds the calling goroutine to its OS thread and that thread
// to cpu. There is no undoing it: the caller's goroutine must exit still
// locked, so that the Go runtime ends the thread instead of reusing it.
func pinThread(cpu int) error {
	runtime.LockOSThread()
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return fmt.Errorf("pin thread to CPU %d: %w", cpu, err)
	}
	return nil
}
