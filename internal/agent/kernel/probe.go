package kernel

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	mdnetlink "github.com/mdlayher/netlink"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Prober probes one feature: nil when the kernel has it, else an error
// saying what the kernel answered. Tests replace it to inject a missing
// feature.
type Prober interface {
	Probe(f Feature) error
}

// ProbeAll probes each of fs with p and returns the results Decide takes.
func ProbeAll(p Prober, fs []Feature) map[Feature]error {
	res := make(map[Feature]error, len(fs))
	for _, f := range fs {
		res[f] = p.Probe(f)
	}
	return res
}

// FeaturesOf returns the features of the given parts, in Specs order.
func FeaturesOf(parts ...Part) []Feature {
	var fs []Feature
	for _, s := range Specs {
		for _, p := range parts {
			if s.Part == p {
				fs = append(fs, s.Feature)
			}
		}
	}
	return fs
}

// Release returns the running kernel's release (uname -r), or "unknown"
// when uname fails.
func Release() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown"
	}
	return unix.ByteSliceToString(u.Release[:])
}

// Options name the scratch objects the probes create and delete again.
type Options struct {
	// LinkName is the name of the scratch links (a veth pair adds "0" and
	// "1"; at most 14 bytes). Default "egxp" and 6 random hex digits, so
	// that two agents probing at once (a surge rolling update) never
	// touch each other's links. Links are created down and deleted at
	// once; one of the same name left by a crashed probe is replaced.
	LinkName string
	// RouteTable is the routing table the encap routes are tried in; no
	// policy rule points to it. Default 49998, below the datapath's tables
	// (datapath.Config.TableBase-1 and up).
	RouteTable int
	// TableName is the nftables table (family inet) the nftables probes
	// create and delete in one batch; default "egressip-probe".
	TableName string
}

func (o Options) withDefaults() Options {
	if o.LinkName == "" {
		b := make([]byte, 3)
		_, _ = rand.Read(b) // crypto/rand.Read does not fail (Go 1.24+)
		o.LinkName = "egxp" + hex.EncodeToString(b)
	}
	if o.RouteTable == 0 {
		o.RouteTable = 49998
	}
	if o.TableName == "" {
		o.TableName = "egressip-probe"
	}
	return o
}

// NetNSProber probes the real kernel in one network namespace. Each probe
// creates what it tests and deletes it again: links are never brought up,
// routes go to a table no rule reaches, nftables objects are added and
// deleted in the same batch, sysctls are written with their current value.
type NetNSProber struct {
	ns   netns.NsHandle
	opts Options
}

// NewProber returns a prober for the namespace ns (netns.None(): the
// current one). The handle must stay open while the prober is used.
func NewProber(ns netns.NsHandle, o Options) *NetNSProber {
	return &NetNSProber{ns: ns, opts: o.withDefaults()}
}

