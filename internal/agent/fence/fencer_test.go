package fence

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

func TestSelectPeers(t *testing.T) {
	var cands []Candidate
	for i := range 20 {
		cands = append(cands, Candidate{Node: fmt.Sprintf("n%02d", i), Addr: netip.AddrFrom4([4]byte{192, 0, 2, byte(10 + i)})})
	}
	got := SelectPeers("n03", cands, 5)
	if len(got) != 5 {
		t.Fatalf("got %d peers, want 5", len(got))
	}
	for _, p := range got {
		if p.Node == "n03" {
			t.Fatal("self chosen as a peer")
		}
	}
	// Order-independent.
	rev := slices.Clone(cands)
	slices.Reverse(rev)
	if !slices.Equal(got, SelectPeers("n03", rev, 5)) {
		t.Fatal("the choice depends on the order of the candidates")
	}
	// Removing a Node that is not a peer changes nothing; removing a peer
	// changes one member.
	var notPeer, peer string
	for _, c := range cands {
		if c.Node == "n03" {
			continue
		}
		if slices.ContainsFunc(got, func(p Candidate) bool { return p.Node == c.Node }) {
			peer = c.Node
		} else {
			notPeer = c.Node
		}
	}
	without := func(n string) []Candidate {
		return slices.DeleteFunc(slices.Clone(cands), func(c Candidate) bool { return c.Node == n })
	}
	if !slices.Equal(got, SelectPeers("n03", without(notPeer), 5)) {
		t.Fatalf("removing %s (not a peer) changed the set", notPeer)
	}
	after := SelectPeers("n03", without(peer), 5)
	common := 0
	for _, p := range after {
		if slices.Contains(got, p) {
			common++
		}
	}
	if common != 4 {
		t.Fatalf("removing peer %s kept %d of 5 members, want 4: %v -> %v", peer, common, got, after)
	}
	// Different Nodes choose different sets (not all the same five).
	if slices.Equal(SelectPeers("n04", cands, 5), SelectPeers("n05", cands, 5)) && slices.Equal(SelectPeers("n05", cands, 5), SelectPeers("n06", cands, 5)) {
		t.Fatal("every Node chose the same peers")
	}
	// Small clusters: fewer peers; no address: never a peer.
	if got := SelectPeers("n00", cands[:3], 5); len(got) != 2 {
		t.Fatalf("3 Nodes: %d peers, want 2", len(got))
	}
	if got := SelectPeers("n00", []Candidate{{Node: "n01"}}, 5); len(got) != 0 {
		t.Fatalf("peer without address chosen: %v", got)
	}
}

// peerServer is a real HTTP server on 127.0.0.x:port serving PeerHandler.
type peerServer struct {
	node     string
	addr     netip.Addr
	lastPoll atomic.Int64 // unix nanoseconds
	srv      *http.Server
}

func startPeers(t *testing.T, n int) (int, []*peerServer) {
	t.Helper()
	port := 0
	var ps []*peerServer
	for i := range n {
		addr := netip.AddrFrom4([4]byte{127, 0, 0, byte(2 + i)})
		ln, err := net.Listen("tcp", net.JoinHostPort(addr.String(), fmt.Sprint(port)))
		if err != nil {
			t.Fatal(err)
		}
		port = ln.Addr().(*net.TCPAddr).Port
		p := &peerServer{node: fmt.Sprintf("peer%d", i), addr: addr}
		p.lastPoll.Store(time.Now().UnixNano())
		p.srv = &http.Server{Handler: PeerHandler(p.node, func() time.Time { return time.Unix(0, p.lastPoll.Load()) }, func() bool { return false }, nil),
			ReadHeaderTimeout: time.Second}
		go func() { _ = p.srv.Serve(ln) }()
		t.Cleanup(func() { _ = p.srv.Close() })
		ps = append(ps, p)
	}
	return port, ps
}

