package controller

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// Pure tests of the write ledger and of who keeps a shared status address
// (no API server; the envtest proof is TestBurstNoSharedAllocation).

func ledgerPool() v1.ExternalIPPool {
	return v1.ExternalIPPool{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: v1.ExternalIPPoolSpec{IPRanges: []v1.IPRange{{CIDR: "198.51.100.0/24"}}}}
}

func ledgerEgress(name, uid, rv string) v1.Egress {
	return v1.Egress{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(uid), ResourceVersion: rv, CreationTimestamp: metav1.NewTime(time.Unix(1000, 0))},
		Spec: v1.EgressSpec{ExternalIPPool: "p"}}
}

func ledgerPlan(egs []v1.Egress) passOutput {
	return plan(passInput{Pools: []v1.ExternalIPPool{ledgerPool()}, Egresses: egs, Nodes: []corev1.Node{planNode("n1")}, Agents: alive, Config: PassConfig{DefaultCapacity: 10}})
}

// TestBurstNoSharedAllocationStaleCache is the cause of issue 23 fault 1
// in one pure step: a pass gives b 198.51.100.1 and writes it; the next
// pass reads a cache that does not show that write yet, and a, created
// in the same second and sorting first, arrives. Without the ledger the
// second pass gives a the same address; with it, a gets .2.
func TestBurstNoSharedAllocationStaleCache(t *testing.T) {
	b := ledgerEgress("b", "uid-b", "10")
	out := ledgerPlan([]v1.Egress{b})
	if got := out.Egresses["b"].Status.EgressIP; got != "198.51.100.1" {
		t.Fatalf("first pass gave b %q, want 198.51.100.1", got)
	}
	// What the API server returned for b's status patch.
	wrote := b.DeepCopy()
	wrote.Status, wrote.ResourceVersion = out.Egresses["b"].Status, "12"

	stale := []v1.Egress{ledgerEgress("a", "uid-a", "11"), b}
	if got := ledgerPlan(stale).Egresses["a"].Status.EgressIP; got != "198.51.100.1" {
		t.Fatalf("without the ledger the stale pass gave a %q; the reproduction expects the shared 198.51.100.1", got)
	}

	var l writeLedger
	l.record(wrote)
	n, err := l.overlay(stale)
	if err != nil || n != 1 {
		t.Fatalf("overlay = %d, %v; want 1 replaced", n, err)
	}
	out = ledgerPlan(stale)
	if a, b := out.Egresses["a"].Status.EgressIP, out.Egresses["b"].Status.EgressIP; a != "198.51.100.2" || b != "198.51.100.1" {
		t.Errorf("with the ledger: a=%s b=%s, want a=198.51.100.2 b=198.51.100.1", a, b)
	}
	if l.len() != 1 {
		t.Errorf("ledger forgot b's write before the cache showed it")
	}

	// The cache catches up: the entry goes.
	fresh := []v1.Egress{ledgerEgress("a", "uid-a", "13"), *wrote}
	if n, err := l.overlay(fresh); err != nil || n != 0 || l.len() != 0 {
		t.Errorf("after catch-up: replaced %d, err %v, %d left; want 0, nil, 0", n, err, l.len())
	}
}

func TestWriteLedgerForgets(t *testing.T) {
	var l writeLedger
	w := ledgerEgress("x", "uid-x", "20")
	l.record(&w)
	// Deleted from the cache: forgotten.
	if n, err := l.overlay([]v1.Egress{ledgerEgress("y", "uid-y", "5")}); err != nil || n != 0 || l.len() != 0 {
		t.Errorf("deleted Egress: replaced %d, err %v, %d left", n, err, l.len())
	}
	// A newer version from someone else: forgotten, the cache's copy kept.
	l.record(&w)
	c := []v1.Egress{ledgerEgress("x", "uid-x", "25")}
	c[0].Status.EgressIP = "198.51.100.9"
	if n, err := l.overlay(c); err != nil || n != 0 || l.len() != 0 || c[0].Status.EgressIP != "198.51.100.9" {
		t.Errorf("newer cache copy: replaced %d, err %v, %d left, ip %s", n, err, l.len(), c[0].Status.EgressIP)
	}
	// A resource version that is not an integer is an error, not a guess.
	l.record(&w)
	if _, err := l.overlay([]v1.Egress{ledgerEgress("x", "uid-x", "abc")}); err == nil || !strings.Contains(err.Error(), "Egress x") {
		t.Errorf("bad resource version: err %v, want one naming Egress x", err)
	}
}

