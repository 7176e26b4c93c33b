package bind

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Netlink attribute and devconf numbers that golang.org/x/sys/unix does not
// (yet) name. Both are stable kernel UAPI.
const (
	// ifaProto is IFA_PROTO from include/uapi/linux/if_addr.h (Linux 5.18+,
	// commit 47f0bd503210): a u8 recording which protocol/daemon installed
	// an address. Older kernels ignore it (beyond their IFA_MAX).
	ifaProto = 11
	// ipv4DevconfPromoteSecondaries is IPV4_DEVCONF_PROMOTE_SECONDARIES from
	// include/uapi/linux/ip.h, the index used inside IFLA_INET_CONF.
	ipv4DevconfPromoteSecondaries = 20
)

// kernelAddr is one address as the kernel reports it, including the fields
// vishvananda/netlink v1.3.1 does not decode (IFA_PROTO).
type kernelAddr struct {
	Addr      netip.Addr
	PrefixLen int
	LinkIndex int
	Flags     uint32 // IFA_FLAGS when present, else ifaddrmsg.ifa_flags
	Scope     uint8
	Proto     uint8 // IFA_PROTO, 0 when absent
	Label     string
	// Lifetime, when sending, is the valid lifetime in seconds (0:
	// forever). When dumped, Valid and Preferred are the remaining
	// lifetimes the kernel reports in IFA_CACHEINFO (infiniteLifetime:
	// forever).
	Lifetime         uint32
	Valid, Preferred uint32
}

// infiniteLifetime is INFINITY_LIFE_TIME (include/net/addrconf.h): a
// lifetime that never expires.
const infiniteLifetime = 0xffffffff

// rtnl speaks the few rtnetlink messages the Binder needs at the byte level:
// address add/delete/dump with IFA_PROTO, and the IPv4 devconf of a link.
// It owns one NETLINK_ROUTE socket opened in the Binder's network namespace.
type rtnl struct {
	sockets map[int]*nl.SocketHandle
}

func newRTNL(ns netns.NsHandle) (*rtnl, error) {
	s, err := nl.GetNetlinkSocketAt(ns, netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("open rtnetlink socket: %w", err)
	}
	// Extended acks give kernel error strings ("Invalid prefix length" ...).
	_ = s.SetExtAck(true)
	return &rtnl{sockets: map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: {Socket: s}}}, nil
}

func (r *rtnl) Close() {
	for _, sh := range r.sockets {
		sh.Close()
	}
}

func (r *rtnl) request(typ, flags int) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(typ, flags)
	req.Sockets = r.sockets
	return req
}

