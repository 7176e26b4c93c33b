package harness

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/egressip/egressip/internal/agent/datapath"
	"github.com/egressip/egressip/internal/testutil/netnstest"
	dp "github.com/egressip/egressip/test/datapath"
)

// Addresses of the stand-in Pods, Services and the external server
// (documentation ranges, RFC 5737 and RFC 3849). Node i's Pod CIDRs are
// 203.0.113.16i/28 and 2001:db8:1:i::/64; Pod j of Node i has
// 203.0.113.(16i+j) and 2001:db8:1:i::j. PodRangeV4 holds the Pod CIDRs of
// all 9 Nodes a cluster may have (up to 203.0.113.159); it also spans the
// Service range, which is harmless: both are cluster addresses.
var (
	ExtV4          = netip.MustParseAddr("192.0.2.60")
	ExtV6          = netip.MustParseAddr("2001:db8::60")
	PodRangeV4     = netip.MustParsePrefix("203.0.113.0/24")
	PodRangeV6     = netip.MustParsePrefix("2001:db8:1::/48")
	ServiceRangeV4 = netip.MustParsePrefix("203.0.113.240/28")
	ServiceRangeV6 = netip.MustParsePrefix("2001:db8:2::/64")
)

// PodTemplate is a Pod the harness runs on every Node: a network namespace
// behind the Node (veth, /32 and /128, default route to the Node) and the
// matching Pod object, with its status written as a kubelet would.
type PodTemplate struct {
	// Namespace is the Kubernetes namespace, created with NamespaceLabels
	// if missing.
	Namespace       string
	NamespaceLabels map[string]string
	// Name is suffixed with the Node's index ("web" -> "web-n1").
	Name   string
	Labels map[string]string
}

// Pod is one running stand-in Pod.
type Pod struct {
	Name, Namespace string
	Node            *Node
	IPv4, IPv6      netip.Addr
	ns              *dp.NS
}

// String is namespace/name@node.
func (p *Pod) String() string { return p.Namespace + "/" + p.Name + "@" + p.Node.Name }

func (n *Node) index() int {
	for i := len(n.Name) - 1; i >= 0; i-- {
		if n.Name[i] == 'n' {
			var k int
			_, _ = fmt.Sscanf(n.Name[i+1:], "%d", &k)
			return k
		}
	}
	return 0
}

// PodCIDRs returns Node n's Pod CIDRs.
func (n *Node) PodCIDRs() (netip.Prefix, netip.Prefix) {
	i := n.index()
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{203, 0, 113, byte(16 * i)}), 28),
		netip.MustParsePrefix(fmt.Sprintf("2001:db8:1:%d::/64", i))
}

// setupPods sets up the stand-in CNI on every Node (routes to the other Nodes'
// Pod CIDRs, masquerade of Pod traffic leaving the Pod range) and the Pods
// of c.Config.Pods, and starts the external server.
func (c *Cluster) setupPods(ctx context.Context) error {
	ext := c.Config.Prefix + "-ext"
	if _, err := c.host(ext, "vethx", ExtV4, ExtV6); err != nil {
		return err
	}
	var err error
	if c.extNS, err = netnstest.Open(ext); err != nil {
		return err
	}
	if c.Ext, err = dp.StartServer(c.extNS); err != nil {
		return err
	}
	for _, n := range c.Nodes {
		// A Node forwards its Pods' traffic (the CNI's job on a real Node).
		for _, kv := range []string{"net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"} {
			if err := run("ip", "netns", "exec", n.Name, "sysctl", "-qw", kv); err != nil {
				return err
			}
		}
		for _, m := range c.Nodes {
			if m == n {
				continue
			}
			v4, v6 := m.PodCIDRs()
			if err := inNS(n.Name, "route", "add", v4.String(), "via", m.IPv4.String()); err != nil {
				return err
			}
			if err := inNS(n.Name, "-6", "route", "add", v6.String(), "via", m.IPv6.String()); err != nil {
				return err
			}
		}
		if err := masquerade(n.Name); err != nil {
			return err
		}
		for j, tpl := range c.Config.Pods {
			p, err := c.addPod(ctx, n, j+1, tpl)
			if err != nil {
				return err
			}
			c.Pods = append(c.Pods, p)
		}
	}
	return nil
}

