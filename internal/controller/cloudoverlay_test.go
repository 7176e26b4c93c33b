package controller

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/cloud"
)

// gatedCloud is a cloud with one instance and one Elastic IP whose reads
// can be held after they took their snapshot, so that a test can complete
// a call of ours between a re-read's snapshot and its write into the view.
type gatedCloud struct {
	mu       sync.Mutex
	instance string
	primary  cloud.Interface
	enis     []cloud.ENI
	eip      cloud.ElasticIP
	nextID   int
	attaches []int // device indexes asked for, in order
	// gate, when set for an action ("ElasticIPs", "TaggedInterfaces"),
	// makes the next such call signal entered after its snapshot and
	// wait for release.
	gate              map[string]bool
	entered, released chan struct{}
}

func newGatedCloud() *gatedCloud {
	return &gatedCloud{
		instance: "i-0gated",
		primary:  cloud.Interface{ID: "eni-primary", MAC: "0a:00:00:00:00:01", InstanceID: "i-0gated", Limit: 10, MaxInterfaces: 4},
		eip:      cloud.ElasticIP{AllocationID: "eipalloc-1", PublicIP: netip.MustParseAddr("203.0.113.1")},
		gate:     map[string]bool{}, entered: make(chan struct{}), released: make(chan struct{}),
	}
}

func (g *gatedCloud) hold(action string) {
	g.mu.Lock()
	gated := g.gate[action]
	delete(g.gate, action)
	g.mu.Unlock()
	if gated {
		g.entered <- struct{}{}
		<-g.released
	}
}

func (g *gatedCloud) Interfaces(_ context.Context, ids map[string]string) (map[string]cloud.Interface, error) {
	g.mu.Lock()
	ifc := g.primary
	for _, e := range g.enis {
		if e.InstanceID == g.instance {
			e.Tags = nil // DescribeInstances carries no interface tags
			ifc.Others = append(ifc.Others, e)
		}
	}
	g.mu.Unlock()
	out := map[string]cloud.Interface{}
	for n := range ids {
		out[n] = ifc
	}
	return out, nil
}

func (g *gatedCloud) Assign(context.Context, string, []netip.Addr) error { return nil }
func (g *gatedCloud) AssignCount(context.Context, string, int) ([]netip.Addr, error) {
	return nil, nil
}
func (g *gatedCloud) Unassign(context.Context, string, []netip.Addr) error { return nil }

func (g *gatedCloud) ElasticIPs(context.Context, []string, map[string]string) ([]cloud.ElasticIP, error) {
	g.mu.Lock()
	got := []cloud.ElasticIP{g.eip}
	g.mu.Unlock()
	g.hold("ElasticIPs")
	return got, nil
}

func (g *gatedCloud) Associate(_ context.Context, alloc, iface string, private netip.Addr) (string, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.eip.AssociationID, g.eip.InterfaceID, g.eip.PrivateIP = "eipassoc-1", iface, private
	return g.eip.AssociationID, nil
}

func (g *gatedCloud) Disassociate(context.Context, string) error { return nil }

func (g *gatedCloud) CreateInterface(_ context.Context, spec cloud.InterfaceSpec) (cloud.ENI, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.nextID++
	e := cloud.ENI{ID: fmt.Sprintf("eni-own%d", g.nextID), MAC: fmt.Sprintf("0a:00:00:00:01:%02x", g.nextID), SubnetID: spec.SubnetID,
		DeviceIndex: -1, Tags: maps.Clone(spec.Tags)}
	g.enis = append(g.enis, e)
	return e, nil
}

func (g *gatedCloud) AttachInterface(_ context.Context, id, instance string, device int) (string, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.attaches = append(g.attaches, device)
	for i := range g.enis {
		if g.enis[i].InstanceID == instance && g.enis[i].DeviceIndex == device {
			return "", fmt.Errorf("device index %d of %s is in use: %w", device, instance, cloud.ErrInUse)
		}
	}
	for i := range g.enis {
		if g.enis[i].ID == id {
			g.enis[i].InstanceID, g.enis[i].DeviceIndex, g.enis[i].AttachmentID = instance, device, "attach-"+id
		}
	}
	return "attach-" + id, nil
}

func (g *gatedCloud) DeleteInterface(context.Context, string, string) error { return nil }

func (g *gatedCloud) TaggedInterfaces(context.Context, map[string]string) ([]cloud.ENI, error) {
	g.mu.Lock()
	got := slices.Clone(g.enis)
	g.mu.Unlock()
	g.hold("TaggedInterfaces")
	return got, nil
}

func (g *gatedCloud) SubnetZones(_ context.Context, ids []string) (map[string]cloud.Subnet, error) {
	out := map[string]cloud.Subnet{}
	for _, id := range ids {
		out[id] = cloud.Subnet{ID: id, VPCID: "vpc-1", Zone: "us-east-1a"}
	}
	return out, nil
}

