package fence

import (
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"time"
)

// Path is the HTTP path of the peer probe on the agent's report port.
const Path = "/peer"

// Candidate is a Node that may be a peer: its name and the address its
// agent is reached at (the first InternalIP, as the controller polls it).
type Candidate struct {
	Node string
	Addr netip.Addr
}

// SelectPeers returns the peer set of the agent of self: the n candidates
// other than self with the highest rendezvous weight hash(self, candidate)
// (highest random weight hashing), sorted by name. Every agent chooses its
// own set, the choice depends only on the names (not on the order of
// candidates), and adding or removing a Node changes at most one member of
// each set. Fewer than n are returned when fewer candidates exist.
func SelectPeers(self string, candidates []Candidate, n int) []Candidate {
	type scored struct {
		c Candidate
		w uint64
	}
	s := make([]scored, 0, len(candidates))
	for _, c := range candidates {
		if c.Node == self || !c.Addr.IsValid() {
			continue
		}
		h := fnv.New64a()
		_, _ = h.Write([]byte(self))
		_, _ = h.Write([]byte{0})
		_, _ = h.Write([]byte(c.Node))
		s = append(s, scored{c, h.Sum64()})
	}
	slices.SortFunc(s, func(a, b scored) int {
		if a.w != b.w {
			return cmp.Compare(b.w, a.w)
		}
		return cmp.Compare(a.c.Node, b.c.Node)
	})
	out := make([]Candidate, 0, min(n, len(s)))
	for i := 0; i < len(s) && i < n; i++ {
		out = append(out, s[i].c)
	}
	slices.SortFunc(out, func(a, b Candidate) int { return cmp.Compare(a.Node, b.Node) })
	return out
}

// Answer is what an agent serves on GET Path.
type Answer struct {
	// Node is the answering agent's Node name.
	Node string `json:"node"`
	// PolledAgoMillis is how long ago, in milliseconds, the controller
	// last polled the answering agent (since its start when never).
	PolledAgoMillis int64 `json:"polledAgoMillis"`
	// Fenced is true while the answering agent is fenced itself.
	Fenced bool `json:"fenced"`
}

// PeerHandler serves Answer on GET Path: node is this agent's Node,
// lastPoll returns when the controller last polled it, fenced whether it is
// fenced. now is the clock (time.Now when nil).
func PeerHandler(node string, lastPoll func() time.Time, fenced func() bool, now func() time.Time) http.Handler {
	if now == nil {
		now = time.Now
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+Path, func(w http.ResponseWriter, _ *http.Request) {
		a := Answer{Node: node, PolledAgoMillis: now().Sub(lastPoll()).Milliseconds(), Fenced: fenced()}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(a)
	})
	return mux
}

// NewPeerClient returns the HTTP client the agent probes its peers with:
// each probe bounded by timeout, one kept-alive connection per peer.
// It is the one place the peer transport is built.
func NewPeerClient(timeout time.Duration) *http.Client {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: timeout}).DialContext,
		MaxIdleConnsPerHost: 1,
		IdleConnTimeout:     30 * time.Second,
	}
	return &http.Client{Timeout: timeout, Transport: tr}
}

// NewPeerClientTLS is NewPeerClient over TLS with cfg, the configuration
// for one peer (it verifies that peer's identity), for https probes.
func NewPeerClientTLS(timeout time.Duration, cfg *tls.Config) *http.Client {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: timeout}).DialContext,
		TLSClientConfig:     cfg,
		TLSHandshakeTimeout: timeout,
		MaxIdleConnsPerHost: 1,
		IdleConnTimeout:     30 * time.Second,
	}
	return &http.Client{Timeout: timeout, Transport: tr}
}

// ProbePeer asks the agent at addr:port for its Answer, with scheme "http"
// or "https" (hc then carries the TLS configuration). It fails when the
// peer does not answer in time, answers something else than an Answer, or
// the answer names another Node than want.
func ProbePeer(ctx context.Context, hc *http.Client, scheme string, addr netip.Addr, port int, want string) (Answer, error) {
	url := scheme + "://" + net.JoinHostPort(addr.String(), strconv.Itoa(port)) + Path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return Answer{}, fmt.Errorf("build peer request: %w", err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return Answer{}, fmt.Errorf("probe peer %s at %s: %w", want, addr, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return Answer{}, fmt.Errorf("probe peer %s at %s: HTTP %d", want, addr, resp.StatusCode)
	}
	var a Answer
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&a); err != nil {
		return Answer{}, fmt.Errorf("decode answer of peer %s: %w", want, err)
	}
	if a.Node != want {
		return Answer{}, fmt.Errorf("probe peer %s at %s: answered for Node %q", want, addr, a.Node)
	}
	return a, nil
}
