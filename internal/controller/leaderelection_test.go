package controller

import (
	"strings"
	"testing"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
)

func TestLeaderElectionCheck(t *testing.T) {
	def := DefaultLeaderElection()
	if err := def.Check(); err != nil {
		t.Fatalf("defaults refused: %v", err)
	}
	with := func(f func(*LeaderElectionConfig)) LeaderElectionConfig { c := def; f(&c); return c }
	for _, tc := range []struct {
		name string
		c    LeaderElectionConfig
		want []string // substrings of the error; none: accepted
	}{
		{"controller-runtime defaults", LeaderElectionConfig{LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second}, nil},
		{"lease not above renew + retry", with(func(c *LeaderElectionConfig) { c.RenewDeadline = 2750 * time.Millisecond }),
			[]string{"--leader-elect-lease-duration 3s", "--leader-elect-renew-deadline 2.75s", "--leader-elect-retry-period 250ms"}},
		{"lease equal to renew", with(func(c *LeaderElectionConfig) { c.RenewDeadline = 3 * time.Second }),
			[]string{"--leader-elect-lease-duration", "--leader-elect-renew-deadline"}},
		{"lease in fractions of a second", with(func(c *LeaderElectionConfig) { c.LeaseDuration = 3500 * time.Millisecond }),
			[]string{"--leader-elect-lease-duration 3.5s", "whole number of seconds"}},
		{"lease below a second", with(func(c *LeaderElectionConfig) { c.LeaseDuration = 0 }),
			[]string{"--leader-elect-lease-duration 0s"}},
		{"renew not above 1.2 retries", with(func(c *LeaderElectionConfig) {
			c.RetryPeriod = 1700 * time.Millisecond
			c.LeaseDuration = 5 * time.Second
		}),
			[]string{"--leader-elect-renew-deadline 2s", "1.2 x --leader-elect-retry-period 1.7s"}},
		{"negative retry", with(func(c *LeaderElectionConfig) { c.RetryPeriod = -time.Second }),
			[]string{"--leader-elect-retry-period -1s must be positive"}},
		{"zero renew", with(func(c *LeaderElectionConfig) { c.RenewDeadline = 0 }),
			[]string{"--leader-elect-renew-deadline 0s must be positive"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.c.Check()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("%+v accepted", tc.c)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

func TestLeaderElectionApply(t *testing.T) {
	var o ctrl.Options
	c := DefaultLeaderElection()
	c.Apply(&o)
	if *o.LeaseDuration != 3*time.Second || *o.RenewDeadline != 2*time.Second || *o.RetryPeriod != 250*time.Millisecond || !o.LeaderElectionReleaseOnCancel {
		t.Fatalf("options %v %v %v %v", *o.LeaseDuration, *o.RenewDeadline, *o.RetryPeriod, o.LeaderElectionReleaseOnCancel)
	}
}
