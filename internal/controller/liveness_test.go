package controller

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/egressip/egressip/internal/report"
	"github.com/egressip/egressip/internal/testutil/poll"
)

// clockAgent serves a real report over HTTP on 127.0.0.1 for the
// poller's unit tests, counts the polls it answers, and can go away and
// come back on the same port, like a crashed and restarted agent.
type clockAgent struct {
	t    *testing.T
	node string
	addr string // host:port

	// hold, when set, makes every poll wait until release (an agent
	// that accepts the connection and does not answer).
	hold chan struct{}
	once sync.Once

	mu    sync.Mutex
	polls int
	bound []report.BoundIP
	srv   *http.Server
}

// release lets the held polls of a answer.
func (a *clockAgent) release() {
	if a.hold != nil {
		a.once.Do(func() { close(a.hold) })
	}
}

func newClockAgent(t *testing.T, node string) *clockAgent {
	a := &clockAgent{t: t, node: node, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t)))}
	a.start()
	t.Cleanup(a.stop)
	return a
}

func (a *clockAgent) port() int {
	_, p, _ := net.SplitHostPort(a.addr)
	n, _ := strconv.Atoi(p)
	return n
}

func (a *clockAgent) start() {
	a.t.Helper()
	l, err := net.Listen("tcp", a.addr)
	if err != nil {
		a.t.Fatal(err)
	}
	srv := &http.Server{Handler: report.PollHandler(func(report.Poll) report.Report {
		a.mu.Lock()
		a.polls++
		r := report.Report{Node: a.node, Instance: "i1", Bound: append([]report.BoundIP(nil), a.bound...)}
		a.mu.Unlock()
		if a.hold != nil {
			<-a.hold
		}
		return r
	}), ReadHeaderTimeout: time.Second}
	a.mu.Lock()
	a.srv = srv
	a.mu.Unlock()
	go func() { _ = srv.Serve(l) }()
}

func (a *clockAgent) stop() {
	a.mu.Lock()
	srv := a.srv
	a.srv = nil
	a.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
}

func (a *clockAgent) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.polls
}

func (a *clockAgent) bind(ip string) {
	a.mu.Lock()
	a.bound = append(a.bound, report.BoundIP{IP: netip.MustParseAddr(ip)})
	a.mu.Unlock()
}

// newClockLiveness returns a poller on a fake clock over one Node whose
// InternalIP is 127.0.0.1, where a answers.
func newClockLiveness(t *testing.T, a *clockAgent, cfg LivenessConfig) (*Liveness, *clocktesting.FakeClock) {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: a.node}}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}}
	reader := fake.NewClientBuilder().WithScheme(env.Scheme).WithObjects(n).Build()
	cfg.Port, cfg.Clock = a.port(), clk
	return NewLiveness(reader, cfg), clk
}

// inFlight reports whether node's round poll has not ended yet.
func inFlight(l *Liveness, node string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.inFlight[node]
}

// signalled reports whether the poller asked for a pass since the last call.
func signalled(l *Liveness) bool {
	select {
	case <-l.Events:
		return true
	default:
		return false
	}
}

// signalledWithin reports whether the poller asks for a pass within d of
// real time (for signals sent from the poller's own goroutines).
func signalledWithin(l *Liveness, d time.Duration) bool {
	select {
	case <-l.Events:
		return true
	case <-time.After(d):
		return false
	}
}

