package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"time"

	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
)

// Config is the fixed part of a Node's datapath: names, numbers and marks
// that do not change while the agent runs. The zero value of a field means
// its default (see DefaultConfig).
type Config struct {
	// TableName is the nftables table (family inet) the datapath owns;
	// default "egressip". No other table is ever touched.
	TableName string
	// TunnelDevice is the name of the flow-based VXLAN-GPE device; default
	// "egx" (at most 15 bytes, IFNAMSIZ-1).
	TunnelDevice string
	// TunnelPort is the UDP destination port of tunnel packets; default
	// 4790, the IANA port of VXLAN-GPE (draft-ietf-nvo3-vxlan-gpe).
	TunnelPort uint16
	// TunnelAddr is the IPv4 /32 put on the tunnel device so that loose
	// reverse-path filtering (rp_filter=2) accepts its packets: the kernel's
	// __fib_validate_source rejects packets on a device without an IPv4
	// address. It must lie in 169.254.0.0/16 (RFC 3927); default
	// 169.254.77.1.
	TunnelAddr netip.Addr
	// IDMask is the contiguous run of connection-mark bits that carries the
	// Node-local Egress ID; default 0x0fff0000 (12 bits, IDs 1..4095).
	IDMask uint32
	// FromTunnel is the single connection-mark bit set on connections that
	// entered through the tunnel; default 0x10000000. It must not overlap
	// IDMask.
	FromTunnel uint32
	// Uplink is the Node's interface toward the other Nodes; its MTU sizes
	// the tunnel. Required unless UplinkMTU is set.
	Uplink string
	// UplinkMTU overrides the uplink's MTU in bytes (0: read it from Uplink).
	UplinkMTU int
	// RulePriority is the first of the three policy-routing rule
	// priorities the datapath owns (base, base+1, base+2); default 1100,
	// after Cilium's local rule (100) and the AWS VPC CNI's 1024, before
	// its 1536.
	RulePriority int
	// RejectQueue is the netfilter queue number (1..65535) through which
	// the first packet (TCP SYN) of a connection that failurePolicy Fail
	// rejects takes a round trip to ServeRejectQueue, so that the ICMP
	// error reaches the Pod after its connect() has released the socket
	// (see ServeRejectQueue). 0 means the default, 4790 (the tunnel's port
	// number, easy to recognise in `nft list ruleset`); -1 turns the round
	// trip off (the rejection is then made at once, which the kernel
	// delivers as EHOSTUNREACH only on the retransmitted SYN for IPv6).
	RejectQueue int
	// queueForm is how the ruleset queues (set by New after probing the
	// kernel; the zero value, the native queue expression, for Build).
	queueForm queueForm
	// TableBase numbers the routing tables: Egress ID n routes its members
	// into the tunnel from table TableBase+n (see SourceTable), and
	// TableBase-1 holds the return routes toward remote members. Default
	// 50000 (tables 49999..54095 with the default IDMask).
	TableBase int
	// DrainTimeout bounds how long the flows of a member that left an
	// Egress keep their old path when they do not end by themselves
	// (docs/datapath.md); 0 means DefaultDrainTimeout, a negative value
	// turns drains off (the entries are deleted when the member leaves).
	DrainTimeout time.Duration
}

// Tunnel overheads in bytes: outer IPv4 (20) or IPv6 (40) header, UDP (8)
// and the VXLAN-GPE header (8); no inner Ethernet header.
const (
	overheadV4 = 20 + 8 + 8
	overheadV6 = 40 + 8 + 8
)

// DefaultConfig returns the defaults documented on Config's fields, with
// Uplink left empty.
func DefaultConfig() Config {
	return Config{
		TableName:    "egressip",
		TunnelDevice: "egx",
		TunnelPort:   4790,
		TunnelAddr:   netip.AddrFrom4([4]byte{169, 254, 77, 1}),
		IDMask:       0x0fff0000,
		FromTunnel:   0x10000000,
		RulePriority: 1100,
		TableBase:    50000,
		RejectQueue:  4790,
	}
}

