package conflict

import (
	"context"
	"net/netip"
	"slices"
	"time"

	"github.com/go-logr/logr"
)

// DefaultInterval is how often a Checker probes every held IP.
const DefaultInterval = 10 * time.Second

// Target is an egress IP the Node holds and the interface it is bound on.
type Target struct {
	IP        netip.Addr
	Interface string
}

// Wire is what a Checker probes with; *Prober implements it.
type Wire interface {
	Probe(ctx context.Context, ifname string, ips []netip.Addr) ([]Answer, error)
	OwnMACs() (map[string]bool, error)
}

// Round is the outcome of one check of every target.
type Round struct {
	// Conflicts are all current conflicts, sorted by IP.
	Conflicts []Conflict
	// Started and Ended are the IPs whose conflict started or ended in
	// this round (Ended includes IPs no longer held).
	Started, Ended []netip.Addr
	// Errors are the failed interfaces' errors (their IPs keep their
	// previous state).
	Errors []error
	// OwnMACs are this Node's MACs as the round saw them, sorted.
	OwnMACs []string
}

// Checker probes the targets at start, on every Kick and every Interval.
type Checker struct {
	// Wire sends the probes. Required.
	Wire Wire
	// Targets returns what to probe: the IPs held now. Required.
	Targets func() []Target
	// Interval between periodic rounds; 0 means DefaultInterval.
	Interval time.Duration
	// OnRound, when set, is called after every round.
	OnRound func(Round)
	// Log receives probe errors.
	Log logr.Logger

	kick    chan struct{}
	tracker Tracker
}

// NewChecker returns a Checker; see the fields.
func NewChecker(w Wire, targets func() []Target, interval time.Duration, onRound func(Round), log logr.Logger) *Checker {
	if interval <= 0 {
		interval = DefaultInterval
	}
	return &Checker{Wire: w, Targets: targets, Interval: interval, OnRound: onRound, Log: log, kick: make(chan struct{}, 1)}
}

// Kick asks for a round as soon as the current one (if any) ends, without
// blocking; kicks during a round coalesce into one more round.
func (c *Checker) Kick() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Run runs rounds until ctx is done: one at once, then one after every
// Kick and every Interval after the last round. It returns nil.
func (c *Checker) Run(ctx context.Context) error {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-c.kick:
		case <-t.C:
		}
		r := c.Once(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if c.OnRound != nil {
			c.OnRound(r)
		}
		t.Reset(c.Interval)
	}
}

// Once runs one round over Targets() now: the IPs of each interface are
// probed together, the interfaces one after the other.
func (c *Checker) Once(ctx context.Context) Round {
	targets := c.Targets()
	held := map[netip.Addr]bool{}
	byIf := map[string][]netip.Addr{}
	for _, t := range targets {
		ip := t.IP.Unmap()
		held[ip] = true
		byIf[t.Interface] = append(byIf[t.Interface], ip)
	}
	var r Round
	r.Ended = c.tracker.Retain(held)
	own, err := c.Wire.OwnMACs()
	if err != nil {
		r.Errors = append(r.Errors, err)
		r.Conflicts = c.tracker.List()
		return r
	}
	for m := range own {
		r.OwnMACs = append(r.OwnMACs, m)
	}
	slices.Sort(r.OwnMACs)
	ifaces := make([]string, 0, len(byIf))
	for i := range byIf {
		ifaces = append(ifaces, i)
	}
	slices.Sort(ifaces)
	for _, ifname := range ifaces {
		ips := byIf[ifname]
		slices.SortFunc(ips, netip.Addr.Compare)
		answers, err := c.Wire.Probe(ctx, ifname, ips)
		if ctx.Err() != nil {
			return r
		}
		if err != nil {
			r.Errors = append(r.Errors, err)
			if c.Log.GetSink() != nil {
				c.Log.Error(err, "duplicate-IP probe failed", "interface", ifname, "ips", ips)
			}
			continue // unknown: the IPs keep their previous state
		}
		st, en := c.tracker.Observe(time.Now(), ifname, ips, Foreign(answers, ips, own))
		r.Started = append(r.Started, st...)
		r.Ended = append(r.Ended, en...)
	}
	slices.SortFunc(r.Started, netip.Addr.Compare)
	slices.SortFunc(r.Ended, netip.Addr.Compare)
	r.Conflicts = c.tracker.List()
	return r
}
