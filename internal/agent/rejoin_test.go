package agent

import (
	"context"
	"net/netip"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1alpha1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/report"
)

// TestRejoinBindsOnlyWhatBothAgree: after a fence, a cache that still shows
// an Egress assigned here which the API server no longer does (the
// informers lag) gets only the IPs both show; the rejoin ends when they
// agree, and a failed consistent read binds nothing. The API server's view
// is a fake client here (a lagging informer cannot be forced on a real
// one in a unit test); TestAgentFenceUnbindsAndRejoins runs the path
// against a real API server.
func TestRejoinBindsOnlyWhatBothAgree(t *testing.T) {
	const node = "n1"
	pool := v1alpha1.ExternalIPPool{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: v1alpha1.ExternalIPPoolSpec{
		IPRanges: []v1alpha1.IPRange{{CIDR: "192.0.2.0/24"}}, SubnetInfo: &v1alpha1.SubnetInfo{Gateway: "192.0.2.1", PrefixLength: 24}}}
	eg := func(name, ip, n string) v1alpha1.Egress {
		return v1alpha1.Egress{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:   v1alpha1.EgressSpec{ExternalIPPool: "p", EgressIP: ip},
			Status: v1alpha1.EgressStatus{EgressIP: ip, EgressNode: n}}
	}
	pools := []v1alpha1.ExternalIPPool{pool}
	cached := computeDesired(node, []v1alpha1.Egress{eg("a", "192.0.2.10", node), eg("b", "192.0.2.11", node)}, pools)
	s := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	live := func(egs ...v1alpha1.Egress) client.Reader {
		objs := make([]client.Object, 0, len(egs))
		for i := range egs {
			objs = append(objs, &egs[i])
		}
		return fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).WithStatusSubresource(&v1alpha1.Egress{}).
			WithIndex(&v1alpha1.Egress{}, v1alpha1.EgressNodeField, func(o client.Object) []string {
				return []string{o.(*v1alpha1.Egress).Status.EgressNode}
			}).Build()
	}
	a := &Agent{cfg: Config{NodeName: node}}
	a.fenceStatus.Store(&report.FenceStatus{Rejoining: true})
	a.rejoining.Store(true)

	// "a" moved to n2 while fenced; the cache has not seen it yet.
	a.apiReader = live(eg("a", "192.0.2.10", "n2"), eg("b", "192.0.2.11", node))
	got := a.rejoin(context.Background(), cached, pools)
	if want := []netip.Addr{netip.MustParseAddr("192.0.2.11")}; !slices.Equal(got.ips, want) || got.want[netip.MustParseAddr("192.0.2.10")] {
		t.Fatalf("rejoin with a lagging cache desires %v, want %v", got.ips, want)
	}
	if !a.rejoining.Load() {
		t.Fatal("rejoin ended while the cache disagrees")
	}
	// No consistent read possible: nothing.
	a.apiReader = failingReader{}
	if got := a.rejoin(context.Background(), cached, pools); len(got.ips) != 0 {
		t.Fatalf("rejoin without the API server desires %v, want nothing", got.ips)
	}
	// The cache caught up (or nothing moved): the cache is followed again.
	a.apiReader = live(eg("a", "192.0.2.10", node), eg("b", "192.0.2.11", node))
	if got := a.rejoin(context.Background(), cached, pools); !slices.Equal(got.ips, cached.ips) {
		t.Fatalf("rejoin with agreeing views desires %v, want %v", got.ips, cached.ips)
	}
	if a.rejoining.Load() || a.fenceStatus.Load().Rejoining {
		t.Fatal("rejoin did not end once the views agree")
	}
}

type failingReader struct{ client.Reader }

func (failingReader) List(context.Context, client.ObjectList, ...client.ListOption) error {
	return context.DeadlineExceeded
}