func familyOf(ip netip.Addr) int {
	if ip.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// addrMsg builds an RTM_NEWADDR/RTM_DELADDR body for a host address.
func addrMsg(req *nl.NetlinkRequest, a kernelAddr) {
	msg := nl.NewIfAddrmsg(familyOf(a.Addr))
	msg.Prefixlen = uint8(a.PrefixLen)
	msg.Flags = uint8(a.Flags & 0xff)
	msg.Scope = a.Scope
	msg.Index = uint32(a.LinkIndex)
	req.AddData(msg)
	raw := a.Addr.AsSlice()
	req.AddData(nl.NewRtAttr(unix.IFA_LOCAL, raw))
	req.AddData(nl.NewRtAttr(unix.IFA_ADDRESS, raw))
}

// addAddr creates the address exclusively (NLM_F_EXCL): an existing identical
// address makes it fail with EEXIST instead of being silently "adopted".
func (r *rtnl) addAddr(a kernelAddr) error {
	return r.newAddr(a, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK)
}

// replaceAddr updates an existing address in place (NLM_F_REPLACE, no
// NLM_F_CREATE: it fails with ENOENT/EADDRNOTAVAIL rather than create one).
func (r *rtnl) replaceAddr(a kernelAddr) error {
	return r.newAddr(a, unix.NLM_F_REPLACE|unix.NLM_F_ACK)
}

func (r *rtnl) newAddr(a kernelAddr, flags int) error {
	req := r.request(unix.RTM_NEWADDR, flags)
	addrMsg(req, a)
	req.AddData(nl.NewRtAttr(unix.IFA_FLAGS, nl.Uint32Attr(a.Flags)))
	if a.Proto != 0 {
		req.AddData(nl.NewRtAttr(ifaProto, nl.Uint8Attr(a.Proto)))
	}
	valid := uint32(infiniteLifetime)
	if a.Lifetime != 0 {
		valid = a.Lifetime
	}
	switch {
	case a.Addr.Is6():
		// Preferred lifetime 0: a deprecated address, which source
		// address selection avoids (RFC 6724, rule 3). Otherwise the /128
		// would beat the Node's own /64 on longest matching prefix (rule
		// 8; Linux caps the match at the address's prefix length) and the
		// Node's, and its masqueraded Pods', traffic to the subnet would
		// leave with the egress IP. It still answers Neighbor
		// Solicitations and works as an explicit (SNAT) source.
		ci := nl.IfaCacheInfo{IfaCacheinfo: unix.IfaCacheinfo{Prefered: 0, Valid: valid}} //nolint:misspell // x/sys/unix spells the field so
		req.AddData(nl.NewRtAttr(unix.IFA_CACHEINFO, ci.Serialize()))
	case a.Lifetime != 0:
		// IPv4 has no use for deprecation here (the scope keeps the
		// address out of source selection, see egressScope): preferred
		// as long as valid, which the kernel requires to be at most
		// valid (rtm_to_ifaddr).
		ci := nl.IfaCacheInfo{IfaCacheinfo: unix.IfaCacheinfo{Prefered: valid, Valid: valid}} //nolint:misspell // x/sys/unix spells the field so
		req.AddData(nl.NewRtAttr(unix.IFA_CACHEINFO, ci.Serialize()))
	}
	_, err := req.Execute(unix.NETLINK_ROUTE, 0)
	return err
}

func (r *rtnl) delAddr(a kernelAddr) error {
	req := r.request(unix.RTM_DELADDR, unix.NLM_F_ACK)
	addrMsg(req, a)
	_, err := req.Execute(unix.NETLINK_ROUTE, 0)
	return err
}

// listAddrs dumps the addresses of one family (AF_INET, AF_INET6) or both
// (AF_UNSPEC). An interrupted dump is retried a few times.
func (r *rtnl) listAddrs(family int) ([]kernelAddr, error) {
	var lastErr error
	for range 5 {
		req := r.request(unix.RTM_GETADDR, unix.NLM_F_DUMP)
		req.AddData(nl.NewIfAddrmsg(family))
		msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWADDR)
		if errors.Is(err, netlink.ErrDumpInterrupted) {
			lastErr = err
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("dump addresses: %w", err)
		}
		out := make([]kernelAddr, 0, len(msgs))
		for _, m := range msgs {
			a, ok, err := parseAddrMsg(m)
			if err != nil {
				return nil, fmt.Errorf("dump addresses: %w", err)
			}
			if ok && (family == unix.AF_UNSPEC || familyOf(a.Addr) == family) {
				out = append(out, a)
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("dump addresses: %w", lastErr)
}

func parseAddrMsg(m []byte) (kernelAddr, bool, error) {
	if len(m) < unix.SizeofIfAddrmsg {
		return kernelAddr{}, false, fmt.Errorf("short ifaddrmsg (%d bytes)", len(m))
	}
	msg := nl.DeserializeIfAddrmsg(m)
	if msg.Family != unix.AF_INET && msg.Family != unix.AF_INET6 {
		return kernelAddr{}, false, nil
	}
	attrs, err := nl.ParseRouteAttr(m[unix.SizeofIfAddrmsg:])
	if err != nil {
		return kernelAddr{}, false, err
	}
	a := kernelAddr{
		PrefixLen: int(msg.Prefixlen),
		LinkIndex: int(msg.Index),
		Flags:     uint32(msg.Flags),
		Scope:     msg.Scope,
		Valid:     infiniteLifetime,
		Preferred: infiniteLifetime,
	}
	var local, address []byte
	for _, attr := range attrs {
		switch attr.Attr.Type {
		case unix.IFA_LOCAL:
			local = attr.Value
		case unix.IFA_ADDRESS:
			address = attr.Value
		case unix.IFA_FLAGS:
			if len(attr.Value) >= 4 {
				a.Flags = nl.NativeEndian().Uint32(attr.Value[:4])
			}
		case ifaProto:
			if len(attr.Value) >= 1 {
				a.Proto = attr.Value[0]
			}
		case unix.IFA_LABEL:
			a.Label = unix.ByteSliceToString(attr.Value)
		case unix.IFA_CACHEINFO:
			if len(attr.Value) >= 8 { // struct ifa_cacheinfo: preferred, valid, ...
				a.Preferred = nl.NativeEndian().Uint32(attr.Value[0:4])
				a.Valid = nl.NativeEndian().Uint32(attr.Value[4:8])
			}
		}
	}
	// IFA_LOCAL is the interface's own address; IFA_ADDRESS is the peer on
	// point-to-point links and equal to IFA_LOCAL otherwise. IPv6 sends only
	// IFA_ADDRESS unless a peer is configured.
	raw := local
	if raw == nil {
		raw = address
	}
	ip, ok := netip.AddrFromSlice(raw)
	if !ok {
		return kernelAddr{}, false, nil
	}
	a.Addr = ip // 4 bytes for AF_INET, 16 for AF_INET6
	return a, true, nil
}

// promoteSecondaries reads net.ipv4.conf.<link>.promote_secondaries through
// RTM_GETLINK (IFLA_AF_SPEC/AF_INET/IFLA_INET_CONF).
func (r *rtnl) promoteSecondaries(linkIndex int) (bool, error) {
	req := r.request(unix.RTM_GETLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(linkIndex)
	req.AddData(msg)
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWLINK)
	if err != nil {
		return false, err
	}
	for _, m := range msgs {
		if len(m) < unix.SizeofIfInfomsg {
			continue
		}
		attrs, err := nl.ParseRouteAttr(m[unix.SizeofIfInfomsg:])
		if err != nil {
			return false, err
		}
		for _, attr := range attrs {
			if attr.Attr.Type != unix.IFLA_AF_SPEC {
				continue
			}
			afs, err := nl.ParseRouteAttr(attr.Value)
			if err != nil {
				return false, err
			}
			for _, af := range afs {
				if af.Attr.Type != unix.AF_INET {
					continue
				}
				confs, err := nl.ParseRouteAttr(af.Value)
				if err != nil {
					return false, err
				}
				for _, c := range confs {
					if c.Attr.Type != unix.IFLA_INET_CONF {
						continue
					}
					// A u32 array indexed by IPV4_DEVCONF_* - 1.
					off := (ipv4DevconfPromoteSecondaries - 1) * 4
					if len(c.Value) < off+4 {
						return false, fmt.Errorf("IFLA_INET_CONF too short (%d bytes)", len(c.Value))
					}
					return nl.NativeEndian().Uint32(c.Value[off:off+4]) != 0, nil
				}
			}
		}
	}
	return false, errors.New("link has no IPv4 devconf (IPv4 disabled?)")
}

// setPromoteSecondaries writes the devconf through RTM_SETLINK rather than
// /proc/sys: container runtimes mount /proc/sys read-only for unprivileged
// containers, while this netlink path needs only CAP_NET_ADMIN.
func (r *rtnl) setPromoteSecondaries(linkIndex int) error {
	req := r.request(unix.RTM_SETLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(linkIndex)
	req.AddData(msg)
	spec := nl.NewRtAttr(unix.IFLA_AF_SPEC, nil)
	inet := spec.AddRtAttr(unix.AF_INET, nil)
	conf := inet.AddRtAttr(unix.IFLA_INET_CONF, nil)
	val := make([]byte, 4)
	binary.NativeEndian.PutUint32(val, 1)
	conf.AddRtAttr(ipv4DevconfPromoteSecondaries, val)
	req.AddData(spec)
	_, err := req.Execute(unix.NETLINK_ROUTE, 0)
	return err
}
