package controller

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/egressip/egressip/internal/cloud"
	"github.com/egressip/egressip/internal/testutil/poll"
)

// TestCloudRefreshOnClock: the actuator's Start reads the interfaces at
// once, then every RefreshInterval of its clock, and after a failed read
// retries BackoffInitial later on that clock. The clock is a fake one.
func TestCloudRefreshOnClock(t *testing.T) {
	fc := newFakeCloud(testSubnet(t), 6)
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Spec: corev1.NodeSpec{ProviderID: fc.addInstance(1)}}
	reader := fake.NewClientBuilder().WithScheme(env.Scheme).WithObjects(n).Build()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	c := NewCloudActuator(reader, CloudConfig{Provider: fc, RefreshInterval: time.Minute, BackoffInitial: time.Second, Clock: clk})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Start: %v", err)
		}
	})
	reads := func(want int) {
		t.Helper()
		poll.Until(t, 20*time.Second, fmt.Sprintf("interface read %d", want), func() error {
			if got := len(fc.calls("Interfaces")); got != want {
				return fmt.Errorf("%d reads", got)
			}
			return nil
		})
	}
	reads(1)
	poll.Until(t, 20*time.Second, "the view ready", poll.Cond(c.Ready))
	if ifc, ok := c.view("n1"); !ok || ifc.ID == "" {
		t.Fatalf("view of n1 after the first read: %+v, %v", ifc, ok)
	}
	clk.Step(time.Minute - time.Millisecond)
	if got := len(fc.calls("Interfaces")); got != 1 {
		t.Fatalf("%d reads short of the refresh interval, want 1", got)
	}
	clk.Step(time.Millisecond)
	reads(2)

	// A failed read: retried BackoffInitial later, not at the next tick.
	fc.mu.Lock()
	fc.fail["Interfaces"] = []error{fmt.Errorf("injected: %w", cloud.ErrThrottled)}
	fc.mu.Unlock()
	clk.Step(time.Minute)
	reads(3)
	// The ticker is one waiter; the retry's wait is the second.
	poll.Until(t, 20*time.Second, "the retry waiting on the clock", func() error {
		if w := clk.Waiters(); w != 2 {
			return fmt.Errorf("%d clock waiters", w)
		}
		return nil
	})
	clk.Step(time.Second - time.Millisecond)
	if got := len(fc.calls("Interfaces")); got != 3 {
		t.Fatalf("%d reads short of the retry backoff, want 3", got)
	}
	clk.Step(time.Millisecond)
	reads(4)
}

// TestCloudBackoffOnClock: a failed call on an interface blocks it for
// BackoffInitial of the actuator's clock, a second failure for twice
// that, and a success lifts the block at once.
func TestCloudBackoffOnClock(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	c := NewCloudActuator(nil, CloudConfig{Provider: nil, BackoffInitial: time.Second, BackoffMax: time.Minute, Clock: clk})
	ctx := context.Background()
	blocked := func() bool { return c.input(clk.Now()).Blocked["eni-1"] }
	boom := errors.New("injected failure")

	c.failed(ctx, actionAssign, "", "eni-1", boom)
	if !blocked() || c.nextBackoff(clk.Now()) != time.Second {
		t.Fatalf("after a failure: blocked %v, next backoff %v; want blocked for 1s", blocked(), c.nextBackoff(clk.Now()))
	}
	clk.Step(time.Second - time.Millisecond)
	if !blocked() {
		t.Fatal("unblocked before BackoffInitial passed on the clock")
	}
	clk.Step(time.Millisecond)
	if blocked() || c.nextBackoff(clk.Now()) != 0 {
		t.Fatalf("still blocked (next backoff %v) after BackoffInitial", c.nextBackoff(clk.Now()))
	}

	c.failed(ctx, actionAssign, "", "eni-1", boom)
	if d := c.nextBackoff(clk.Now()); d != 2*time.Second {
		t.Fatalf("second failure: backoff %v, want 2s", d)
	}
	clk.Step(1500 * time.Millisecond)
	if !blocked() {
		t.Fatal("unblocked 1.5s into a 2s backoff")
	}
	c.applied("", "n1", "eni-1", nil, true)
	if blocked() || c.lastError["eni-1"] != "" {
		t.Fatalf("a success did not lift the block: blocked %v, last error %q", blocked(), c.lastError["eni-1"])
	}
}

// TestCloudStaleCreateErrorDropped: a pool's create or attach error (its
// CloudInterfaces condition reads InterfaceFailed with it) stays while a
// pass still wants an interface for the pool or one is being created, and
// is dropped once no pass wants one: the need that failed was met another
// way (in CI, an attach lost the race for a device index to a create that
// succeeded, and the condition stayed failed until the test gave up). An
// error of a delete is not dropped that way.
func TestCloudStaleCreateErrorDropped(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	c := NewCloudActuator(nil, CloudConfig{Provider: nil, BackoffInitial: time.Second, BackoffMax: time.Minute, Clock: clk})
	ctx := context.Background()
	poolErr := func(pool string) string { return c.input(clk.Now()).PoolError[pool] }
	c.poolFailed(ctx, "p1", backoffKey{backoffCreate, "p1"}, errors.New("attach at device index 2: in use"))
	c.poolFailed(ctx, "p2", backoffKey{backoffDelete, "eni-9"}, errors.New("delete eni-9: denied"))
	drop := func(wanted ...eniCreate) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.dropStaleCreateErrors(wanted)
	}

	drop(eniCreate{Pool: "p1", Node: "n1"})
	if poolErr("p1") == "" {
		t.Fatal("p1's create error dropped while a pass still wants an interface for p1")
	}
	c.mu.Lock()
	c.creating["n1/p1"] = true
	c.mu.Unlock()
	drop()
	if poolErr("p1") == "" {
		t.Fatal("p1's create error dropped while an interface for p1 is being created")
	}
	c.mu.Lock()
	delete(c.creating, "n1/p1")
	c.mu.Unlock()
	drop()
	if got := poolErr("p1"); got != "" {
		t.Fatalf("p1's create error %q kept although no pass wants an interface for p1", got)
	}
	if poolErr("p2") == "" {
		t.Fatal("p2's delete error dropped by the create rule")
	}
}