// Probe implements Prober. Features outside Specs, and NFQueue (probed by
// the datapath), return an error.
func (p *NetNSProber) Probe(f Feature) error {
	switch f {
	case VXLANGPE:
		// The kernel allows one flow-based VXLAN device per UDP port
		// (EEXIST otherwise), and the datapath's own device may be up on
		// 4790: the probe device takes a random port of the dynamic range
		// (RFC 6335), never bound as the device stays down, and another
		// one if a concurrent probe holds it.
		var err error
		for range 3 {
			port := uint16(49152 + mrand.IntN(16384))
			err = p.probeLinkKind("vxlan", func(data *nl.RtAttr) {
				data.AddRtAttr(unix.IFLA_VXLAN_COLLECT_METADATA, []byte{1})
				data.AddRtAttr(nl.IFLA_VXLAN_LEARNING, []byte{0})
				data.AddRtAttr(unix.IFLA_VXLAN_PORT, htons(port))
				data.AddRtAttr(unix.IFLA_VXLAN_GPE, nil)
			})
			if !errors.Is(err, unix.EEXIST) {
				return err
			}
		}
		return err
	case EncapRouteIPv4:
		return p.probeEncapRoute(net.IPv4(192, 0, 2, 255), net.IPv4(192, 0, 2, 254))
	case EncapRouteIPv6:
		return p.probeEncapRoute(net.ParseIP("2001:db8::ff:ff"), net.ParseIP("2001:db8::ff:fe"))
	case NftInetNAT:
		return p.probeNft(func(c *nftables.Conn, t *nftables.Table) {
			ch := c.AddChain(&nftables.Chain{Name: "nat", Table: t, Type: nftables.ChainTypeNAT,
				Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: append(never(), &expr.Masq{})})
		})
	case NftNamedCounter:
		return p.probeNft(func(c *nftables.Conn, t *nftables.Table) {
			const name = "probe"
			c.AddObj(&nftables.CounterObj{Table: t, Name: name})
			ch := c.AddChain(&nftables.Chain{Name: name, Table: t})
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
				&expr.Objref{Type: int(nftables.ObjTypeCounter), Name: name}}})
		})
	case NftTCPMSS:
		return p.probeNft(func(c *nftables.Conn, t *nftables.Table) {
			// A base chain: the kernel checks the rt expression's hook there.
			ch := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
				Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter})
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: append(never(),
				&expr.Rt{Register: 1, Key: expr.RtTCPMSS},
				&expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Len: 2, Size: 2},
				&expr.Exthdr{SourceRegister: 1, Op: expr.ExthdrOpTcpopt, Type: 2, Offset: 2, Len: 2})})
		})
	case NftSets:
		return p.probeNft(func(c *nftables.Conn, t *nftables.Table) {
			// Explicit batch-local IDs: google/nftables allocates missing
			// ones from a package counter without a lock.
			iv := &nftables.Set{Table: t, ID: 1, Name: "cidrs", KeyType: nftables.TypeIPAddr, Interval: true}
			_ = c.AddSet(iv, []nftables.SetElement{
				{Key: []byte{192, 0, 2, 0}}, {Key: []byte{192, 0, 2, 128}, IntervalEnd: true}})
			m := &nftables.Set{Table: t, ID: 2, Name: "marks", KeyType: nftables.TypeMark,
				KeyByteOrder: binaryutil.NativeEndian, IsMap: true, DataType: nftables.TypeIPAddr}
			_ = c.AddSet(m, []nftables.SetElement{{Key: binaryutil.NativeEndian.PutUint32(1), Val: []byte{192, 0, 2, 1}}})
		})
	case SysctlAddrGenMode:
		return p.probeSysctl("net/ipv6/conf/default/addr_gen_mode")
	case SysctlRPFilter:
		return p.probeSysctl("net/ipv4/conf/default/rp_filter")
	case IFAProto:
		return p.probeIFAProto()
	case NFQueue:
		return errors.New("probed by the datapath (datapath.Datapath.RejectQueueForm)")
	}
	return fmt.Errorf("unknown feature %q", f)
}

// never is a match no packet passes (packet mark 0xffffffff and 0 at
// once), put first in probe rules of base chains.
func never() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0xffffffff)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

func htons(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }

func (p *NetNSProber) handle() (*netlink.Handle, error) {
	var (
		h   *netlink.Handle
		err error
	)
	if p.ns.IsOpen() {
		h, err = netlink.NewHandleAt(p.ns)
	} else {
		h, err = netlink.NewHandle()
	}
	if err != nil {
		return nil, fmt.Errorf("open netlink: %w", err)
	}
	return h, nil
}

// probeLinkKind creates a link of kind with the IFLA_INFO_DATA that fill
// writes (down, named Options.LinkName) and deletes it. A stale link of
// that name (a probe that crashed) is deleted first.
func (p *NetNSProber) probeLinkKind(kind string, fill func(data *nl.RtAttr)) error {
	name := p.opts.LinkName
	err := p.inNetNS(func() error {
		if l, err := netlink.LinkByName(name); err == nil {
			_ = netlink.LinkDel(l)
		}
		req := nl.NewNetlinkRequest(unix.RTM_NEWLINK, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK)
		req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
		req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(name)))
		info := nl.NewRtAttr(unix.IFLA_LINKINFO, nil)
		info.AddRtAttr(nl.IFLA_INFO_KIND, nl.NonZeroTerminated(kind))
		if fill != nil {
			fill(info.AddRtAttr(nl.IFLA_INFO_DATA, nil))
		}
		req.AddData(info)
		if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
			return fmt.Errorf("create a %s link: %w", kind, err)
		}
		l, err := netlink.LinkByName(name)
		if err != nil {
			return fmt.Errorf("find the %s link created: %w", kind, err)
		}
		if err := netlink.LinkDel(l); err != nil {
			return fmt.Errorf("delete the %s probe link %s: %w", kind, name, err)
		}
		return nil
	})
	return err
}

