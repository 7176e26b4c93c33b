package fence

import (
	"fmt"
	"time"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// APIState is what the API-server probes found since they started.
type APIState struct {
	// LastOK is when the API server last answered (any HTTP response);
	// zero when it never did since the probes started.
	LastOK time.Time
	// LastFailed is when a probe last failed (no answer within the probe
	// timeout); zero when none failed.
	LastFailed time.Time
}

// Peer is the latest probe result for one member of the peer set.
type Peer struct {
	// Node is the peer's Node name.
	Node string
	// Reached is true when the peer's agent answered the latest probe.
	Reached bool
	// At is when that probe ended (this agent's clock).
	At time.Time
	// LastPoll is when the controller last polled the peer, on this
	// agent's clock (At minus the age the peer reported); valid when
	// Reached.
	LastPoll time.Time
}

// Input is what Decide looks at.
type Input struct {
	// Now is the time of the decision.
	Now time.Time
	// LastPoll is when the controller last polled this agent (its start,
	// when it was never polled).
	LastPoll time.Time
	// API is the API-server probe state.
	API APIState
	// Peers is the peer set with, for each, its latest answer, or its
	// latest failed probe when it never answered since the probes began;
	// an answer older than 3 × Config.ProbeInterval counts as not reached
	// (so a peer is lost after three probe intervals without an answer,
	// not after one slow probe).
	Peers []Peer
}

// Decision is the outcome of Decide.
type Decision struct {
	// Fence is true when the agent must hold no egress IP.
	Fence bool
	// Reason is one of the Reason* constants.
	Reason string
	// Message says why in words, with the figures behind it.
	Message string
}

// Decide applies the fencing rule of the package documentation to in. It
// is a pure function of cfg and in; cfg must be enabled and valid.
func Decide(cfg Config, in Input) Decision {
	age := in.Now.Sub(in.LastPoll)
	if age < cfg.Timeout {
		return Decision{Reason: v1.ReasonPolled, Message: fmt.Sprintf("last controller poll %v ago", age.Round(time.Millisecond))}
	}
	a := in.API
	apiLost := a.LastFailed.After(in.LastPoll) && a.LastFailed.After(a.LastOK) && in.Now.Sub(a.LastOK) >= cfg.Timeout
	if !apiLost {
		if a.LastFailed.IsZero() && a.LastOK.IsZero() {
			return Decision{Reason: v1.ReasonAPIServerReachable, Message: fmt.Sprintf("no controller poll for %v; the API server was not probed yet", age.Round(time.Millisecond))}
		}
		return Decision{Reason: v1.ReasonAPIServerReachable, Message: fmt.Sprintf("no controller poll for %v, but the API server answers", age.Round(time.Millisecond))}
	}
	n := len(in.Peers)
	if n == 0 {
		return Decision{Reason: v1.ReasonNoPeers, Message: fmt.Sprintf("no controller poll and no API server for %v, and no peer known", age.Round(time.Millisecond))}
	}
	reached, polled := 0, 0
	stale := 3 * cfg.ProbeInterval
	after := in.LastPoll.Add(cfg.PolledMargin())
	for _, p := range in.Peers {
		if !p.Reached || in.Now.Sub(p.At) > stale {
			continue
		}
		reached++
		if p.LastPoll.After(after) {
			polled++
		}
	}
	if reached < n/2+1 {
		return Decision{Fence: true, Reason: v1.ReasonPeersLost, Message: fmt.Sprintf("no controller poll and no API server for %v, and %d of %d peers answer: isolated or on the minority side",
			age.Round(time.Millisecond), reached, n)}
	}
	if polled >= reached/2+1 {
		return Decision{Fence: true, Reason: v1.ReasonControllerPollsOthers, Message: fmt.Sprintf("no controller poll and no API server for %v, and %d of the %d peers that answer were polled since: the controller cannot reach this Node",
			age.Round(time.Millisecond), polled, reached)}
	}
	return Decision{Reason: v1.ReasonControllerGone, Message: fmt.Sprintf("no controller poll and no API server for %v, and only %d of the %d peers that answer were polled since: the controller is down, nothing can move the IPs",
		age.Round(time.Millisecond), polled, reached)}
}