// TestFencer runs the Fencer against real peer servers on loopback: a
// controller that keeps polling the peers but not this Node makes it fence;
// peers whose polls stopped too (controller gone) do not; stopped peers
// (isolation) do; a poll lifts the fence.
func TestFencer(t *testing.T) {
	port, peers := startPeers(t, 3)
	cands := func(context.Context) []Candidate {
		var c []Candidate
		for _, p := range peers {
			c = append(c, Candidate{Node: p.node, Addr: p.addr})
		}
		return append(c, Candidate{Node: "self", Addr: netip.MustParseAddr("127.0.0.1")})
	}
	var selfPoll atomic.Int64
	selfPoll.Store(time.Now().UnixNano())
	var apiDown atomic.Bool
	var mu sync.Mutex
	var changes []Decision
	f := New(Options{
		Config:     DefaultConfig(),
		Node:       "self",
		Port:       port,
		LastPoll:   func() time.Time { return time.Unix(0, selfPoll.Load()) },
		Candidates: cands,
		ProbeAPI: func(ctx context.Context) error {
			if apiDown.Load() {
				<-ctx.Done()
				return errors.New("API server unreachable")
			}
			return nil
		},
		OnChange: func(_ context.Context, d Decision) { mu.Lock(); changes = append(changes, d); mu.Unlock() },
	})
	ctx := t.Context()
	// Steady state: polled, nothing probed.
	before := counter(peerProbes.WithLabelValues(resultOK)) + counter(peerProbes.WithLabelValues(resultError))
	if d := f.Step(ctx); d.Fence || d.Reason != v1.ReasonPolled {
		t.Fatalf("polled: %+v", d)
	}
	if after := counter(peerProbes.WithLabelValues(resultOK)) + counter(peerProbes.WithLabelValues(resultError)); after != before {
		t.Fatalf("peers probed in steady state (%v -> %v)", before, after)
	}
	// Polls of this Node stopped 2.1 s ago; API down; the peers were
	// polled 200 ms ago: the controller is alive and cannot reach us.
	apiDown.Store(true)
	selfPoll.Store(time.Now().Add(-2100 * time.Millisecond).UnixNano())
	for _, p := range peers {
		p.lastPoll.Store(time.Now().Add(-200 * time.Millisecond).UnixNano())
	}
	if d := f.Step(ctx); !d.Fence || d.Reason != v1.ReasonControllerPollsOthers {
		t.Fatalf("cut off: %+v", d)
	}
	if !f.Fenced() {
		t.Fatal("Fenced() false after a fence")
	}
	// The API server answers again: the fence is lifted.
	apiDown.Store(false)
	if d := f.Step(ctx); d.Fence || d.Reason != v1.ReasonAPIServerReachable {
		t.Fatalf("API back: %+v", d)
	}
	// Polled again (forgets the probes), then the controller is gone: the
	// peers' last polls are as old as ours.
	selfPoll.Store(time.Now().UnixNano())
	if d := f.Step(ctx); d.Fence || d.Reason != v1.ReasonPolled {
		t.Fatalf("polled: %+v", d)
	}
	apiDown.Store(true)
	last := time.Now().Add(-2500 * time.Millisecond)
	selfPoll.Store(last.UnixNano())
	for _, p := range peers {
		p.lastPoll.Store(last.Add(20 * time.Millisecond).UnixNano())
	}
	if d := f.Step(ctx); d.Fence || d.Reason != v1.ReasonControllerGone {
		t.Fatalf("controller gone: %+v", d)
	}
	// Isolated: the peers stop answering. One failed probe round loses
	// no peer (their answers of the step above stand); once those are
	// older than three probe intervals, the peers are lost.
	for _, p := range peers {
		_ = p.srv.Close()
	}
	closed := time.Now()
	if d := f.Step(ctx); d.Fence {
		t.Fatalf("fenced after one failed probe round: %+v", d)
	}
	stale := 3 * DefaultConfig().ProbeInterval
	var d Decision
	for d = f.Step(ctx); !d.Fence && time.Since(closed) < 4*stale; d = f.Step(ctx) {
		time.Sleep(DefaultConfig().ProbeInterval / 5) // the probe loop's own pace, shortened
	}
	if !d.Fence || d.Reason != v1.ReasonPeersLost {
		t.Fatalf("isolated for %v: %+v", time.Since(closed), d)
	}
	// A poll arrives: lifted.
	selfPoll.Store(time.Now().UnixNano())
	if d := f.Step(ctx); d.Fence || d.Reason != v1.ReasonPolled {
		t.Fatalf("polled again: %+v", d)
	}
	mu.Lock()
	defer mu.Unlock()
	var got []string
	for _, d := range changes {
		got = append(got, fmt.Sprintf("%v/%s", d.Fence, d.Reason))
	}
	want := []string{"true/" + v1.ReasonControllerPollsOthers, "false/" + v1.ReasonAPIServerReachable, "true/" + v1.ReasonPeersLost, "false/" + v1.ReasonPolled}
	if !slices.Equal(got, want) {
		t.Fatalf("OnChange calls %v, want %v", got, want)
	}
}
