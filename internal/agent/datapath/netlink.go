package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Lightweight-tunnel attributes (include/uapi/linux/lwtunnel.h); the IPv6
// ones share the numbers (LWTUNNEL_IP6_*).
const (
	lwtIPID    = 1 // u64, big endian: the tunnel ID (VNI)
	lwtIPDst   = 2 // outer destination address
	lwtIPTTL   = 4 // u8: TTL / hop limit
	lwtIPFlags = 6 // be16: TUNNEL_* flags

	// tunnelCsum is TUNNEL_CSUM (include/uapi/linux/if_tunnel.h): compute
	// the outer UDP checksum. IPv6 receivers drop zero UDP checksums
	// (RFC 8200 section 8.1), so it is always set.
	tunnelCsum = 0x0001
	// tunnelID is the VXLAN network identifier used by every route; the
	// flow-based receiver accepts any.
	tunnelID = 1
	// tunnelTTL is the outer TTL / hop limit.
	tunnelTTL = 64
)

// ipEncap is the `encap ip|ip6 id 1 dst X ttl 64 csum` of a route
// (LWTUNNEL_ENCAP_IP or LWTUNNEL_ENCAP_IP6), implementing netlink.Encap.
// vishvananda/netlink has no IPv4 variant, and its IPv6 one writes ID 0 and
// drops the flags.
type ipEncap struct {
	ID    uint64
	Dst   netip.Addr
	TTL   uint8
	Flags uint16
}

var _ netlink.Encap = (*ipEncap)(nil)

func (e *ipEncap) Type() int {
	if e.Dst.Is6() {
		return unix.LWTUNNEL_ENCAP_IP6
	}
	return unix.LWTUNNEL_ENCAP_IP
}

func (e *ipEncap) Encode() ([]byte, error) {
	if !e.Dst.IsValid() {
		return nil, errors.New("encap: no destination")
	}
	var out []byte
	attr := func(typ uint16, v []byte) {
		a := nl.NewRtAttr(int(typ), v)
		out = append(out, a.Serialize()...)
	}
	attr(lwtIPID, binary.BigEndian.AppendUint64(nil, e.ID))
	attr(lwtIPDst, e.Dst.AsSlice())
	attr(lwtIPTTL, []byte{e.TTL})
	attr(lwtIPFlags, binary.BigEndian.AppendUint16(nil, e.Flags))
	return out, nil
}

func (e *ipEncap) Decode(b []byte) error {
	attrs, err := nl.ParseRouteAttr(b)
	if err != nil {
		return fmt.Errorf("decode ip encap: %w", err)
	}
	for _, a := range attrs {
		switch a.Attr.Type {
		case lwtIPID:
			if len(a.Value) == 8 {
				e.ID = binary.BigEndian.Uint64(a.Value)
			}
		case lwtIPDst:
			e.Dst, _ = netip.AddrFromSlice(a.Value)
		case lwtIPTTL:
			if len(a.Value) > 0 {
				e.TTL = a.Value[0]
			}
		case lwtIPFlags:
			if len(a.Value) == 2 {
				e.Flags = binary.BigEndian.Uint16(a.Value)
			}
		}
	}
	return nil
}

func (e *ipEncap) String() string {
	return fmt.Sprintf("id %d dst %s ttl %d flags %#04x", e.ID, e.Dst, e.TTL, e.Flags)
}

func (e *ipEncap) Equal(x netlink.Encap) bool {
	o, ok := x.(*ipEncap)
	return ok && *e == *o
}

// inNetNS runs fn on a locked OS thread switched into ns (netns.None():
// the current namespace). The thread is discarded afterwards.
func inNetNS(ns netns.NsHandle, fn func() error) error {
	if !ns.IsOpen() {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: the runtime ends a thread left locked.
		if err := netns.Set(ns); err != nil {
			errc <- fmt.Errorf("enter network namespace: %w", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// addGPEDevice creates a flow-based ("external") VXLAN-GPE device, which
// vishvananda/netlink cannot (no IFLA_VXLAN_GPE): an RTM_NEWLINK of kind
// vxlan with IFLA_VXLAN_COLLECT_METADATA, IFLA_VXLAN_PORT and the
// IFLA_VXLAN_GPE flag (include/uapi/linux/if_link.h). It must run in the
// target namespace.
func addGPEDevice(name string, port uint16, mtu int) error {
	req := nl.NewNetlinkRequest(unix.RTM_NEWLINK, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK)
	req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
	req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(name)))
	req.AddData(nl.NewRtAttr(unix.IFLA_MTU, nl.Uint32Attr(uint32(mtu))))
	info := nl.NewRtAttr(unix.IFLA_LINKINFO, nil)
	info.AddRtAttr(nl.IFLA_INFO_KIND, nl.NonZeroTerminated("vxlan"))
	data := info.AddRtAttr(nl.IFLA_INFO_DATA, nil)
	data.AddRtAttr(unix.IFLA_VXLAN_COLLECT_METADATA, []byte{1})
	data.AddRtAttr(nl.IFLA_VXLAN_LEARNING, []byte{0})
	data.AddRtAttr(nl.IFLA_VXLAN_PORT, binary.BigEndian.AppendUint16(nil, port))
	data.AddRtAttr(unix.IFLA_VXLAN_GPE, nil)
	req.AddData(info)
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
		return fmt.Errorf("create VXLAN-GPE device %s: %w", name, err)
	}
	return nil
}

// writeSysctl writes /proc/sys/<key>; it must run in the target namespace.
func writeSysctl(key, value string) error {
	if err := os.WriteFile(filepath.Join("/proc/sys", key), []byte(value), 0o644); err != nil {
		return fmt.Errorf("sysctl %s=%s: %w", key, value, err)
	}
	return nil
}

// prefixNet converts a prefix for netlink.
func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
