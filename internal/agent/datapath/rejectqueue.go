package datapath

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/go-logr/logr"
	"github.com/mdlayher/netlink"
	"github.com/ti-mo/netfilter"
	"golang.org/x/sys/unix"
)

// Netfilter queue protocol numbers (include/uapi/linux/netfilter/
// nfnetlink_queue.h and netfilter.h).
const (
	nfqnlMsgPacket  = 0 // NFQNL_MSG_PACKET: kernel -> user, one queued packet
	nfqnlMsgVerdict = 1 // NFQNL_MSG_VERDICT: user -> kernel
	nfqnlMsgConfig  = 2 // NFQNL_MSG_CONFIG: user -> kernel

	nfqaPacketHdr  = 1 // NFQA_PACKET_HDR: packet id (be32), hw protocol, hook
	nfqaVerdictHdr = 2 // NFQA_VERDICT_HDR: verdict (be32), packet id (be32)
	nfqaMark       = 3 // NFQA_MARK: packet mark (be32)

	nfqaCfgCmd      = 1 // NFQA_CFG_CMD: command (u8), pad, protocol family (be16)
	nfqaCfgParams   = 2 // NFQA_CFG_PARAMS: copy range (be32), copy mode (u8)
	nfqaCfgQueueLen = 3 // NFQA_CFG_QUEUE_MAXLEN: be32
	nfqaCfgMask     = 4 // NFQA_CFG_MASK: be32, which flags to change
	nfqaCfgFlags    = 5 // NFQA_CFG_FLAGS: be32

	nfqnlCfgCmdBind  = 1 // NFQNL_CFG_CMD_BIND
	nfqnlCopyMeta    = 1 // NFQNL_COPY_META: metadata only, no payload
	nfqaCfgFFailOpen = 1 // NFQA_CFG_F_FAIL_OPEN: a full queue accepts instead of dropping

	nfRepeat = 4 // NF_REPEAT: run the same hook again
)

// rejectQueueLen bounds the packets waiting for a verdict, in packets;
// beyond it the queue fails open, which here means the packet goes on to
// the forward chain and is rejected there at once.
const rejectQueueLen = 1024