// TestLivenessDeadAfterOnClock: an agent that stops answering is declared
// dead only once it failed FailureThreshold polls in a row and DeadAfter
// has passed on the poller's clock since its last answer; it is alive
// again at its first answer. The clock is a fake one, stepped by the test.
func TestLivenessDeadAfterOnClock(t *testing.T) {
	a := newClockAgent(t, "n1")
	l, clk := newClockLiveness(t, a, LivenessConfig{DeadAfter: 3 * time.Second, FailureThreshold: 3, Timeout: 5 * time.Second})
	ctx := context.Background()
	l.pollAll(ctx)
	if st := l.State("n1"); !st.Known || st.Dead || !st.LastSeen.Equal(clk.Now()) {
		t.Fatalf("after an answer: %+v, want known, alive, last seen now (%v)", st, clk.Now())
	}
	if !signalled(l) {
		t.Fatal("no pass asked for when the agent became known")
	}
	seen := clk.Now()
	a.stop()
	for i := range 5 {
		l.pollAll(ctx)
		if st := l.State("n1"); st.Dead || st.failures != i+1 {
			t.Fatalf("poll %d without time passing: %+v, want alive with %d failures", i+1, st, i+1)
		}
	}
	clk.Step(3*time.Second - time.Millisecond)
	l.pollAll(ctx)
	if st := l.State("n1"); st.Dead || signalled(l) {
		t.Fatalf("%v after the last answer (DeadAfter 3s): %+v, want alive and no pass", clk.Since(seen), st)
	}
	clk.Step(time.Millisecond)
	l.pollAll(ctx)
	if st := l.State("n1"); !st.Dead || !st.LastSeen.Equal(seen) {
		t.Fatalf("3s after the last answer and 7 failures: %+v, want dead, last seen %v", st, seen)
	}
	// The death timer's goroutine sets Dead, then asks for the pass after
	// releasing the lock: wait for the signal rather than race it.
	if !signalledWithin(l, 10*time.Second) {
		t.Fatal("no pass asked for when the agent died")
	}
	a.start()
	l.pollAll(ctx)
	if st := l.State("n1"); st.Dead || st.failures != 0 || !st.LastSeen.Equal(clk.Now()) {
		t.Fatalf("after the agent answered again: %+v, want alive", st)
	}
	if !signalled(l) {
		t.Fatal("no pass asked for when the agent came back")
	}
}

// TestLivenessPollsOnInterval: Start polls at once, then once per
// Interval of its clock (a fixed rate): stepping the fake clock short of
// the interval brings no poll, stepping to it brings one.
func TestLivenessPollsOnInterval(t *testing.T) {
	a := newClockAgent(t, "n1")
	l, clk := newClockLiveness(t, a, LivenessConfig{Interval: time.Second, Timeout: 5 * time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Start: %v", err)
		}
	})
	for want := 1; want <= 3; want++ {
		// The agent's count says poll want reached it; the poll has ended
		// once the agent is no longer in flight (else the next round
		// would skip it).
		poll.Until(t, 20*time.Second, fmt.Sprintf("poll %d done and the poller waiting on its clock", want), func() error {
			if n := a.count(); n != want || !clk.HasWaiters() || inFlight(l, "n1") {
				return fmt.Errorf("%d polls, clock waiters %d, in flight %v", n, clk.Waiters(), inFlight(l, "n1"))
			}
			return nil
		})
		clk.Step(time.Second - time.Millisecond)
		if n := a.count(); n != want {
			t.Fatalf("%d polls after stepping the clock short of the interval, want %d", n, want)
		}
		clk.Step(time.Millisecond)
	}
}

