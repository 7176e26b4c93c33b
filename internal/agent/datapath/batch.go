package datapath

import (
	"errors"
	"fmt"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Batch sizing. A table is written in one nfnetlink batch, which the kernel
// takes only in one sendmsg (nfnetlink_rcv_batch), and netlink_sendmsg
// refuses a message longer than the socket's send buffer with EMSGSIZE.
// The default buffer (net.core.wmem_default, 212992 bytes on most systems)
// holds a few thousand member elements: an egress Node of a large cluster
// needs more, as nft(8) does when it sizes its buffer to the batch.
const (
	// batchSlack covers the table, chains, rules and counters, in bytes:
	// the fixed ruleset is a few KiB, per-Egress counter rules about 100
	// bytes each.
	batchSlack = 1 << 20
	// elementBytes bounds the encoding of one set element besides its key,
	// value and comment (attribute headers, flags, the element list's
	// nesting), in bytes.
	elementBytes = 64
	// minSendBuffer is the send buffer never gone below, in bytes
	// (net.core.wmem_default's usual value).
	minSendBuffer = 212992
)

// batchSize estimates an upper bound of the bytes of nft's batch.
func batchSize(nft Ruleset) int {
	n := batchSlack
	for _, sc := range nft.Sets {
		n += 256
		for _, e := range sc.Elements {
			n += elementBytes + len(e.Key) + len(e.Val) + len(e.Comment)
		}
	}
	for _, cc := range nft.Chains {
		n += 256 + 64*len(cc.Rules)
		for _, r := range cc.Rules {
			n += 128 * len(r)
		}
	}
	n += 128 * len(nft.Counters)
	return n
}

// sendBuffer is the connection option that sizes the netlink socket for
// nft's batch: the send buffer to the batch (SO_SNDBUFFORCE, which
// CAP_NET_ADMIN allows past net.core.wmem_max and which the agent has to
// program nftables at all, else SO_SNDBUF), the receive buffer likewise
// (SO_RCVBUFFORCE), and the acknowledgements
// capped to their headers (NETLINK_CAP_ACK): without it every
// acknowledgement carries the request it answers, and the answers to a
// large batch overflow the receive buffer (ENOBUFS).
func sendBuffer(nft Ruleset) nftables.ConnOption {
	size := max(batchSize(nft), minSendBuffer)
	return nftables.WithSockOptions(func(c *netlink.Conn) error {
		if err := c.SetOption(netlink.CapAcknowledge, true); err != nil {
			return fmt.Errorf("netlink socket: cap acknowledgements: %w", err)
		}
		raw, err := c.SyscallConn()
		if err != nil {
			return fmt.Errorf("netlink socket: %w", err)
		}
		var serr error
		if err := raw.Control(func(fd uintptr) {
			for _, o := range [][2]int{{unix.SO_SNDBUFFORCE, unix.SO_SNDBUF}, {unix.SO_RCVBUFFORCE, unix.SO_RCVBUF}} {
				if err := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o[0], size); err != nil {
					serr = errors.Join(serr, unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o[1], size))
				}
			}
		}); err != nil {
			return fmt.Errorf("netlink socket: %w", err)
		}
		if serr != nil {
			return fmt.Errorf("set the netlink buffers to %d bytes: %w", size, serr)
		}
		return nil
	})
}