// ServeRejectQueue serves the reject queue (Config.RejectQueue) until ctx
// is done, returning nil then; with RejectQueue -1 it returns nil at once.
//
// Why it exists: a TCP connect() sends its SYN while it holds the socket
// lock, and on the same CPU the forward path of the Node rejects that SYN
// and delivers the ICMP error back to the Pod before the lock is released.
// The kernel does not abort a locked socket on an ICMP error (it keeps
// it as a soft error, counted as TcpExtLockDroppedIcmps), so connect()
// fails only when the retransmitted SYN, a second later, draws another
// error; for IPv6 this was measured at 1.0 s. Returning the SYN from this
// process (NF_REPEAT, with FromTunnel set in the packet mark so the
// reject-queue chain lets it pass) moves the rejection into this
// process's system call, after connect() has returned, and the Pod sees
// EHOSTUNREACH at once.
//
// Only SYNs of connections that failurePolicy Fail rejects are queued. The
// queue is bound with fail-open and the nftables rule with bypass, so a
// missing, slow or dead reader makes the rejection synchronous again, never
// lets the traffic through and never drops it silently.
//
// Once bound it logs "reject queue bound" to the logger in ctx (logr).
//
// Errors: binding fails when the kernel has no netfilter queue support
// (nfnetlink_queue) or another process holds the queue number (EPERM: the
// kernel's owner check; the old agent during a surge rolling update);
// reading fails on a socket error. Either leaves the rejection synchronous.
func (d *Datapath) ServeRejectQueue(ctx context.Context) error {
	if d.cfg.RejectQueue < 0 {
		return nil
	}
	q := uint16(d.cfg.RejectQueue)
	var nc netlink.Config
	if d.ns.IsOpen() {
		nc.NetNS = int(d.ns)
	}
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &nc)
	if err != nil {
		return fmt.Errorf("reject queue %d: open netlink: %w", q, err)
	}
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer func() {
		if stop() {
			_ = c.Close()
		}
	}()
	// A reader that falls behind loses queue messages (the packets then go
	// on per fail-open); it should not see ENOBUFS as a read error.
	if err := c.SetOption(netlink.NoENOBUFS, true); err != nil {
		return fmt.Errorf("reject queue %d: %w", q, err)
	}

	params := make([]byte, 5)
	binary.BigEndian.PutUint32(params, 0) // copy range: no payload
	params[4] = nfqnlCopyMeta
	for _, attrs := range [][]netfilter.Attribute{
		{{Type: nfqaCfgCmd, Data: []byte{nfqnlCfgCmdBind, 0, 0, 0}}},
		{
			{Type: nfqaCfgParams, Data: params},
			{Type: nfqaCfgQueueLen, Data: netfilter.Uint32Bytes(rejectQueueLen)},
			{Type: nfqaCfgMask, Data: netfilter.Uint32Bytes(nfqaCfgFFailOpen)},
			{Type: nfqaCfgFlags, Data: netfilter.Uint32Bytes(nfqaCfgFFailOpen)},
		},
	} {
		m, err := netfilter.MarshalNetlink(netfilter.Header{
			SubsystemID: netfilter.NFSubsysQueue, MessageType: nfqnlMsgConfig,
			Family: netfilter.ProtoUnspec, ResourceID: q,
			Flags: netlink.Request | netlink.Acknowledge,
		}, attrs)
		if err != nil {
			return fmt.Errorf("reject queue %d: encode config: %w", q, err)
		}
		if _, err := c.Execute(m); err != nil {
			return fmt.Errorf("reject queue %d: bind: %w", q, err)
		}
	}
	logr.FromContextOrDiscard(ctx).Info("reject queue bound", "queue", q)

	for {
		msgs, err := c.Receive()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("reject queue %d: read: %w", q, err)
		}
		for _, m := range msgs {
			id, mark, ok := queuedPacket(m)
			if !ok {
				continue
			}
			v, err := netfilter.MarshalNetlink(netfilter.Header{
				SubsystemID: netfilter.NFSubsysQueue, MessageType: nfqnlMsgVerdict,
				Family: netfilter.ProtoUnspec, ResourceID: q, Flags: netlink.Request,
			}, verdictAttrs(id, mark|d.cfg.FromTunnel))
			if err != nil {
				return fmt.Errorf("reject queue %d: encode verdict: %w", q, err)
			}
			if _, err := c.Send(v); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("reject queue %d: send verdict: %w", q, err)
			}
		}
	}
}

// queuedPacket decodes an NFQNL_MSG_PACKET: the packet id and its mark (0
// when the kernel sent none). ok is false for any other message.
func queuedPacket(m netlink.Message) (id, mark uint32, ok bool) {
	h, attrs, err := netfilter.UnmarshalNetlink(m)
	if err != nil || h.SubsystemID != netfilter.NFSubsysQueue || h.MessageType != nfqnlMsgPacket {
		return 0, 0, false
	}
	var haveID bool
	for _, a := range attrs {
		switch {
		case a.Type == nfqaPacketHdr && len(a.Data) >= 4:
			id, haveID = binary.BigEndian.Uint32(a.Data), true
		case a.Type == nfqaMark && len(a.Data) == 4:
			mark = binary.BigEndian.Uint32(a.Data)
		}
	}
	return id, mark, haveID
}

// verdictAttrs is an NF_REPEAT verdict for packet id with the packet mark
// set to mark.
func verdictAttrs(id, mark uint32) []netfilter.Attribute {
	hdr := make([]byte, 8)
	binary.BigEndian.PutUint32(hdr, nfRepeat)
	binary.BigEndian.PutUint32(hdr[4:], id)
	return []netfilter.Attribute{
		{Type: nfqaVerdictHdr, Data: hdr},
		{Type: nfqaMark, Data: netfilter.Uint32Bytes(mark)},
	}
}