// TestLivenessExpediteOnClock: Expedite polls the Node every 100 ms of the
// poller's clock, ends as soon as the Node's report changes, and ends by
// itself after 5 s of that clock (50 polls) when it does not.
func TestLivenessExpediteOnClock(t *testing.T) {
	a := newClockAgent(t, "n1")
	l, clk := newClockLiveness(t, a, LivenessConfig{Timeout: 5 * time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	l.mu.Lock()
	l.runCtx = ctx // as Start does, without its periodic polls
	l.mu.Unlock()
	l.pollAll(ctx)
	expedited := func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.expedited["n1"]
	}
	// step waits until the expedite loop waits on the clock, steps it by
	// one expedite interval, and waits for the poll that brings.
	step := func(polls int) {
		t.Helper()
		poll.Until(t, 20*time.Second, "the expedite loop waiting on its clock", poll.Cond(clk.HasWaiters))
		if n := a.count(); n != polls-1 {
			t.Fatalf("%d polls before the clock moved, want %d", n, polls-1)
		}
		clk.Step(expediteInterval)
		poll.Until(t, 20*time.Second, fmt.Sprintf("poll %d", polls), func() error {
			if n := a.count(); n != polls {
				return fmt.Errorf("%d polls", n)
			}
			return nil
		})
	}

	l.Expedite("n1")
	step(2)
	step(3)
	a.bind("192.0.2.10")
	step(4)
	poll.Until(t, 20*time.Second, "the expedite to end at the changed report", poll.Cond(func() bool { return !expedited() }))
	if st := l.State("n1"); len(st.Report.Bound) != 1 {
		t.Fatalf("the expedited poll did not record the new report: %+v", st.Report)
	}

	l.Expedite("n1")
	for i := range 50 {
		step(5 + i)
	}
	poll.Until(t, 20*time.Second, "the expedite to end after 5 s of its clock", poll.Cond(func() bool { return !expedited() }))
	if clk.HasWaiters() {
		t.Fatal("the expedite loop still waits on the clock after 5 s")
	}
	if n := a.count(); n != 54 {
		t.Fatalf("%d polls, want 54 (4, then 50 in 5 s at 100 ms)", n)
	}
}

// TestLivenessDeadAtDeadlineOnClock: an agent that has failed
// FailureThreshold polls before DeadAfter has passed is declared dead when
// DeadAfter runs out, by the poller's timer, without waiting for another
// failed poll; one that answers before then is not.
func TestLivenessDeadAtDeadlineOnClock(t *testing.T) {
	a := newClockAgent(t, "n1")
	l, clk := newClockLiveness(t, a, LivenessConfig{DeadAfter: 2 * time.Second, FailureThreshold: 3, Timeout: 5 * time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	l.pollAll(ctx)
	signalled(l)
	seen := clk.Now()
	a.stop()
	for range 3 {
		l.pollAll(ctx)
	}
	poll.Until(t, 20*time.Second, "the dead-after timer waiting on the clock", poll.Cond(clk.HasWaiters))
	clk.Step(2*time.Second - time.Millisecond)
	if st := l.State("n1"); st.Dead || signalled(l) {
		t.Fatalf("%v after the last answer: %+v, want alive and no pass", clk.Since(seen), st)
	}
	clk.Step(time.Millisecond)
	poll.Until(t, 20*time.Second, "the agent declared dead at dead-after, with no further poll", func() error {
		if st := l.State("n1"); !st.Dead {
			return fmt.Errorf("state %+v", st)
		}
		return nil
	})
	if !signalled(l) {
		t.Fatal("no pass asked for when the timer declared the agent dead")
	}

	// Answering before the deadline cancels it.
	a.start()
	l.pollAll(ctx)
	signalled(l)
	a.stop()
	for range 3 {
		l.pollAll(ctx)
	}
	poll.Until(t, 20*time.Second, "the second dead-after timer waiting on the clock", poll.Cond(clk.HasWaiters))
	a.start()
	l.pollAll(ctx)
	clk.Step(2 * time.Second)
	poll.Until(t, 20*time.Second, "the timer to have run", poll.Cond(func() bool { return !clk.HasWaiters() }))
	if st := l.State("n1"); st.Dead || st.failures != 0 {
		t.Fatalf("an agent that answered before dead-after: %+v, want alive", st)
	}
}

// TestLivenessSilentAgentHoldsUpNoRound: a poll that waits for an agent
// that does not answer keeps only that agent waiting. The next round
// comes on time and polls the other agents, and skips the silent one
// while its poll waits (one poll at a time per agent).
func TestLivenessSilentAgentHoldsUpNoRound(t *testing.T) {
	fast := newClockAgent(t, "fast")
	slow := &clockAgent{t: t, node: "slow", addr: net.JoinHostPort("127.0.0.2", strconv.Itoa(fast.port())), hold: make(chan struct{})}
	slow.start()
	t.Cleanup(slow.stop)
	t.Cleanup(slow.release)
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	var objs []client.Object
	for name, ip := range map[string]string{"fast": "127.0.0.1", "slow": "127.0.0.2"} {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}
		objs = append(objs, n)
	}
	reader := fake.NewClientBuilder().WithScheme(env.Scheme).WithObjects(objs...).Build()
	l := NewLiveness(reader, LivenessConfig{Interval: time.Second, Timeout: 30 * time.Second, Port: fast.port(), Clock: clk})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Start(ctx) }()
	t.Cleanup(func() {
		slow.release()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Start: %v", err)
		}
	})
	for want := 1; want <= 3; want++ {
		poll.Until(t, 20*time.Second, fmt.Sprintf("round %d polled the answering agent, the silent one polled once", want), func() error {
			if n, m := fast.count(), slow.count(); n != want || m != 1 || inFlight(l, "fast") || !inFlight(l, "slow") {
				return fmt.Errorf("%d polls of the answering agent, %d of the silent one, in flight: %v, %v",
					n, m, inFlight(l, "fast"), inFlight(l, "slow"))
			}
			return nil
		})
		clk.Step(time.Second)
	}
}
