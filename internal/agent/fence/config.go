package fence

import (
	"errors"
	"fmt"
	"time"
)

// Defaults of the agent's fencing flags. They fit the controller's defaults
// (--agent-poll-interval 500 ms, --agent-dead-after 2 s, issue 22): a
// cut-off Node decides 1.4 s after its last poll (its peers have been
// polled in the two rounds since, at 0.5 and 1 s), at most one probe
// interval and the unbind allowance later (1.85 s) it has unbound, before
// the controller can declare it dead (2 s after the last answer at the
// earliest). The probes start 650 ms after the last poll, 1.3 poll
// intervals (1.25 with the former 1 s / 2 s), so a round a little late
// starts none.
const (
	DefaultTimeout                = 1400 * time.Millisecond
	DefaultProbeInterval          = 250 * time.Millisecond
	DefaultPeers                  = 5
	DefaultControllerPollInterval = 500 * time.Millisecond
	DefaultControllerDeadAfter    = 2 * time.Second
)

// UnbindAllowance is the time the agent allows itself, in the start-up
// check, between deciding to fence and the last egress IP leaving its
// interface (a reconcile from the cache: a few milliseconds per address,
// measured in the e2e suite; 200 ms leaves room for a loaded Node).
const UnbindAllowance = 200 * time.Millisecond

// Flag names, used in the errors of Validate.
const (
	FlagTimeout                = "--fence-timeout"
	FlagProbeInterval          = "--peer-probe-interval"
	FlagPeers                  = "--peers"
	FlagControllerPollInterval = "--controller-poll-interval"
	FlagControllerDeadAfter    = "--controller-dead-after"
)

// Config holds the fencing timings of one agent. The controller's values
// are repeated here (the agent cannot read the controller's flags) so that
// Validate can check that a Node always fences before its IPs are
// reassigned; the chart passes the same values to both.
type Config struct {
	// Timeout is how long without a controller poll (and without the API
	// server) before the agent fences, measured from the last poll it
	// served. 0 turns fencing off.
	Timeout time.Duration
	// ProbeInterval is the period of the API-server and peer probes while
	// polls are late; each probe times out after ProbeTimeout().
	ProbeInterval time.Duration
	// Peers is the size of the peer set (fewer in smaller clusters).
	Peers int
	// ControllerPollInterval is the controller's --agent-poll-interval.
	ControllerPollInterval time.Duration
	// ControllerDeadAfter is the controller's --agent-dead-after.
	ControllerDeadAfter time.Duration
}

// DefaultConfig returns the defaults above.
func DefaultConfig() Config {
	return Config{Timeout: DefaultTimeout, ProbeInterval: DefaultProbeInterval, Peers: DefaultPeers,
		ControllerPollInterval: DefaultControllerPollInterval, ControllerDeadAfter: DefaultControllerDeadAfter}
}

// Enabled reports whether fencing is on (Timeout > 0).
func (c Config) Enabled() bool { return c.Timeout > 0 }

// ProbeTimeout is the timeout of one API-server or peer probe: four fifths
// of ProbeInterval, so a round of probes ends before the next starts.
func (c Config) ProbeTimeout() time.Duration { return c.ProbeInterval * 4 / 5 }

// ProbeStart is the poll age at which the probes start: three probe
// intervals before Timeout, so the decision at Timeout has fresh answers.
func (c Config) ProbeStart() time.Duration { return c.Timeout - 3*c.ProbeInterval }

// PolledMargin is how much later than this Node's last poll a peer's last
// poll must be for the peer to count as polled by a live controller: one
// and a half of the controller's poll intervals, so the controller must
// have polled the peer in two rounds after this Node's last poll. The
// controller polls every agent in one round, in parallel, so agents polled
// in one round are polled within milliseconds of each other; but a
// controller that stops in the middle of a round (it lost its Lease during
// an API-server outage) leaves the agents it had not polled yet one round
// behind the others. Half an interval took that for a live controller, and
// Nodes fenced during an API-server outage in the flake sweep (3 of the first 10
// e2e runs); a second round only comes from a live controller.
func (c Config) PolledMargin() time.Duration { return c.ControllerPollInterval * 3 / 2 }

// Validate checks that the timings work together and returns an error
// naming the flags involved. It passes for a zero Timeout (fencing off)
// without looking at the rest.
//
// The rules: every value positive; the probes must start after a normal
// poll gap (ProbeStart > ControllerPollInterval, or every Node would probe
// the API server and its peers after every poll); a live controller's
// second round after this Node's last poll must be due by the fence
// timeout (Timeout >= 2 × ControllerPollInterval, see PolledMargin); and
// the fence must be
// complete before the controller can declare the Node dead:
// Timeout + ProbeInterval + UnbindAllowance < ControllerDeadAfter.
func (c Config) Validate() error {
	if c.Timeout < 0 {
		return fmt.Errorf("%s %v: want 0 (off) or a positive duration", FlagTimeout, c.Timeout)
	}
	if !c.Enabled() {
		return nil
	}
	var errs []error
	if c.ProbeInterval <= 0 {
		errs = append(errs, fmt.Errorf("%s %v: want a positive duration", FlagProbeInterval, c.ProbeInterval))
	}
	if c.Peers < 1 {
		errs = append(errs, fmt.Errorf("%s %d: want at least 1", FlagPeers, c.Peers))
	}
	if c.ControllerPollInterval <= 0 {
		errs = append(errs, fmt.Errorf("%s %v: want a positive duration", FlagControllerPollInterval, c.ControllerPollInterval))
	}
	if c.ControllerDeadAfter <= 0 {
		errs = append(errs, fmt.Errorf("%s %v: want a positive duration", FlagControllerDeadAfter, c.ControllerDeadAfter))
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if c.ProbeStart() <= c.ControllerPollInterval {
		errs = append(errs, fmt.Errorf("%s %v minus 3 × %s %v is %v, not more than %s %v: every normal poll gap would start probes; raise %s or lower %s",
			FlagTimeout, c.Timeout, FlagProbeInterval, c.ProbeInterval, c.ProbeStart(), FlagControllerPollInterval, c.ControllerPollInterval,
			FlagTimeout, FlagProbeInterval))
	}
	if c.Timeout < 2*c.ControllerPollInterval {
		errs = append(errs, fmt.Errorf("%s %v is less than twice %s %v: a cut-off Node sees its peers polled in two rounds since its own last poll only after two intervals; raise %s or lower %s",
			FlagTimeout, c.Timeout, FlagControllerPollInterval, c.ControllerPollInterval, FlagTimeout, FlagControllerPollInterval))
	}
	if sum := c.Timeout + c.ProbeInterval + UnbindAllowance; sum >= c.ControllerDeadAfter {
		errs = append(errs, fmt.Errorf("%s %v + %s %v + %v to unbind is %v, not less than %s %v: the controller could reassign this Node's IPs before it fences; lower %s or raise %s (on the controller: --agent-dead-after)",
			FlagTimeout, c.Timeout, FlagProbeInterval, c.ProbeInterval, UnbindAllowance, sum, FlagControllerDeadAfter, c.ControllerDeadAfter,
			FlagTimeout, FlagControllerDeadAfter))
	}
	return errors.Join(errs...)
}
