package podstart

import (
	"context"
	"errors"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/egressip/egressip/internal/podstart/cniapi"
)

// slowGate answers after its context ends, with the context's error.
type slowGate struct{ added chan cniapi.Request }

func (g slowGate) PodAdded(ctx context.Context, req cniapi.Request) ([]string, error) {
	g.added <- req
	if req.Name == "fast" {
		return []string{"e1"}, nil
	}
	<-ctx.Done()
	return nil, errors.New("not classified in time")
}
func (slowGate) PodDeleted(context.Context, cniapi.Request) error { return nil }

// TestServeProtocol runs the socket server and the client together: a
// valid ADD gets the Gate's Egresses; an ADD without a name or IP is
// refused before the Gate with a clear error; a plugin's timeout bounds
// the Gate so that its reason arrives before the plugin gives up; a socket
// that does not exist is ErrNoAgent; the socket file is removed at the end.
func TestServeProtocol(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s", "agent.sock")
	g := slowGate{added: make(chan cniapi.Request, 4)}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := Serve(ctx, sock, Handler(g), false, func() { close(ready) })
		done <- err
	}()
	<-ready
	call := func(req cniapi.Request, d time.Duration) (cniapi.Response, error) {
		cctx, ccancel := context.WithTimeout(context.Background(), d)
		defer ccancel()
		return cniapi.Call(cctx, sock, cniapi.PathAdd, req)
	}
	ip := netip.MustParseAddr("10.0.0.5")
	res, err := call(cniapi.Request{Namespace: "pay", Name: "fast", IPs: []netip.Addr{ip}}, 5*time.Second)
	if err != nil || len(res.Egresses) != 1 || res.Egresses[0] != "e1" {
		t.Fatalf("ADD = %+v, %v", res, err)
	}
	if got := <-g.added; got.Namespace != "pay" || got.IPs[0] != ip {
		t.Errorf("the Gate got %+v", got)
	}
	for _, bad := range []cniapi.Request{{Namespace: "pay", IPs: []netip.Addr{ip}}, {Namespace: "pay", Name: "x"}} {
		if _, err := call(bad, 5*time.Second); err == nil || !strings.Contains(err.Error(), "HTTP 400") {
			t.Errorf("ADD %+v: %v, want a 400", bad, err)
		}
	}
	start := time.Now()
	_, err = call(cniapi.Request{Namespace: "pay", Name: "slow", IPs: []netip.Addr{ip}, TimeoutMillis: 300}, 2*time.Second)
	if err == nil || !strings.Contains(err.Error(), "not classified in time") {
		t.Errorf("slow ADD: %v, want the Gate's reason", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("slow ADD took %v", d)
	}
	if _, err := cniapi.Call(context.Background(), sock+".absent", cniapi.PathAdd, cniapi.Request{}); !errors.Is(err, cniapi.ErrNoAgent) {
		t.Errorf("absent socket: %v, want ErrNoAgent", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := call(cniapi.Request{Namespace: "pay", Name: "fast", IPs: []netip.Addr{ip}}, time.Second); !errors.Is(err, cniapi.ErrNoAgent) {
		t.Errorf("after Serve returned: %v, want ErrNoAgent (socket removed)", err)
	}
}