// probeEncapRoute adds a route to dst with `encap ip|ip6 id 1 dst outer`
// through lo in Options.RouteTable and deletes it.
func (p *NetNSProber) probeEncapRoute(dst, outer net.IP) error {
	h, err := p.handle()
	if err != nil {
		return err
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo: %w", err)
	}
	bits := 128
	if dst.To4() != nil {
		bits = 32
	}
	r := &netlink.Route{
		LinkIndex: lo.Attrs().Index, Table: p.opts.RouteTable, Scope: netlink.SCOPE_LINK,
		Dst:   &net.IPNet{IP: dst, Mask: net.CIDRMask(bits, bits)},
		Encap: &ipEncap{dst: outer},
	}
	if err := h.RouteReplace(r); err != nil {
		return fmt.Errorf("add a route with %s: %w", r.Encap, err)
	}
	// The kernel took the route: the feature is there. ESRCH on delete
	// means another agent's probe (same route) removed it first.
	if err := h.RouteDel(r); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("delete the probe route in table %d: %w", p.opts.RouteTable, err)
	}
	return nil
}

// ipEncap is `encap ip|ip6 id 1 dst <dst>` (LWTUNNEL_ENCAP_IP or _IP6 with
// LWTUNNEL_IP_ID and LWTUNNEL_IP_DST, include/uapi/linux/lwtunnel.h).
type ipEncap struct{ dst net.IP }

const (
	lwtIPID  = 1 // LWTUNNEL_IP_ID / LWTUNNEL_IP6_ID
	lwtIPDst = 2 // LWTUNNEL_IP_DST / LWTUNNEL_IP6_DST
)

func (e *ipEncap) Type() int {
	if e.dst.To4() == nil {
		return unix.LWTUNNEL_ENCAP_IP6
	}
	return unix.LWTUNNEL_ENCAP_IP
}

func (e *ipEncap) Encode() ([]byte, error) {
	ip := e.dst.To4()
	if ip == nil {
		ip = e.dst.To16()
	}
	b := make([]byte, 0, 32)
	b = append(b, nl.NewRtAttr(lwtIPID, binary.BigEndian.AppendUint64(nil, 1)).Serialize()...)
	b = append(b, nl.NewRtAttr(lwtIPDst, ip).Serialize()...)
	return b, nil
}

func (e *ipEncap) Decode([]byte) error { return nil }

func (e *ipEncap) String() string {
	if e.Type() == unix.LWTUNNEL_ENCAP_IP6 {
		return "encap ip6 id 1 dst " + e.dst.String()
	}
	return "encap ip id 1 dst " + e.dst.String()
}

func (e *ipEncap) Equal(x netlink.Encap) bool {
	o, ok := x.(*ipEncap)
	return ok && o.dst.Equal(e.dst)
}

// probeNft adds Options.TableName (family inet), lets add fill it, and
// deletes the table in the same batch: a success leaves the ruleset as it
// was, a failure changes nothing.
func (p *NetNSProber) probeNft(add func(c *nftables.Conn, t *nftables.Table)) error {
	var opts []nftables.ConnOption
	if p.ns.IsOpen() {
		opts = append(opts, nftables.WithNetNSFd(int(p.ns)))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return fmt.Errorf("open nftables: %w", err)
	}
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: p.opts.TableName})
	add(c, t)
	c.DelTable(t)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables rejected it: %w", err)
	}
	return nil
}

// probeSysctl reads /proc/sys/<key> and writes the value back unchanged.
func (p *NetNSProber) probeSysctl(key string) error {
	return p.inNetNS(func() error {
		path := filepath.Join("/proc/sys", key)
		v, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("read %s: %w", strings.ReplaceAll(key, "/", "."), err)
		}
		if err := os.WriteFile(path, bytes.TrimSpace(v), 0o644); err != nil {
			return fmt.Errorf("write %s: %w", strings.ReplaceAll(key, "/", "."), err)
		}
		return nil
	})
}

