package webhook_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/testutil/poll"
)

func node(t *testing.T, name string, addrs ...corev1.NodeAddress) {
	t.Helper()
	ctx := context.Background()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := env.Client.Create(ctx, n); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), n) })
	n.Status.Addresses = addrs
	if err := env.Client.Status().Update(ctx, n); err != nil {
		t.Fatal(err)
	}
}

// TestNodeAddressNamedEgressIPRejected: a named spec.egressIP equal to a
// Node's InternalIP or ExternalIP is refused with a message naming the
// Node, on create and when an update names it; an Egress whose address a
// Node took later can still be edited otherwise (issue 14, build item 3,
// rule 2).
func TestNodeAddressNamedEgressIPRejected(t *testing.T) {
	ctx := context.Background()
	create(t, pool("nan-pool", v1.IPRange{CIDR: "198.51.100.128/27"}), "")
	node(t, "nan-node", corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "198.51.100.130"},
		corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "198.51.100.131"}, corev1.NodeAddress{Type: corev1.NodeHostName, Address: "nan-node"})
	create(t, egress("nan-internal", "nan-pool", "198.51.100.130"),
		`spec.egressIP: Invalid value: "198.51.100.130": is the InternalIP of Node nan-node: a Node's own address is never an egress IP; name another address of ExternalIPPool "nan-pool", or leave spec.egressIP empty to have one allocated`)
	create(t, egress("nan-external", "nan-pool", "198.51.100.131"), `is the ExternalIP of Node nan-node`)
	create(t, egress("nan-ok", "nan-pool", "198.51.100.140"), "")

	// update edits nan-ok, retrying when the controller wrote in between.
	update := func(mutate func(*v1.Egress)) error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			var e v1.Egress
			if err := env.Client.Get(ctx, client.ObjectKey{Name: "nan-ok"}, &e); err != nil {
				return err
			}
			mutate(&e)
			return env.Client.Update(ctx, &e)
		})
	}
	if err := update(func(e *v1.Egress) { e.Spec.EgressIP = "198.51.100.131" }); err == nil || !strings.Contains(err.Error(), "is the ExternalIP of Node nan-node") {
		t.Fatalf("update to a Node address: want refused naming nan-node, got %v", err)
	}

	// The Node takes nan-ok's address afterwards: other edits still pass.
	n := &corev1.Node{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "nan-node"}, n); err != nil {
		t.Fatal(err)
	}
	n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "198.51.100.140"})
	if err := env.Client.Status().Update(ctx, n); err != nil {
		t.Fatal(err)
	}
	create(t, egress("nan-probe", "nan-pool", "198.51.100.140"), "is the InternalIP of Node nan-node") // the cache has it now
	if err := update(func(e *v1.Egress) { e.Labels = map[string]string{"edited": "true"} }); err != nil {
		t.Errorf("label edit of an Egress whose IP a Node took later: %v", err)
	}
}

// TestNodeAddressPoolAdmitted: a pool whose ranges contain Node addresses
// is admitted with a warning naming them, and its status says how many are
// excluded and why (issue 14, build item 3, rule 3).
func TestNodeAddressPoolAdmitted(t *testing.T) {
	ctx := context.Background()
	node(t, "napool-node", corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "198.51.100.194"})
	wc, w := warningClient(t)
	p := pool("napool", v1.IPRange{CIDR: "198.51.100.192/29"})
	// The webhook's cache may not hold the Node yet: up to 50 tries
	// 200 ms apart; the warnings are judged below.
	_ = poll.Wait(ctx, 200*time.Millisecond, 10*time.Second, func() error {
		if err := wc.Create(ctx, p.DeepCopy()); err != nil {
			t.Fatalf("create pool with a Node address: %v", err)
		}
		if len(w.all()) > 0 {
			return nil
		}
		_ = env.Client.Delete(ctx, p)
		return errors.New("no warning yet")
	})
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), p) })
	want := "ipRanges contain 1 Node address, which is never allocated (status.excluded counts them): 198.51.100.194 (the InternalIP of Node napool-node)"
	if got := w.all(); len(got) != 1 || got[0] != want {
		t.Fatalf("warnings %q, want [%q]", got, want)
	}
	poll.Until(t, 20*time.Second, "the pool's status counting the Node address", func() error {
		var got v1.ExternalIPPool
		if err := env.Client.Get(ctx, client.ObjectKey{Name: "napool"}, &got); err != nil {
			t.Fatal(err)
		}
		if len(got.Status.Excluded) > 0 && got.Status.Excluded[0].Reason == v1.ExcludedNodeAddress && got.Status.Excluded[0].Count == 1 &&
			strings.Contains(got.Status.Excluded[0].Message, "198.51.100.194 (InternalIP of Node napool-node)") && got.Status.Usage.Total == 5 {
			return nil
		}
		return fmt.Errorf("pool status: excluded %+v usage %+v", got.Status.Excluded, got.Status.Usage)
	})
}

// TestReservedAddressRangeRefusedByWebhook: a start/end range whose ends
// are unicast but which spans special-purpose addresses is refused with a
// message naming the block (issue 15 fault 2); CEL refuses such a cidr
// (api/v1alpha1 TestReservedAddressCIDRRefusedByCEL).
func TestReservedAddressRangeRefusedByWebhook(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    v1.IPRange
		want string
	}{
		{"rsv-loopback", v1.IPRange{Start: "126.255.255.0", End: "128.0.0.10"},
			`spec.ipRanges[0]: Invalid value: "126.255.255.0-128.0.0.10": contains loopback addresses (127.0.0.0/8, RFC 1122), which are never egress IPs; split the range around them`},
		{"rsv-linklocal", v1.IPRange{Start: "169.254.0.1", End: "169.254.0.9"}, `start must be a unicast address`}, // CEL: the end itself
		{"rsv-linklocal-span", v1.IPRange{Start: "169.253.255.250", End: "169.255.0.5"}, `contains link-local addresses (169.254.0.0/16, RFC 3927)`},
		{"rsv-multicast", v1.IPRange{Start: "223.255.255.250", End: "240.0.0.5"}, `contains multicast addresses (224.0.0.0/4, RFC 5771)`},
		{"rsv-thisnet", v1.IPRange{Start: "0.0.0.1", End: "0.0.0.9"}, `contains "this network" addresses (0.0.0.0/8, RFC 1122)`},
		{"rsv-v6-linklocal", v1.IPRange{Start: "fe7f::1", End: "fec0::1"}, `contains link-local addresses (fe80::/10, RFC 4291)`},
		{"rsv-v4mapped", v1.IPRange{Start: "::fffe:1", End: "::1:0:0:1"}, `contains IPv4-mapped addresses (::ffff:0.0.0.0/96, RFC 4291)`},
	} {
		create(t, pool(tc.name, tc.r), tc.want)
	}
	create(t, pool("rsv-beside", v1.IPRange{Start: "126.255.255.250", End: "126.255.255.255"}), "")
}
