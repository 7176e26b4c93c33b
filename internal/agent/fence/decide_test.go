package fence

import (
	"strings"
	"testing"
	"time"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// TestDecide checks the rule on one set of timings, written out: a 2 s
// fence timeout, 1 s polls (a 1.5 s polled margin) and a 3 s dead-after,
// the defaults before issue 22; TestDecideDefaults checks the defaults.
func TestDecide(t *testing.T) {
	cfg := Config{Timeout: 2 * time.Second, ProbeInterval: 250 * time.Millisecond, Peers: 5,
		ControllerPollInterval: time.Second, ControllerDeadAfter: 3 * time.Second}
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	// The last poll of this Node is at t0; decisions at t0 + 2.1 s.
	now := ms(2100)
	apiLost := APIState{LastFailed: ms(2000)}
	polled := func(node string, pollAt int) Peer { // answered at now - 100 ms
		return Peer{Node: node, Reached: true, At: ms(2000), LastPoll: ms(pollAt)}
	}
	silent := func(node string) Peer { return Peer{Node: node, At: ms(2000)} }
	tests := []struct {
		name   string
		in     Input
		fence  bool
		reason string
	}{
		{"polled recently", Input{Now: ms(1900), LastPoll: t0, API: apiLost, Peers: []Peer{silent("a"), silent("b")}}, false, v1.ReasonPolled},
		{"api never probed", Input{Now: now, LastPoll: t0, Peers: []Peer{silent("a")}}, false, v1.ReasonAPIServerReachable},
		{"api answers", Input{Now: now, LastPoll: t0, API: APIState{LastOK: ms(2000), LastFailed: ms(1750)}, Peers: []Peer{silent("a")}}, false, v1.ReasonAPIServerReachable},
		{"api failed before the last poll only", Input{Now: now, LastPoll: t0, API: APIState{LastFailed: ms(-100)}, Peers: []Peer{silent("a")}}, false, v1.ReasonAPIServerReachable},
		{"api answered since the polls stopped, lost for less than the timeout", Input{Now: now, LastPoll: t0, API: APIState{LastOK: ms(1500), LastFailed: ms(2000)}, Peers: []Peer{silent("a")}}, false, v1.ReasonAPIServerReachable},
		{"no peers (one-Node cluster)", Input{Now: now, LastPoll: t0, API: apiLost}, false, v1.ReasonNoPeers},
		{"isolated: no peer answers", Input{Now: now, LastPoll: t0, API: apiLost, Peers: []Peer{silent("a"), silent("b"), silent("c")}}, true, v1.ReasonPeersLost},
		{"minority side: 1 of 3 answers", Input{Now: now, LastPoll: t0, API: apiLost, Peers: []Peer{polled("a", -5), silent("b"), silent("c")}}, true, v1.ReasonPeersLost},
		{"stale answers count as lost", Input{Now: now, LastPoll: t0, API: apiLost, Peers: []Peer{
			{Node: "a", Reached: true, At: ms(1000), LastPoll: ms(900)}, {Node: "b", Reached: true, At: ms(1000), LastPoll: ms(900)}}}, true, v1.ReasonPeersLost},
		{"cut off, peers polled since (two peers)", Input{Now: now, LastPoll: t0, API: apiLost, Peers: []Peer{polled("a", 2000), polled("b", 2010)}}, true, v1.ReasonControllerPollsOthers},
		{"cut off, 2 of 3 reached, both polled since", Input{Now: now, LastPoll: t0, API: apiLost, Peers: []Peer{polled("a", 2000), polled("b", 2010), silent("c")}}, true, v1.ReasonControllerPollsOthers},
		{"controller gone: peers last polled with this Node", Input{Now: now, LastPoll: t0, API: apiLost, Peers: []Peer{polled("a", 3), polled("b", -2), polled("c", 40)}}, false, v1.ReasonControllerGone},
		{"controller gone: a peer polled just within the margin", Input{Now: now, LastPoll: t0, API: apiLost, Peers: []Peer{polled("a", 1500), polled("b", 1499)}}, false, v1.ReasonControllerGone},
		{"controller stopped mid-round: the peers were polled in the round after this Node's last poll only", Input{Now: now, LastPoll: t0, API: apiLost, Peers: []Peer{polled("a", 1000), polled("b", 1010)}}, false, v1.ReasonControllerGone},
		{"split: 1 of 3 reached peers polled since", Input{Now: now, LastPoll: t0, API: apiLost, Peers: []Peer{polled("a", 2000), polled("b", 0), polled("c", 0)}}, false, v1.ReasonControllerGone},
		{"split: 2 of 3 reached peers polled since", Input{Now: now, LastPoll: t0, API: apiLost, Peers: []Peer{polled("a", 2000), polled("b", 1900), polled("c", 0)}}, true, v1.ReasonControllerPollsOthers},
		{"one peer, answers and polled since", Input{Now: now, LastPoll: t0, API: apiLost, Peers: []Peer{polled("a", 1800)}}, true, v1.ReasonControllerPollsOthers},
		{"one peer, silent", Input{Now: now, LastPoll: t0, API: apiLost, Peers: []Peer{silent("a")}}, true, v1.ReasonPeersLost},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Decide(cfg, tt.in)
			if d.Fence != tt.fence || d.Reason != tt.reason {
				t.Fatalf("Decide = %+v, want fence %v reason %s", d, tt.fence, tt.reason)
			}
			if d.Message == "" {
				t.Fatal("empty message")
			}
		})
	}
}