func TestCaughtUp(t *testing.T) {
	live := []v1.Egress{ledgerEgress("a", "uid-a", "30"), ledgerEgress("b", "uid-b", "31")}
	for _, tc := range []struct {
		name   string
		cached []v1.Egress
		want   bool
		lag    string
	}{
		{"same", []v1.Egress{ledgerEgress("a", "uid-a", "30"), ledgerEgress("b", "uid-b", "31")}, true, ""},
		{"newer and extra", []v1.Egress{ledgerEgress("a", "uid-a", "40"), ledgerEgress("b", "uid-b", "31"), ledgerEgress("c", "uid-c", "41")}, true, ""},
		{"older", []v1.Egress{ledgerEgress("a", "uid-a", "29"), ledgerEgress("b", "uid-b", "31")}, false, "Egress a at resourceVersion 29"},
		{"missing", []v1.Egress{ledgerEgress("a", "uid-a", "30")}, false, "Egress b (resourceVersion 31) not in the cache"},
		{"recreated", []v1.Egress{ledgerEgress("a", "uid-a", "30"), ledgerEgress("b", "uid-b-old", "20")}, false, "Egress b"},
	} {
		ok, lag, missing, err := caughtUp(tc.cached, live)
		if tc.name == "missing" && (len(missing) != 1 || missing[0].Name != "b") {
			t.Errorf("missing: %v, want b", missing)
		}
		if err != nil || ok != tc.want || !strings.Contains(lag, tc.lag) {
			t.Errorf("%s: caughtUp = %v, %q, %v; want %v, %q", tc.name, ok, lag, err, tc.want, tc.lag)
		}
	}
}

// TestBurstNoSharedAllocationInUseKeeps: when two Egresses' statuses do
// hold one auto address, the one in use keeps it, whatever their ages.
func TestBurstNoSharedAllocationInUseKeeps(t *testing.T) {
	cond := func(typ string, s metav1.ConditionStatus, at int64) metav1.Condition {
		return metav1.Condition{Type: typ, Status: s, Reason: "R", LastTransitionTime: metav1.NewTime(time.Unix(at, 0))}
	}
	older := ledgerEgress("older", "uid-o", "1")
	younger := ledgerEgress("younger", "uid-y", "2")
	younger.CreationTimestamp = metav1.NewTime(time.Unix(2000, 0))
	for _, e := range []*v1.Egress{&older, &younger} {
		e.Status.EgressIP, e.Status.EgressNode = "198.51.100.1", "n1"
	}
	for _, tc := range []struct {
		name       string
		o, y       []metav1.Condition
		wantKeeper string
	}{
		{"younger Ready", []metav1.Condition{cond(v1.ConditionAssigned, metav1.ConditionTrue, 5)}, []metav1.Condition{cond(v1.ConditionReady, metav1.ConditionTrue, 9)}, "younger"},
		{"younger assigned", []metav1.Condition{cond(v1.ConditionAssigned, metav1.ConditionFalse, 5)}, []metav1.Condition{cond(v1.ConditionAssigned, metav1.ConditionTrue, 9)}, "younger"},
		{"younger allocated first", []metav1.Condition{cond(v1.ConditionIPAllocated, metav1.ConditionTrue, 9)}, []metav1.Condition{cond(v1.ConditionIPAllocated, metav1.ConditionTrue, 5)}, "younger"},
		{"tie: older", nil, nil, "older"},
	} {
		o, y := *older.DeepCopy(), *younger.DeepCopy()
		o.Status.Conditions, y.Status.Conditions = tc.o, tc.y
		out := ledgerPlan([]v1.Egress{o, y})
		loser := "older"
		if tc.wantKeeper == "older" {
			loser = "younger"
		}
		if k, l := out.Egresses[tc.wantKeeper].Status.EgressIP, out.Egresses[loser].Status.EgressIP; k != "198.51.100.1" || l == "198.51.100.1" || l == "" {
			t.Errorf("%s: %s=%s %s=%s; want %s to keep 198.51.100.1 and %s a new address", tc.name, tc.wantKeeper, k, loser, l, tc.wantKeeper, loser)
		}
	}
}

// TestReadYourWritesForgetsDeleted: the wait for the cache (first pass as
// leader) waits for an Egress of the consistent read the cache does not
// hold yet, and stops waiting for it once the API server says it is gone.
// The API server is controller-runtime's fake client here (a unit table;
// the envtest run of this path is TestBurstNoSharedAllocation's leader
// change).
func TestReadYourWritesForgetsDeleted(t *testing.T) {
	a, b := ledgerEgress("a", "uid-a", ""), ledgerEgress("b", "uid-b", "")
	api := fake.NewClientBuilder().WithScheme(env.Scheme).WithObjects(&a, &b).Build()
	ctx := context.Background()
	var live v1.EgressList
	if err := api.List(ctx, &live); err != nil {
		t.Fatal(err)
	}
	r := &PassReconciler{APIReader: api}
	cache := []v1.Egress{live.Items[0]} // the cache has not seen b yet
	if wait, err := r.readYourWrites(ctx, cache); err != nil || !wait {
		t.Fatalf("b not in the cache: wait %v, err %v; want to wait", wait, err)
	}
	if err := api.Delete(ctx, &live.Items[1]); err != nil {
		t.Fatal(err)
	}
	if wait, err := r.readYourWrites(ctx, cache); err != nil || wait {
		t.Fatalf("b deleted: wait %v, err %v; want no wait", wait, err)
	}
	if !r.synced {
		t.Error("not synced after the cache caught up")
	}
}
