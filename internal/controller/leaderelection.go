package controller

import (
	"errors"
	"fmt"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
)

// leaderElectionJitter is client-go's leaderelection.JitterFactor: a
// candidate waits between RetryPeriod and (1 + 1.2) x RetryPeriod between
// two tries to acquire the Lease, and client-go refuses a renew deadline
// that is not more than 1.2 retry periods.
const leaderElectionJitter = 1.2

// LeaderElectionConfig are the leader-election timings of
// egressip-controller (flags --leader-elect-lease-duration,
// --leader-elect-renew-deadline, --leader-elect-retry-period and
// --leader-elect-release-on-cancel). docs/failover.md ("Leader takeover")
// explains the windows they give.
type LeaderElectionConfig struct {
	// LeaseDuration is how long a standby waits, after it last saw the
	// Lease change, before it takes the Lease over. The Lease stores it in
	// whole seconds (spec.leaseDurationSeconds), so it must be a whole
	// number of seconds.
	LeaseDuration time.Duration
	// RenewDeadline is how long the leader keeps trying to renew the Lease
	// (every RetryPeriod, each request timing out after max(RenewDeadline/2,
	// 1 s), as controller-runtime sets it) before it stops leading and the
	// process exits.
	RenewDeadline time.Duration
	// RetryPeriod is the leader's interval between two renewals and a
	// standby's shortest interval between two tries to acquire (client-go
	// adds up to 1.2 x RetryPeriod of jitter to the latter).
	RetryPeriod time.Duration
	// ReleaseOnCancel makes a stopping leader give the Lease up (a Lease
	// whose duration is 1 s and holder empty) once its runnables have
	// stopped, so that the standby need not wait LeaseDuration. Safe only
	// because egressip-controller exits as soon as its manager has stopped.
	ReleaseOnCancel bool
}

// DefaultLeaderElection are egressip-controller's defaults: a standby
// takes over 2.75 to about 4.1 s after the leader was killed without
// releasing the Lease (LeaseDuration - RetryPeriod to LeaseDuration +
// 4.4 x RetryPeriod), and the leader gives up 0.75 s before a standby can
// take over (LeaseDuration - RenewDeadline - RetryPeriod).
func DefaultLeaderElection() LeaderElectionConfig {
	return LeaderElectionConfig{
		LeaseDuration:   3 * time.Second,
		RenewDeadline:   2 * time.Second,
		RetryPeriod:     250 * time.Millisecond,
		ReleaseOnCancel: true,
	}
}

// Check refuses timings that client-go refuses (lease duration not above
// the renew deadline, renew deadline not above 1.2 retry periods: see
// k8s.io/client-go/tools/leaderelection.NewLeaderElector) or that allow
// two leaders at once, with an error naming the flags. The leader stops
// leading at the latest RetryPeriod + RenewDeadline after its last
// successful renewal (it waits RetryPeriod, then tries for RenewDeadline);
// a standby takes over LeaseDuration after it saw that renewal at the
// earliest. So LeaseDuration must exceed RenewDeadline + RetryPeriod; what
// is left over is the margin for the renewal's answer to reach the leader
// and for the process to exit.
func (c LeaderElectionConfig) Check() error {
	var errs []error
	if c.LeaseDuration < time.Second || c.LeaseDuration%time.Second != 0 {
		errs = append(errs, fmt.Errorf("--leader-elect-lease-duration %v must be a whole number of seconds, at least 1s (the Lease stores whole seconds)", c.LeaseDuration))
	}
	if c.RenewDeadline <= 0 {
		errs = append(errs, fmt.Errorf("--leader-elect-renew-deadline %v must be positive", c.RenewDeadline))
	}
	if c.RetryPeriod <= 0 {
		errs = append(errs, fmt.Errorf("--leader-elect-retry-period %v must be positive", c.RetryPeriod))
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if c.RenewDeadline <= time.Duration(leaderElectionJitter*float64(c.RetryPeriod)) {
		errs = append(errs, fmt.Errorf("--leader-elect-renew-deadline %v must be more than 1.2 x --leader-elect-retry-period %v (client-go's rule)", c.RenewDeadline, c.RetryPeriod))
	}
	if c.LeaseDuration <= c.RenewDeadline+c.RetryPeriod {
		errs = append(errs, fmt.Errorf("--leader-elect-lease-duration %v must be more than --leader-elect-renew-deadline %v + --leader-elect-retry-period %v: "+
			"a leader that cannot renew stops that long after its last renewal, and a standby may take over a lease duration after it", c.LeaseDuration, c.RenewDeadline, c.RetryPeriod))
	}
	return errors.Join(errs...)
}

// Apply sets c in the manager options o.
func (c LeaderElectionConfig) Apply(o *ctrl.Options) {
	lease, renew, retry := c.LeaseDuration, c.RenewDeadline, c.RetryPeriod
	o.LeaseDuration, o.RenewDeadline, o.RetryPeriod = &lease, &renew, &retry
	o.LeaderElectionReleaseOnCancel = c.ReleaseOnCancel
}