// TestDecideDefaults: with the defaults (1.4 s fence timeout, 500 ms
// polls, so a 750 ms polled margin) a Node whose last poll was at 0 and
// whose peers were polled in the two rounds since (at 500 ms and 1 s)
// fences at 1.4 s, not before; peers polled in one round since only (a
// controller that stopped mid-round) fence nothing.
func TestDecideDefaults(t *testing.T) {
	cfg := DefaultConfig()
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	apiLost := APIState{LastFailed: ms(1300)}
	peers := func(pollAt int) []Peer {
		return []Peer{{Node: "a", Reached: true, At: ms(1350), LastPoll: ms(pollAt)}, {Node: "b", Reached: true, At: ms(1350), LastPoll: ms(pollAt + 3)}}
	}
	for _, tc := range []struct {
		name   string
		now    int
		pollAt int
		fence  bool
		reason string
	}{
		{"before the fence timeout", 1399, 1000, false, v1.ReasonPolled},
		{"at the fence timeout, peers polled two rounds later", 1400, 1000, true, v1.ReasonControllerPollsOthers},
		{"peers polled one round later only", 1400, 500, false, v1.ReasonControllerGone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(cfg, Input{Now: ms(tc.now), LastPoll: t0, API: apiLost, Peers: peers(tc.pollAt)})
			if d.Fence != tc.fence || d.Reason != tc.reason {
				t.Fatalf("Decide = %+v, want fence %v reason %s", d, tc.fence, tc.reason)
			}
		})
	}
	if sum := cfg.Timeout + cfg.ProbeInterval + UnbindAllowance; sum >= cfg.ControllerDeadAfter {
		t.Fatalf("defaults: the fence ends %v after the last poll, not before the controller's dead-after %v", sum, cfg.ControllerDeadAfter)
	}
}

func TestValidate(t *testing.T) {
	ok := DefaultConfig()
	if err := ok.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if err := (Config{}).Validate(); err != nil {
		t.Fatalf("off: %v", err)
	}
	mod := func(f func(*Config)) Config { c := DefaultConfig(); f(&c); return c }
	tests := []struct {
		name string
		cfg  Config
		want []string // substrings of the error: the flags it names
	}{
		{"timeout too close to dead-after", mod(func(c *Config) { c.Timeout = 2700 * time.Millisecond }), []string{FlagTimeout, FlagControllerDeadAfter}},
		{"dead-after lowered", mod(func(c *Config) { c.ControllerDeadAfter = 1500 * time.Millisecond }), []string{FlagTimeout, FlagControllerDeadAfter}},
		{"probe interval too long", mod(func(c *Config) { c.ProbeInterval = time.Second }), []string{FlagTimeout, FlagProbeInterval}},
		{"timeout within a poll gap", mod(func(c *Config) {
			c.Timeout, c.ControllerDeadAfter = 1200*time.Millisecond, 3*time.Second
		}), []string{FlagTimeout, FlagControllerPollInterval}},
		{"timeout shorter than two poll intervals", mod(func(c *Config) { c.ControllerPollInterval = 1100 * time.Millisecond }), []string{FlagTimeout, FlagControllerPollInterval}},
		{"negative timeout", mod(func(c *Config) { c.Timeout = -time.Second }), []string{FlagTimeout}},
		{"no peers", mod(func(c *Config) { c.Peers = 0 }), []string{FlagPeers}},
		{"zero probe interval", mod(func(c *Config) { c.ProbeInterval = 0 }), []string{FlagProbeInterval}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if err == nil {
				t.Fatalf("Validate(%+v) = nil", tt.cfg)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %s", err, w)
				}
			}
		})
	}
}