func (c *Cluster) addPod(ctx context.Context, n *Node, j int, tpl PodTemplate) (*Pod, error) {
	v4, v6 := n.PodCIDRs()
	p := &Pod{Name: fmt.Sprintf("%s-n%d", tpl.Name, n.index()), Namespace: tpl.Namespace, Node: n,
		IPv4: netip.AddrFrom4([4]byte{203, 0, 113, v4.Addr().As4()[3] + byte(j)}),
		IPv6: netip.MustParseAddr(fmt.Sprintf("%s%d", v6.Addr().String(), j)),
	}
	name := fmt.Sprintf("%s-p%d", n.Name, j)
	veth := fmt.Sprintf("vp%d", j)
	if err := netnstest.Add(name); err != nil {
		return nil, err
	}
	if err := netnstest.Veth(n.Name, veth, name, "eth0"); err != nil {
		return nil, err
	}
	steps := [][]string{
		{"ip", "-n", n.Name, "addr", "add", "fe80::1/64", "dev", veth, "nodad"},
		{"ip", "-n", n.Name, "link", "set", veth, "up"},
		{"ip", "-n", n.Name, "route", "add", p.IPv4.String() + "/32", "dev", veth},
		{"ip", "-n", n.Name, "-6", "route", "add", p.IPv6.String() + "/128", "dev", veth},
		{"ip", "netns", "exec", n.Name, "sysctl", "-qw", "net.ipv4.conf." + veth + ".proxy_arp=1"},
		// Answer the Pod's ARP for its gateway at once: the kernel delays
		// proxy ARP replies by up to proxy_delay (0.8 s by default), which
		// made each fresh Pod's first connection take ~0.4 s.
		{"ip", "netns", "exec", n.Name, "sysctl", "-qw", "net.ipv4.neigh." + veth + ".proxy_delay=0"},
		{"ip", "-n", name, "link", "set", "lo", "up"},
		{"ip", "-n", name, "addr", "add", p.IPv4.String() + "/32", "dev", "eth0"},
		{"ip", "-n", name, "addr", "add", p.IPv6.String() + "/128", "dev", "eth0", "nodad"},
		{"ip", "-n", name, "link", "set", "eth0", "up"},
		{"ip", "-n", name, "route", "add", "169.254.1.1", "dev", "eth0", "scope", "link"},
		{"ip", "-n", name, "route", "add", "default", "via", "169.254.1.1", "dev", "eth0"},
		{"ip", "-n", name, "-6", "route", "add", "default", "via", "fe80::1", "dev", "eth0"},
	}
	for _, s := range steps {
		if err := run(s[0], s[1:]...); err != nil {
			return nil, err
		}
	}
	var err error
	if p.ns, err = netnstest.Open(name); err != nil {
		return nil, err
	}

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tpl.Namespace, Labels: tpl.NamespaceLabels}}
	if err := c.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create namespace %s: %w", tpl.Namespace, err)
	}
	obj := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, Labels: tpl.Labels},
		Spec: corev1.PodSpec{NodeName: n.Name, Containers: []corev1.Container{{Name: "app", Image: "registry.invalid/app"}}}}
	if err := c.Client.Create(ctx, obj); err != nil {
		return nil, fmt.Errorf("create Pod %s: %w", p, err)
	}
	obj.Status = corev1.PodStatus{Phase: corev1.PodRunning,
		PodIP: p.IPv4.String(), PodIPs: []corev1.PodIP{{IP: p.IPv4.String()}, {IP: p.IPv6.String()}},
		HostIP: n.IPv4.String(), HostIPs: []corev1.HostIP{{IP: n.IPv4.String()}, {IP: n.IPv6.String()}}}
	if err := c.Client.Status().Update(ctx, obj); err != nil {
		return nil, fmt.Errorf("set status of Pod %s: %w", p, err)
	}
	return p, nil
}

// masquerade installs the stand-in CNI's table "inet cni" in Node
// namespace node: Pod traffic leaving eth0 for a destination outside the
// Pod range is masqueraded (srcnat, priority 100), as flannel or Calico do.
func masquerade(node string) error {
	h, err := netns.GetFromName(node)
	if err != nil {
		return fmt.Errorf("open %s: %w", node, err)
	}
	defer func() { _ = h.Close() }()
	conn, err := nftables.New(nftables.WithNetNSFd(int(h)))
	if err != nil {
		return err
	}
	t := conn.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "cni"})
	post := conn.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	name := make([]byte, unix.IFNAMSIZ)
	copy(name, "eth0")
	match := func(off, n uint32, p netip.Prefix, op expr.CmpOp) []expr.Any {
		return []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: n, Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen()), Xor: make([]byte, n)},
			&expr.Cmp{Op: op, Register: 1, Data: p.Addr().AsSlice()},
		}
	}
	for _, f := range []struct {
		proto        byte
		saddr, daddr uint32
		n            uint32
		pods         netip.Prefix
	}{{unix.NFPROTO_IPV4, 12, 16, 4, PodRangeV4}, {unix.NFPROTO_IPV6, 8, 24, 16, PodRangeV6}} {
		r := slices.Concat([]expr.Any{
			&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: name},
			&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{f.proto}},
		},
			match(f.saddr, f.n, f.pods, expr.CmpOpEq),
			match(f.daddr, f.n, f.pods, expr.CmpOpNeq),
			[]expr.Any{&expr.Counter{}, &expr.Masq{}})
		conn.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: r})
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("stand-in CNI table on %s: %w", node, err)
	}
	return nil
}

// Who connects from Pod p to the external server over TCP (IPv6 when v6)
// and returns the source address the server saw.
func (c *Cluster) Who(ctx context.Context, p *Pod, v6 bool) (netip.Addr, error) {
	dst := ExtV4
	if v6 {
		dst = ExtV6
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	a, err := dp.TCPWho(ctx, p.ns, dst)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%s -> %s: %w", p, dst, err)
	}
	return a.Unmap(), nil
}

// PodsIn returns the Pods of Kubernetes namespace ns, by Node order.
func (c *Cluster) PodsIn(ns string) []*Pod {
	return slices.DeleteFunc(slices.Clone(c.Pods), func(p *Pod) bool { return p.Namespace != ns })
}

// DatapathDump renders the datapath nftables table of Node n (see
// datapath.Dump), for test failure reports. It opens the engine read-only:
// New changes nothing.
func (c *Cluster) DatapathDump(ctx context.Context, n *Node) (string, error) {
	h, err := netns.GetFromName(n.Name)
	if err != nil {
		return "", err
	}
	defer func() { _ = h.Close() }()
	cfg := datapath.DefaultConfig()
	cfg.Uplink = "eth0"
	d, err := datapath.New(cfg, h)
	if err != nil {
		return "", err
	}
	defer func() { _ = d.Close() }()
	return d.Dump(ctx)
}
