package fence

import (
	"context"
	"crypto/tls"
	"errors"
	"net/http"
	"sync"
	"time"

	v1 "github.com/egressip/egressip/api/v1alpha1"

	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/log"
)

// Options configure a Fencer.
type Options struct {
	Config
	// Node is this agent's Node name.
	Node string
	// Port is the report port of every agent (peers are probed there).
	Port int
	// LastPoll returns when the controller last polled this agent.
	LastPoll func() time.Time
	// Candidates returns the Nodes that may be peers (from the agent's
	// cache; stale during an outage, which is fine). It may return nil
	// while nothing is cached.
	Candidates func(ctx context.Context) []Candidate
	// ProbeAPI asks the API server once, within ctx; nil when it
	// answered (any HTTP status).
	ProbeAPI func(ctx context.Context) error
	// Client is the peer client over plain HTTP; nil means
	// NewPeerClient(ProbeTimeout()). Unused when TLS is set.
	Client *http.Client
	// TLS, when set, makes peer probes HTTPS: it returns the TLS
	// configuration for the agent of one Node (it must verify that the
	// server is that Node's agent). Each peer then gets its own client.
	TLS func(node string) *tls.Config
	// OnChange is called, from the Fencer's goroutine, whenever the
	// decision's Fence changes (and once at the first fence).
	OnChange func(ctx context.Context, d Decision)
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Fencer runs Decide every ProbeInterval and probes the API server and the
// peer set while the controller's polls are late (from Config.ProbeStart on);
// in steady state it only reads the time of the last poll.
type Fencer struct {
	o Options

	mu      sync.Mutex
	fenced  bool
	last    Decision
	api     APIState
	results map[string]Peer
	// clients are the per-peer HTTPS clients (Options.TLS), by Node.
	clients map[string]*http.Client
}

// New returns a Fencer; o.Config must be enabled and valid.
func New(o Options) *Fencer {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Client == nil {
		o.Client = NewPeerClient(o.ProbeTimeout())
	}
	return &Fencer{o: o, results: map[string]Peer{}, last: Decision{Reason: v1.ReasonPolled}}
}

// Fenced reports whether the last decision fences.
func (f *Fencer) Fenced() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fenced
}

// Last returns the last decision.
func (f *Fencer) Last() Decision {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last
}

// Start runs a Step every ProbeInterval until ctx is done (a
// manager.Runnable); it returns nil.
func (f *Fencer) Start(ctx context.Context) error {
	t := time.NewTicker(f.o.ProbeInterval)
	defer t.Stop()
	for {
		f.Step(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Step runs one round: when the last poll is older than ProbeStart it
// probes the API server and every peer (in parallel, each bounded by
// ProbeTimeout), then decides; younger, it forgets earlier probe results
// and probes nothing. It calls OnChange when Fence changes and returns the
// decision.
func (f *Fencer) Step(ctx context.Context) Decision {
	logger := log.FromContext(ctx).WithName("fence")
	lastPoll := f.o.LastPoll()
	var peers []Candidate
	if f.o.Now().Sub(lastPoll) < f.o.ProbeStart() {
		f.mu.Lock()
		f.api, f.results = APIState{}, map[string]Peer{}
		f.mu.Unlock()
	} else {
		if f.o.Candidates != nil {
			peers = SelectPeers(f.o.Node, f.o.Candidates(ctx), f.o.Peers)
		}
		f.probe(ctx, peers)
	}
	f.mu.Lock()
	in := Input{Now: f.o.Now(), LastPoll: lastPoll, API: f.api}
	for _, p := range peers {
		r, ok := f.results[p.Node]
		if !ok {
			r = Peer{Node: p.Node}
		}
		in.Peers = append(in.Peers, r)
	}
	d := Decide(f.o.Config, in)
	changed := d.Fence != f.fenced
	f.fenced, f.last = d.Fence, d
	f.mu.Unlock()
	if !changed {
		return d
	}
	if d.Fence {
		fencedGauge.Set(1)
		fenceEvents.WithLabelValues("fence", d.Reason).Inc()
		logger.Info("fencing: releasing every egress IP of this Node", "reason", d.Reason, "detail", d.Message)
	} else {
		fencedGauge.Set(0)
		fenceEvents.WithLabelValues("unfence", d.Reason).Inc()
		logger.Info("fence lifted: egress IPs follow their assignments again", "reason", d.Reason, "detail", d.Message)
	}
	if f.o.OnChange != nil {
		f.o.OnChange(ctx, d)
	}
	return d
}

// probe runs one round of API-server and peer probes and records them.
func (f *Fencer) probe(ctx context.Context, peers []Candidate) {
	logger := log.FromContext(ctx).WithName("fence")
	pctx, cancel := context.WithTimeout(ctx, f.o.ProbeTimeout())
	defer cancel()
	var wg sync.WaitGroup
	apiErr := errors.New("no API-server probe configured")
	if f.o.ProbeAPI != nil {
		wg.Go(func() { apiErr = f.o.ProbeAPI(pctx) })
	}
	res := make([]Peer, len(peers))
	for i, p := range peers {
		wg.Go(func() {
			hc, scheme := f.clientFor(p.Node)
			a, err := ProbePeer(pctx, hc, scheme, p.Addr, f.o.Port, p.Node)
			at := f.o.Now()
			if err != nil {
				peerProbes.WithLabelValues(resultError).Inc()
				logger.V(1).Info("peer probe failed", "peer", klog.KRef("", p.Node), "err", err)
				res[i] = Peer{Node: p.Node, At: at}
				return
			}
			peerProbes.WithLabelValues(resultOK).Inc()
			res[i] = Peer{Node: p.Node, Reached: true, At: at, LastPoll: at.Add(-time.Duration(a.PolledAgoMillis) * time.Millisecond)}
		})
	}
	wg.Wait()
	now := f.o.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	if apiErr == nil {
		apiProbes.WithLabelValues(resultOK).Inc()
		f.api.LastOK = now
	} else {
		apiProbes.WithLabelValues(resultError).Inc()
		f.api.LastFailed = now
		logger.V(1).Info("API server probe failed", "err", apiErr)
	}
	prev := f.results
	f.results = make(map[string]Peer, len(res))
	for _, r := range res {
		if p, ok := prev[r.Node]; ok && p.Reached && !r.Reached {
			// One failed probe does not lose a peer: its last answer
			// stands until Decide finds it stale (3 probe intervals), so
			// an answer late by a few hundred milliseconds on a loaded
			// Node is not taken for isolation.
			r = p
		}
		f.results[r.Node] = r
	}
}

// clientFor returns the client and URL scheme to probe node's agent with:
// Options.Client over http, or with Options.TLS node's own client over
// https (kept for the next probes, so connections are reused).
func (f *Fencer) clientFor(node string) (*http.Client, string) {
	if f.o.TLS == nil {
		return f.o.Client, "http"
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if hc, ok := f.clients[node]; ok {
		return hc, "https"
	}
	if f.clients == nil {
		f.clients = map[string]*http.Client{}
	}
	hc := NewPeerClientTLS(f.o.ProbeTimeout(), f.o.TLS(node))
	f.clients[node] = hc
	return hc, "https"
}