// ifaProto is IFA_PROTO (include/uapi/linux/if_addr.h).
const ifaProto = 11

// probeIFAProto creates a veth pair (down), adds 192.0.2.254/32 with
// IFA_PROTO 0x45 to one end, reads it back and deletes the pair. It fails
// when the kernel returns the address without the attribute.
func (p *NetNSProber) probeIFAProto() error {
	name, peer := p.opts.LinkName+"0", p.opts.LinkName+"1"
	h, err := p.handle()
	if err != nil {
		return err
	}
	defer h.Close()
	if l, err := h.LinkByName(name); err == nil {
		_ = h.LinkDel(l)
	}
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer}); err != nil {
		return fmt.Errorf("create a veth pair to hold the probe address: %w", err)
	}
	l, err := h.LinkByName(name)
	if err != nil {
		_ = h.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}})
		return fmt.Errorf("find the probe veth: %w", err)
	}
	defer func() { _ = h.LinkDel(l) }()
	idx := uint32(l.Attrs().Index)

	var cfg mdnetlink.Config
	if p.ns.IsOpen() {
		cfg.NetNS = int(p.ns)
	}
	c, err := mdnetlink.Dial(unix.NETLINK_ROUTE, &cfg)
	if err != nil {
		return fmt.Errorf("open rtnetlink: %w", err)
	}
	defer func() { _ = c.Close() }()
	const proto = 0x45
	ip := []byte{192, 0, 2, 254}
	ae := mdnetlink.NewAttributeEncoder()
	ae.Bytes(unix.IFA_LOCAL, ip)
	ae.Bytes(unix.IFA_ADDRESS, ip)
	ae.Uint8(ifaProto, proto)
	attrs, err := ae.Encode()
	if err != nil {
		return fmt.Errorf("encode the probe address: %w", err)
	}
	msg := ifaddrmsg(unix.AF_INET, 32, idx)
	if _, err := c.Execute(mdnetlink.Message{
		Header: mdnetlink.Header{Type: unix.RTM_NEWADDR, Flags: mdnetlink.Request | mdnetlink.Acknowledge | mdnetlink.Create | mdnetlink.Excl},
		Data:   append(msg, attrs...),
	}); err != nil {
		return fmt.Errorf("add the probe address: %w", err)
	}
	msgs, err := c.Execute(mdnetlink.Message{
		Header: mdnetlink.Header{Type: unix.RTM_GETADDR, Flags: mdnetlink.Request | mdnetlink.Dump},
		Data:   ifaddrmsg(unix.AF_INET, 0, 0),
	})
	if err != nil {
		return fmt.Errorf("dump addresses: %w", err)
	}
	for _, m := range msgs {
		if len(m.Data) < unix.SizeofIfAddrmsg || binary.NativeEndian.Uint32(m.Data[4:8]) != idx {
			continue
		}
		ad, err := mdnetlink.NewAttributeDecoder(m.Data[unix.SizeofIfAddrmsg:])
		if err != nil {
			return fmt.Errorf("decode an address: %w", err)
		}
		got := -1
		for ad.Next() {
			if ad.Type() == ifaProto {
				got = int(ad.Uint8())
			}
		}
		if got == proto {
			return nil
		}
		return errors.New("the kernel returned the address without IFA_PROTO")
	}
	return errors.New("the probe address was not found after it was added")
}

// ifaddrmsg is struct ifaddrmsg (include/uapi/linux/if_addr.h).
func ifaddrmsg(family uint8, prefixLen uint8, index uint32) []byte {
	b := []byte{family, prefixLen, 0, unix.RT_SCOPE_UNIVERSE}
	return binary.NativeEndian.AppendUint32(b, index)
}

// inNetNS runs fn on a thread in the prober's namespace (the current one
// when it has none). The thread is left locked, so the runtime ends it.
func (p *NetNSProber) inNetNS(fn func() error) error {
	if !p.ns.IsOpen() {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := netns.Set(p.ns); err != nil {
			errc <- fmt.Errorf("enter network namespace: %w", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}