// withDefaults fills zero fields from DefaultConfig and validates the
// result. Errors name the offending field.
func (c Config) withDefaults() (Config, error) {
	d := DefaultConfig()
	if c.TableName == "" {
		c.TableName = d.TableName
	}
	if c.TunnelDevice == "" {
		c.TunnelDevice = d.TunnelDevice
	}
	if c.TunnelPort == 0 {
		c.TunnelPort = d.TunnelPort
	}
	if !c.TunnelAddr.IsValid() {
		c.TunnelAddr = d.TunnelAddr
	}
	if c.IDMask == 0 {
		c.IDMask = d.IDMask
	}
	if c.FromTunnel == 0 {
		c.FromTunnel = d.FromTunnel
	}
	if c.RulePriority == 0 {
		c.RulePriority = d.RulePriority
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = DefaultDrainTimeout
	}
	if c.TableBase == 0 {
		c.TableBase = d.TableBase
	}
	if c.RejectQueue == 0 {
		c.RejectQueue = d.RejectQueue
	}
	var errs []error
	if len(c.TunnelDevice) > 15 {
		errs = append(errs, fmt.Errorf("TunnelDevice %q: longer than 15 bytes", c.TunnelDevice))
	}
	if !c.TunnelAddr.Is4() || !netip.MustParsePrefix("169.254.0.0/16").Contains(c.TunnelAddr) {
		errs = append(errs, fmt.Errorf("TunnelAddr %s: not in 169.254.0.0/16", c.TunnelAddr))
	}
	shift := bits.TrailingZeros32(c.IDMask)
	if m := c.IDMask >> shift; m&(m+1) != 0 {
		errs = append(errs, fmt.Errorf("IDMask %#x: bits not contiguous", c.IDMask))
	}
	if bits.OnesCount32(c.FromTunnel) != 1 || c.FromTunnel&c.IDMask != 0 {
		errs = append(errs, fmt.Errorf("FromTunnel %#x: must be one bit outside IDMask %#x", c.FromTunnel, c.IDMask))
	}
	if c.RulePriority < 1 || c.RulePriority > 32000 {
		errs = append(errs, fmt.Errorf("RulePriority %d: out of 1..32000", c.RulePriority))
	}
	if c.TableBase < 256 || c.TableBase+int(c.maxID()) > 1<<31-1 {
		errs = append(errs, fmt.Errorf("TableBase %d: out of range", c.TableBase))
	}
	if c.RejectQueue < -1 || c.RejectQueue > 65535 {
		errs = append(errs, fmt.Errorf("RejectQueue %d: out of 1..65535 (or -1: none)", c.RejectQueue))
	}
	if c.UplinkMTU != 0 && (c.UplinkMTU < 1280+overheadV6 || c.UplinkMTU > 65535) {
		errs = append(errs, fmt.Errorf("UplinkMTU %d: out of %d..65535", c.UplinkMTU, 1280+overheadV6))
	}
	if err := errors.Join(errs...); err != nil {
		return c, fmt.Errorf("datapath config: %w", err)
	}
	return c, nil
}

// queueForm is the nftables expression that sends a packet to the reject
// queue.
type queueForm uint8

const (
	// queueNative is the queue expression (CONFIG_NFT_QUEUE).
	queueNative queueForm = iota
	// queueCompat is xtables' NFQUEUE target through nft_compat, as
	// iptables-nft writes `-j NFQUEUE` (CONFIG_NFT_COMPAT and
	// CONFIG_NETFILTER_XT_TARGET_NFQUEUE), for kernels built without
	// nft_queue.
	queueCompat
	// queueNone: no reject queue (RejectQueue -1, or neither form is
	// supported by the kernel).
	queueNone
)

// String names the form as Datapath.RejectQueueForm reports it.
func (f queueForm) String() string {
	switch f {
	case queueNative:
		return "nft queue"
	case queueCompat:
		return "xt NFQUEUE"
	default:
		return "none"
	}
}

// queueExpr is the expression that queues to c.RejectQueue with bypass,
// nil for queueNone.
func (c Config) queueExpr() expr.Any {
	if c.RejectQueue < 0 {
		return nil
	}
	switch c.queueForm {
	case queueNative:
		return &expr.Queue{Num: uint16(c.RejectQueue), Flag: expr.QueueFlagBypass}
	case queueCompat:
		// struct xt_NFQ_info_v3 (include/uapi/linux/netfilter/
		// xt_NFQUEUE.h): queuenum, queues_total, flags, host byte order,
		// padded to 8 bytes (XT_ALIGN) as the kernel stores it.
		info := make(xt.Unknown, 8)
		binary.NativeEndian.PutUint16(info[0:], uint16(c.RejectQueue))
		binary.NativeEndian.PutUint16(info[2:], 1)
		binary.NativeEndian.PutUint16(info[4:], xtNFQFlagBypass)
		return &expr.Target{Name: "NFQUEUE", Rev: 3, Info: &info}
	default:
		return nil
	}
}

// xtNFQFlagBypass is NFQ_FLAG_BYPASS (xt_NFQUEUE.h).
const xtNFQFlagBypass = 0x01

// idShift is the bit position of the ID inside the mark.
func (c Config) idShift() int { return bits.TrailingZeros32(c.IDMask) }

// maxID is the largest Node-local Egress ID the mask can carry.
func (c Config) maxID() uint16 {
	return uint16(min(c.IDMask>>c.idShift(), 0xffff))
}

// Mark is the connection mark of Egress ID id (without FromTunnel).
func (c Config) Mark(id uint16) uint32 { return uint32(id) << c.idShift() }

// SourceTable is the routing table that sends members of Egress ID id into
// the tunnel toward the egress IP: TableBase + id.
func (c Config) SourceTable(id uint16) int { return c.TableBase + int(id) }

// ReturnTable is the routing table of return routes toward remote members:
// TableBase - 1.
func (c Config) ReturnTable() int { return c.TableBase - 1 }