// TestCloudRereadKeepsElasticIPAssociation: a re-read of the Elastic IPs
// whose snapshot predates our AssociateAddress, and that is written into
// the view after it, no longer makes the allocation look free (the next
// pass associated it a second time: TestElasticIPOwnInterfaces saw 2
// AssociateAddress calls under load); a re-read begun after the call
// shows it and ends the overlay.
func TestCloudRereadKeepsElasticIPAssociation(t *testing.T) {
	ctx := context.Background()
	g := newGatedCloud()
	c := NewCloudActuator(nil, CloudConfig{Provider: g})
	pools := []v1.ExternalIPPool{{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: v1.ExternalIPPoolSpec{Cloud: &v1.CloudPool{AWS: &v1.AWSPool{
		ElasticIPs: &v1.ElasticIPs{AllocationIDs: []string{g.eip.AllocationID}}}}}}}
	c.refreshElasticIPs(ctx, pools)
	private := netip.MustParseAddr("10.0.0.5")
	want := []eipWant{{Egress: "e", IP: private, Interface: "eni-own1"}}
	ops := planElasticIPs(c.input(time.Now()).EIPs["p"], want, func(netip.Addr) bool { return true }, func(string) bool { return false })
	if len(ops.Ops) != 1 || !ops.Ops[0].Associate {
		t.Fatalf("first plan: %+v, want one associate", ops.Ops)
	}

	// A re-read takes its snapshot (free) and is held; the association
	// completes; then the re-read writes its snapshot.
	g.gate["ElasticIPs"] = true
	done := make(chan struct{})
	go func() { c.refreshElasticIPs(ctx, pools); close(done) }()
	<-g.entered
	op := ops.Ops[0]
	op.Pool = "p"
	c.runElasticIPs(ctx, []eipOp{op})
	waitUnblocked(t, c, "eip/"+op.AllocationID)
	close(g.released)
	<-done

	in := c.input(time.Now())
	if got := in.EIPs["p"].IPs[0]; got.AssociationID != "eipassoc-1" || got.PrivateIP != private {
		t.Fatalf("after the stale re-read the view shows %+v, want associated with %s", got, private)
	}
	if again := planElasticIPs(in.EIPs["p"], want, func(netip.Addr) bool { return true }, func(string) bool { return false }); len(again.Ops) != 0 {
		t.Fatalf("the next pass asks for %+v, want no call (the allocation is associated)", again.Ops)
	}
	c.refreshElasticIPs(ctx, pools) // begun after the call: the cloud shows it
	if n := len(c.eipOverlay); n != 0 {
		t.Fatalf("%d overlay entries after a re-read that shows the association, want 0", n)
	}
}

// TestCloudRereadKeepsAttachedInterface: a re-read whose snapshots (the
// instances and the listing by tag) predate the attach of an interface of
// ours, written into the view after it, keeps the interface in the view:
// the next create on the instance picks another device index (it picked
// the same one, and its attach failed), and the collector does not take
// the interface for a detached leftover.
func TestCloudRereadKeepsAttachedInterface(t *testing.T) {
	ctx := context.Background()
	g := newGatedCloud()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Spec: corev1.NodeSpec{ProviderID: "aws:///us-east-1a/" + g.instance}}
	reader := fake.NewClientBuilder().WithScheme(env.Scheme).WithObjects(node).Build()
	c := NewCloudActuator(reader, CloudConfig{Provider: g})
	if err := c.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	cr := eniCreate{Pool: "p1", Node: "n1", InstanceID: g.instance, SubnetID: "subnet-1"}

	// A create is made and waits to attach; a re-read lists it detached
	// and is held; the attach completes; then the re-read writes.
	g.gate["TaggedInterfaces"] = true
	done := make(chan error, 1)
	go func() { done <- c.Refresh(ctx) }()
	<-g.entered
	c.createENI(ctx, g, cr, 1)
	close(g.released)
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	in := c.input(time.Now())
	others := in.Ifaces["n1"].Others
	if len(others) != 1 || others[0].ID != "eni-own1" || others[0].DeviceIndex != 1 {
		t.Fatalf("after the stale re-read the view of n1 holds %+v, want eni-own1 at device index 1", others)
	}
	if i := slices.IndexFunc(in.Tagged, func(e cloud.ENI) bool { return e.ID == "eni-own1" }); i < 0 || in.Tagged[i].InstanceID != g.instance {
		t.Fatalf("the listing by tag shows %+v, want eni-own1 attached to %s", in.Tagged, g.instance)
	}
	if del := collect(in, map[string]bool{"p1": true, "p2": true}, map[string]bool{"n1": true}, func(netip.Addr) bool { return false }); len(del) != 0 {
		t.Fatalf("the collector deletes %+v, want nothing", del)
	}

	// The next create on the instance, for another pool, gets device 2.
	c.runENIJobs(ctx, &cloudOutput{CreateENIs: []eniCreate{{Pool: "p2", Node: "n1", InstanceID: g.instance, SubnetID: "subnet-1"}}})
	deadline := time.Now().Add(10 * time.Second)
	for {
		g.mu.Lock()
		attaches := slices.Clone(g.attaches)
		g.mu.Unlock()
		c.mu.Lock()
		creating := len(c.creating)
		c.mu.Unlock()
		if len(attaches) == 2 && creating == 0 {
			if attaches[1] != 2 {
				t.Fatalf("device indexes asked for: %v, want [1 2]", attaches)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("second attach not made: %v", attaches)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := c.Refresh(ctx); err != nil { // begun after both: the cloud shows them
		t.Fatal(err)
	}
	c.mu.Lock()
	n := len(c.eniOverlay)
	c.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d interface overlay entries after a re-read that shows them, want 0", n)
	}
}

// waitUnblocked waits until the actuator has no call in flight under key.
func waitUnblocked(t *testing.T, c *CloudActuator, key string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for c.input(time.Now()).Blocked[key] {
		if time.Now().After(deadline) {
			t.Fatalf("%s still in flight after 10 s", key)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
