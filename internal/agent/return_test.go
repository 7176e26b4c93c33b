package agent_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/egressip/egressip/api/v1alpha1"
)

// apiGate is a reverse proxy between an agent and the API server that a
// test can break: "drop" resets every connection and closes new ones
// without an answer, "503" answers every request with 503 Service
// Unavailable; either way the requests in flight (the watches) end.
type apiGate struct {
	srv *httptest.Server
	rp  *httputil.ReverseProxy

	mu       sync.Mutex
	mode     string // "", "drop" or "503"
	inflight context.Context
	cancel   context.CancelFunc
	firstReq time.Time // first request forwarded since the last restore
}

func newAPIGate(t *testing.T, cfg *rest.Config) *apiGate {
	t.Helper()
	tr, err := rest.TransportFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(cfg.Host)
	if err != nil {
		t.Fatal(err)
	}
	g := &apiGate{}
	g.inflight, g.cancel = context.WithCancel(context.Background())
	g.rp = &httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(u) },
		Transport:     tr,
		FlushInterval: -1, // watches stream
	}
	g.srv = httptest.NewServer(g)
	t.Cleanup(func() { g.cancel(); g.srv.Close() })
	return g
}

func (g *apiGate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	mode, parent := g.mode, g.inflight
	if mode == "" && g.firstReq.IsZero() {
		g.firstReq = time.Now()
	}
	g.mu.Unlock()
	switch mode {
	case "503":
		http.Error(w, "the API server is unavailable (test)", http.StatusServiceUnavailable)
		return
	case "drop":
		if hj, ok := w.(http.Hijacker); ok {
			if c, _, err := hj.Hijack(); err == nil {
				if tc, ok := c.(*net.TCPConn); ok {
					_ = tc.SetLinger(0)
				}
				_ = c.Close()
				return
			}
		}
		http.Error(w, "dropped", http.StatusBadGateway)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	stop := context.AfterFunc(parent, cancel)
	defer stop()
	g.rp.ServeHTTP(w, r.WithContext(ctx))
}

// cut ends every request in flight and answers new ones as mode says.
func (g *apiGate) cut(mode string) {
	g.mu.Lock()
	g.mode = mode
	g.cancel()
	g.inflight, g.cancel = context.WithCancel(context.Background())
	g.mu.Unlock()
	if mode == "drop" {
		g.srv.CloseClientConnections()
	}
}

// restore forwards again; it returns the time.
func (g *apiGate) restore() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.mode, g.firstReq = "", time.Time{}
	return time.Now()
}

// reconnected returns when the first request since restore was forwarded.
func (g *apiGate) reconnected() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.firstReq
}

// TestAnnounceOnReturnTrigger (issue 16 item 5, agent level): the agent
// holds 192.0.2.70 and its burst is over; its path to the API server breaks
// (connections reset, or every request answered 503); the status moves to
// another Node, to none, and back; the path returns. The agent, whose
// address never left the interface, must announce again once its cache
// catches up. An unrelated status write afterwards must announce nothing.
func TestAnnounceOnReturnTrigger(t *testing.T) {
	env := apiServer(t)
	c := env.Client
	for _, mode := range []string{"drop", "503"} {
		t.Run(mode, func(t *testing.T) {
			n := newTestNode(t)
			pool := createPool(t, c, "192.0.2.0/24", "192.0.2.1", 24)
			eg := createEgress(t, c, "ret", pool, "192.0.2.70", n.name)
			gate := newAPIGate(t, env.Config)
			cfg := n.config()
			cfg.AnnounceSchedule = []time.Duration{0, 300 * time.Millisecond}
			cfg.ResyncPeriod = time.Hour // no periodic reconcile to hide behind
			startAgent(t, &rest.Config{Host: gate.srv.URL}, n.name, newAgent(t, cfg))
			if _, err := n.capture.waitAnnouncements(20*time.Second, ip("192.0.2.70")); err != nil {
				t.Fatal(err)
			}
			// The burst (two announcements, 300 ms apart) ends.
			if got := n.capture.countAnnouncements(1500*time.Millisecond, ip("192.0.2.70")); got[ip("192.0.2.70")] > 1 {
				t.Logf("%d more announcements of the first burst", got[ip("192.0.2.70")])
			}
			n.capture.drop()

			gate.cut(mode)
			other := uniq("other-node")
			setStatus(t, c, eg, "192.0.2.70", other)
			setStatus(t, c, eg, "192.0.2.70", "")
			setStatus(t, c, eg, "192.0.2.70", n.name)
			if got := n.capture.countAnnouncements(500*time.Millisecond, ip("192.0.2.70")); got[ip("192.0.2.70")] != 0 {
				t.Fatalf("announced while cut off: %v", got)
			}
			restored := gate.restore()
			seen, err := n.capture.waitAnnouncements(45*time.Second, ip("192.0.2.70"))
			if err != nil {
				t.Fatalf("no announcement after the return (%s): %v", mode, err)
			}
			at := seen[ip("192.0.2.70")]
			t.Logf("%s: announced %v after the path came back, %v after the first request through it",
				mode, at.Sub(restored).Round(time.Millisecond), at.Sub(gate.reconnected()).Round(time.Millisecond))
			if d := at.Sub(gate.reconnected()); d > 7*time.Second {
				t.Errorf("announced %v after the agent reached the API server again, want at most 7 s", d)
			}
			if !n.present(t, ip("192.0.2.70")) {
				t.Fatal("192.0.2.70 left the interface")
			}

			// An unrelated status write (a condition) without a gap
			// announces nothing: let the new burst end, then write.
			n.capture.countAnnouncements(1500*time.Millisecond, ip("192.0.2.70"))
			touchStatus(t, c, eg)
			if got := n.capture.countAnnouncements(1500*time.Millisecond, ip("192.0.2.70")); got[ip("192.0.2.70")] != 0 {
				t.Fatalf("%d announcements after an unrelated status write", got[ip("192.0.2.70")])
			}
		})
	}
}

// touchStatus writes a condition into the Egress's status and nothing else
// (an unrelated status write, as the controller's Ready updates are).
func touchStatus(t *testing.T, c client.Client, name string) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var e v1alpha1.Egress
		if err := c.Get(context.Background(), client.ObjectKey{Name: name}, &e); err != nil {
			return err
		}
		meta.SetStatusCondition(&e.Status.Conditions, metav1.Condition{Type: "Touched", Status: metav1.ConditionTrue, Reason: "Test", Message: time.Now().String()})
		return c.Status().Update(context.Background(), &e)
	})
	if err != nil {
		t.Fatalf("touch status of Egress %s: %v", name, err)
	}
}
