package harness

import (
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strconv"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// partitionTable names the nftables table a Partition adds (family inet).
const partitionTable = "e2e-partition"

// Partition is a network fault made with nftables rules in one namespace:
// packets are dropped (not rejected), as a cut cable or a firewall would,
// so connections time out instead of failing at once. Heal removes it.
type Partition struct {
	// NS is the namespace the rules are in ("" for the control-plane
	// namespace this process runs in).
	NS     string
	tables []*nftables.Table
	// bridgePort is the bridge port an isolation took off br0 ("" for
	// none); Heal puts it back.
	bridgePort string
}

// conn opens nftables in namespace ns ("" for the current one).
func nftConn(ns string) (*nftables.Conn, func(), error) {
	if ns == "" {
		c, err := nftables.New()
		return c, func() {}, err
	}
	h, err := netns.GetFromName(ns)
	if err != nil {
		return nil, nil, fmt.Errorf("open %s: %w", ns, err)
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(h)))
	if err != nil {
		_ = h.Close()
		return nil, nil, err
	}
	return c, func() { _ = h.Close() }, nil
}

// Heal deletes the partition's tables: traffic flows again.
func (p *Partition) Heal() error {
	if p.bridgePort != "" {
		if err := run("ip", "link", "set", p.bridgePort, "master", "br0"); err != nil {
			return fmt.Errorf("heal partition of %q: %w", p.NS, err)
		}
		if len(p.tables) == 0 {
			return nil
		}
	}
	conn, done, err := nftConn(p.NS)
	if err != nil {
		return err
	}
	defer done()
	for _, t := range p.tables {
		conn.DelTable(t)
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("heal partition in %q: %w", p.NS, err)
	}
	return nil
}

// filterChains adds table t with an input and an output filter chain.
func filterChains(conn *nftables.Conn, t *nftables.Table) (in, out *nftables.Chain) {
	conn.AddTable(t)
	in = conn.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter})
	out = conn.AddChain(&nftables.Chain{Name: "output", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter})
	return in, out
}

func drop() []expr.Any { return []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}} }

// addrMatch matches IPv4 or IPv6 packets whose source (src) or destination
// address is a.
func addrMatch(a netip.Addr, src bool) []expr.Any {
	proto, off := byte(unix.NFPROTO_IPV4), uint32(16)
	if src {
		off = 12
	}
	if a.Is6() {
		proto, off = unix.NFPROTO_IPV6, 24
		if src {
			off = 8
		}
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: uint32(a.BitLen() / 8)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a.AsSlice()},
	}
}

// CutOffControlPlane cuts Node n off from the control plane (the API
// server and the controller, both at BridgeV4 / BridgeV6): every IP packet
// from or to those addresses is dropped in n's namespace. The Node still
// reaches the other Nodes and the client, and still answers ARP.
func (c *Cluster) CutOffControlPlane(n *Node) (*Partition, error) {
	conn, done, err := nftConn(n.Name)
	if err != nil {
		return nil, err
	}
	defer done()
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: partitionTable}
	in, out := filterChains(conn, t)
	for _, a := range []netip.Addr{BridgeV4, BridgeV6} {
		conn.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: slices.Concat(addrMatch(a, true), drop())})
		conn.AddRule(&nftables.Rule{Table: t, Chain: out, Exprs: slices.Concat(addrMatch(a, false), drop())})
	}
	if err := conn.Flush(); err != nil {
		return nil, fmt.Errorf("cut %s off the control plane: %w", n.Name, err)
	}
	return &Partition{NS: n.Name, tables: []*nftables.Table{t}}, nil
}

// Isolate cuts Node n off from everything: every IP packet and every ARP
// packet in or out of its eth0 is dropped (the link stays up and the
// addresses stay where the agent leaves them, so the test can see what
// the agent does).
func (c *Cluster) Isolate(n *Node) (*Partition, error) {
	// The bridge side of n's veth pair leaves br0: n's eth0 stays up, with
	// its addresses and routes, but no frame reaches or leaves it (ARP
	// included). nftables' arp family would do the same inside n's
	// namespace, but this kernel has no nf_tables_arp ("operation not
	// supported").
	i := slices.Index(c.Nodes, n)
	if i < 0 {
		return nil, fmt.Errorf("isolate: %s is not a Node of this cluster", n.Name)
	}
	port := fmt.Sprintf("veth%d", i+1)
	if err := run("ip", "link", "set", port, "nomaster"); err != nil {
		return nil, fmt.Errorf("isolate %s: %w", n.Name, err)
	}
	return &Partition{NS: n.Name, bridgePort: port}, nil
}

// APIServerOutage makes the API server unreachable for everyone (the
// agents and the controller): in the control-plane namespace, where it
// runs, every TCP packet to or from its port is dropped. etcd and the
// controller's webhook keep running.
func (c *Cluster) APIServerOutage() (*Partition, error) {
	u, err := url.Parse(c.Env.Config.Host)
	if err != nil {
		return nil, fmt.Errorf("API server address %q: %w", c.Env.Config.Host, err)
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		return nil, fmt.Errorf("API server port in %q: %w", c.Env.Config.Host, err)
	}
	conn, done, err := nftConn("")
	if err != nil {
		return nil, err
	}
	defer done()
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: partitionTable}
	in, out := filterChains(conn, t)
	pb := []byte{byte(port >> 8), byte(port)}
	tcpPort := func(off uint32) []expr.Any {
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: off, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: pb},
		}
	}
	conn.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: slices.Concat(tcpPort(2), drop())})  // to the API server
	conn.AddRule(&nftables.Rule{Table: t, Chain: out, Exprs: slices.Concat(tcpPort(0), drop())}) // from it
	if err := conn.Flush(); err != nil {
		return nil, fmt.Errorf("API-server outage: %w", err)
	}
	return &Partition{tables: []*nftables.Table{t}}, nil
}

// HasAddress reports whether ip is bound on any interface of Node n's
// namespace (read through netlink, whatever the agent reports).
func (c *Cluster) HasAddress(n *Node, ip netip.Addr) (bool, error) {
	h, err := netns.GetFromName(n.Name)
	if err != nil {
		return false, fmt.Errorf("open namespace %s: %w", n.Name, err)
	}
	defer func() { _ = h.Close() }()
	nh, err := netlink.NewHandleAt(h)
	if err != nil {
		return false, fmt.Errorf("netlink in %s: %w", n.Name, err)
	}
	defer nh.Close()
	fam := netlink.FAMILY_V4
	if ip.Is6() {
		fam = netlink.FAMILY_V6
	}
	addrs, err := nh.AddrList(nil, fam)
	if err != nil {
		return false, fmt.Errorf("list addresses of %s: %w", n.Name, err)
	}
	for _, a := range addrs {
		if got, ok := netip.AddrFromSlice(a.IP); ok && got.Unmap() == ip {
			return true, nil
		}
	}
	return false, nil
}

// ControllerRunning reports whether the controller process started by
// StartController is still running (it exits when it loses its leader
// Lease, as during a long API-server outage; a Deployment would restart
// it).
func (c *Cluster) ControllerRunning() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.controllerDone == nil {
		return false
	}
	select {
	case <-c.controllerDone:
		return false
	default:
		return true
	}
}

// RestartControllerIfExited starts the controller again when its process
// has exited (as the Deployment's restart would) and reports whether it
// did.
func (c *Cluster) RestartControllerIfExited() (bool, error) {
	if c.ControllerRunning() {
		return false, nil
	}
	c.StopController() // reaps the exited process
	return true, c.StartController()
}
