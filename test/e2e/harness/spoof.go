package harness

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	eventsv1 "k8s.io/api/events/v1"
)

// ListenInNode opens a TCP listener on addr inside n's network namespace
// (the Node's host network), as any process on the Node could.
func (c *Cluster) ListenInNode(n *Node, addr string) (net.Listener, error) {
	var ln net.Listener
	err := inNamespace(n.Name, func() error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen on %s in %s: %w", addr, n.Name, err)
	}
	return ln, nil
}

// mitmTable is the nftables table RedirectPort installs.
const mitmTable = "e2e_mitm"

// RedirectPort makes n's kernel redirect TCP connections arriving for port
// from to the local port to (an nftables "redirect" in prerouting, table
// ip e2e_mitm): what a man in the middle on the Node's path does to step
// between the controller and the agent. The returned function removes it.
func (c *Cluster) RedirectPort(n *Node, from, to uint16) (func() error, error) {
	h, err := netns.GetFromName(n.Name)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", n.Name, err)
	}
	conn, err := nftables.New(nftables.WithNetNSFd(int(h)))
	if err != nil {
		_ = h.Close()
		return nil, err
	}
	t := conn.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: mitmTable})
	pre := conn.AddChain(&nftables.Chain{Name: "prerouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest})
	port := func(p uint16) []byte { return binary.BigEndian.AppendUint16(nil, p) }
	conn.AddRule(&nftables.Rule{Table: t, Chain: pre, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: port(from)},
		&expr.Immediate{Register: 1, Data: port(to)},
		&expr.Redir{RegisterProtoMin: 1},
	}})
	if err := conn.Flush(); err != nil {
		_ = h.Close()
		return nil, fmt.Errorf("redirect table on %s: %w", n.Name, err)
	}
	return func() error {
		defer func() { _ = h.Close() }()
		conn.DelTable(t)
		return conn.Flush()
	}, nil
}

// NodeEvents returns the events.k8s.io Events about Node node with reason.
func (c *Cluster) NodeEvents(ctx context.Context, node, reason string) ([]eventsv1.Event, error) {
	var list eventsv1.EventList
	if err := c.Client.List(ctx, &list); err != nil {
		return nil, err
	}
	var out []eventsv1.Event
	for _, e := range list.Items {
		if e.Regarding.Kind == "Node" && e.Regarding.Name == node && e.Reason == reason {
			out = append(out, e)
		}
	}
	return out, nil
}
