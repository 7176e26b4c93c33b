package webhook_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/testutil/poll"
)

// warnings records the admission warnings the API server returns
// (rest.WarningHandler).
type warnings struct {
	mu   sync.Mutex
	list []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	w.list = append(w.list, text)
	w.mu.Unlock()
}

// all returns the warnings recorded so far, keeping them.
func (w *warnings) all() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.list...)
}

// take returns the warnings recorded so far and forgets them.
func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.list
	w.list = nil
	return out
}

// warningClient is a client whose requests' admission warnings land in w.
func warningClient(t *testing.T) (client.Client, *warnings) {
	t.Helper()
	w := &warnings{}
	cfg := rest.CopyConfig(env.Config)
	cfg.WarningHandler = w
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c, w
}

func containsWarning(ws []string, sub string) bool {
	for _, w := range ws {
		if strings.Contains(w, sub) {
			return true
		}
	}
	return false
}

// TestEgressIPChangedWarnings (issue 15 fault 4): edits that change the
// source address of an Egress that has one are admitted with a warning
// naming the old and the new address; so are a spec.egressIP another
// Egress already uses (sharing stays allowed) and a namespaceSelector {}
// that selects every namespace. Edits that keep the address warn nothing.
func TestEgressIPChangedWarnings(t *testing.T) {
	c, w := warningClient(t)
	ctx := context.Background()
	create(t, pool("warn-a", v1.IPRange{CIDR: "203.0.113.64/28"}), "")
	create(t, pool("warn-b", v1.IPRange{CIDR: "203.0.113.80/28"}), "")
	create(t, egress("warn-1", "warn-a", "203.0.113.70"), "")

	// A second Egress naming the same address: admitted, with a warning
	// once the webhook's cache has the first.
	var ws []string
	// Retried for up to 20 s, 200 ms apart; the last warnings are judged below.
	var e2 *v1.Egress
	_ = poll.Wait(ctx, 200*time.Millisecond, 20*time.Second, func() error {
		if e2 != nil {
			if err := c.Delete(ctx, e2); err != nil {
				t.Fatal(err)
			}
		}
		e2 = egress("warn-2", "warn-a", "203.0.113.70")
		if err := c.Create(ctx, e2); err != nil {
			t.Fatalf("create warn-2: %v", err)
		}
		if ws = w.take(); !containsWarning(ws, "egressIP 203.0.113.70 is already used by Egress warn-1") {
			return fmt.Errorf("warnings %q", ws)
		}
		return nil
	})
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), e2) })
	if !containsWarning(ws, "egressIP 203.0.113.70 is already used by Egress warn-1: the Egresses share it") {
		t.Fatalf("create of a shared egressIP: warnings %q", ws)
	}

	// Wait for the controller to give warn-1 its address (status).
	var e1 v1.Egress
	poll.Until(t, 20*time.Second, "warn-1's status.egressIP", func() error {
		if err := env.Client.Get(ctx, client.ObjectKey{Name: "warn-1"}, &e1); err != nil {
			t.Fatal(err)
		}
		if e1.Status.EgressIP != "203.0.113.70" {
			return fmt.Errorf("warn-1 has no status.egressIP: %+v", e1.Status)
		}
		return nil
	})
	update := func(mutate func(*v1.Egress)) []string {
		t.Helper()
		var ws []string
		// Up to 50 tries 100 ms apart: a conflict with the controller's
		// status write is retried.
		poll.Until(t, 5*time.Second, "update of warn-1 without a conflict", func() error {
			var e v1.Egress
			if err := c.Get(ctx, client.ObjectKey{Name: "warn-1"}, &e); err != nil {
				t.Fatal(err)
			}
			mutate(&e)
			w.take()
			if err := c.Update(ctx, &e); err != nil {
				return err
			}
			ws = w.take()
			return nil
		})
		return ws
	}

	// A label edit keeps the address: no warning.
	if ws := update(func(e *v1.Egress) { e.Labels = map[string]string{"x": "y"} }); len(ws) != 0 {
		t.Fatalf("label edit: warnings %q", ws)
	}
	ws = update(func(e *v1.Egress) { e.Spec.EgressIP = "203.0.113.71" })
	if !containsWarning(ws, "changes the source address of Egress warn-1 from 203.0.113.70 to 203.0.113.71") {
		t.Fatalf("spec.egressIP edit: warnings %q", ws)
	}
	t.Logf("spec.egressIP edit warns: %q", ws)
	ws = update(func(e *v1.Egress) { e.Spec.EgressIP, e.Spec.ExternalIPPool = "", "warn-b" })
	// From whichever address the controller gave warn-1 after the last edit.
	if !containsWarning(ws, `changes the source address of Egress warn-1 from 203.0.113.7`) || !containsWarning(ws, `to an address of ExternalIPPool "warn-b"`) {
		t.Fatalf("spec.externalIPPool edit: warnings %q", ws)
	}
	t.Logf("spec.externalIPPool edit warns: %q", ws)
	// A switch to spec.ips warns with the addresses the Egress has now
	// (the fresh-user trial saw the single-IP warning with pool "").
	ws = update(func(e *v1.Egress) { e.Spec.ExternalIPPool, e.Spec.IPs = "", []v1.EgressIPSource{{Pool: "warn-b"}} })
	if !containsWarning(ws, "this edit of Egress warn-1's IPs may change its source addresses (now 203.0.113.") || containsWarning(ws, `ExternalIPPool ""`) {
		t.Fatalf("switch to spec.ips: warnings %q", ws)
	}
	t.Logf("switch to spec.ips warns: %q", ws)

	// Selectors that select everything warn on create; a podSelector with
	// labels does not. createWith creates an Egress with appliedTo at and
	// returns the warnings of the create.
	createWith := func(name string, at v1.AppliedTo) []string {
		t.Helper()
		e := egress(name, "warn-a", "")
		e.Spec.AppliedTo = at
		if err := c.Create(ctx, e); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), e) })
		return w.take()
	}
	everyNS := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpExists}}}
	for _, tc := range []struct {
		name string
		at   v1.AppliedTo
		want string // "" no "selects every" warning
	}{
		{"warn-all-ns", v1.AppliedTo{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: &metav1.LabelSelector{}}, "namespaceSelector {} selects every namespace"},
		{"warn-ns-exists", v1.AppliedTo{NamespaceSelector: everyNS, PodSelector: &metav1.LabelSelector{}}, "which every namespace has"},
		{"warn-all-pods", v1.AppliedTo{PodSelector: &metav1.LabelSelector{}}, "podSelector {} without a namespaceSelector selects every Pod"},
		{"warn-some-pods", v1.AppliedTo{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}, ""},
	} {
		ws := createWith(tc.name, tc.at)
		if tc.want == "" && containsWarning(ws, "selects every") || tc.want != "" && !containsWarning(ws, tc.want) {
			t.Fatalf("%s: warnings %q, want %q", tc.name, ws, tc.want)
		}
	}
}
