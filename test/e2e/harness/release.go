package harness

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/url"
	"strconv"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// cutTable is the nftables table CutAPIServer adds in a Node namespace.
const cutTable = "e2e-cut-apiserver"

// APIServerPort is the TCP port kube-apiserver listens on (on BridgeV4).
func (c *Cluster) APIServerPort() (uint16, error) {
	u, err := url.Parse(c.Env.Config.Host)
	if err != nil {
		return 0, fmt.Errorf("API server URL %q: %w", c.Env.Config.Host, err)
	}
	p, err := strconv.ParseUint(u.Port(), 10, 16)
	if err != nil {
		return 0, fmt.Errorf("API server URL %q: port: %w", c.Env.Config.Host, err)
	}
	return uint16(p), nil
}

// CutAPIServer drops, in n's namespace, every packet n sends to the API
// server's port (an nftables output rule): n's agent can no longer list
// or watch, and its open watch hangs without an error, while the
// controller's polls of n (which n answers) and ARP still work. Restore
// with RestoreAPIServer.
func (c *Cluster) CutAPIServer(n *Node) error {
	port, err := c.APIServerPort()
	if err != nil {
		return err
	}
	conn, closeNS, err := nftIn(n.Name)
	if err != nil {
		return err
	}
	defer closeNS()
	t := conn.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: cutTable})
	accept := nftables.ChainPolicyAccept
	out := conn.AddChain(&nftables.Chain{Name: "output", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	portBytes := make([]byte, 2)
	binary.BigEndian.PutUint16(portBytes, port)
	conn.AddRule(&nftables.Rule{Table: t, Chain: out, Exprs: []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: BridgeV4.AsSlice()},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: portBytes},
		&expr.Counter{},
		&expr.Verdict{Kind: expr.VerdictDrop},
	}})
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("cut %s from the API server: %w", n.Name, err)
	}
	return nil
}

// RestoreAPIServer undoes CutAPIServer.
func (c *Cluster) RestoreAPIServer(n *Node) error {
	conn, closeNS, err := nftIn(n.Name)
	if err != nil {
		return err
	}
	defer closeNS()
	conn.DelTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: cutTable})
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("reconnect %s to the API server: %w", n.Name, err)
	}
	return nil
}

func nftIn(ns string) (*nftables.Conn, func(), error) {
	h, err := netns.GetFromName(ns)
	if err != nil {
		return nil, nil, fmt.Errorf("open %s: %w", ns, err)
	}
	conn, err := nftables.New(nftables.WithNetNSFd(int(h)))
	if err != nil {
		_ = h.Close()
		return nil, nil, fmt.Errorf("nftables in %s: %w", ns, err)
	}
	return conn, func() { _ = h.Close() }, nil
}

// SetNodeReady sets the Ready condition of Node name to status (Unknown is
// what the Node lifecycle controller writes when the kubelet stops
// reporting).
func (c *Cluster) SetNodeReady(ctx context.Context, name string, status corev1.ConditionStatus) error {
	var n corev1.Node
	if err := c.Client.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
		return err
	}
	p := client.MergeFrom(n.DeepCopy())
	now := metav1.Now()
	reason := map[corev1.ConditionStatus]string{corev1.ConditionTrue: "KubeletReady", corev1.ConditionFalse: "KubeletNotReady", corev1.ConditionUnknown: "NodeStatusUnknown"}[status]
	found := false
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			n.Status.Conditions[i] = corev1.NodeCondition{Type: corev1.NodeReady, Status: status, Reason: reason, LastHeartbeatTime: now, LastTransitionTime: now}
			found = true
		}
	}
	if !found {
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeReady, Status: status, Reason: reason, LastHeartbeatTime: now, LastTransitionTime: now})
	}
	return c.Client.Status().Patch(ctx, &n, p)
}
