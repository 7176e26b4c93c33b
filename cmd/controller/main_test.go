package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestBadLeaderElectionFlagsFail: leader-election timings client-go would
// refuse, or that let a standby take over before a leader that cannot
// renew has stopped, are refused at start (exit code 2) with a message
// naming the flags.
func TestBadLeaderElectionFlagsFail(t *testing.T) {
	refusedAtStart(t, []refusedCase{
		{[]string{"--leader-elect-lease-duration=2s"}, []string{"--leader-elect-lease-duration 2s", "--leader-elect-renew-deadline 2s", "--leader-elect-retry-period 250ms"}},
		{[]string{"--leader-elect-lease-duration=2500ms"}, []string{"--leader-elect-lease-duration 2.5s", "whole number of seconds"}},
		{[]string{"--leader-elect-retry-period=2s", "--leader-elect-lease-duration=10s"}, []string{"--leader-elect-renew-deadline 2s", "--leader-elect-retry-period 2s"}},
		{[]string{"--leader-elect-renew-deadline=0"}, []string{"--leader-elect-renew-deadline 0s"}},
	})
}

// TestBadLivenessFlagsFail: agent-poll timings that cannot work together
// are refused at start (exit code 2) with a message naming the flags: a
// poll timeout not below the poll interval, non-positive values, and a
// release timeout below two poll intervals.
func TestBadLivenessFlagsFail(t *testing.T) {
	refusedAtStart(t, []refusedCase{
		{[]string{"--agent-poll-timeout=500ms"}, []string{"--agent-poll-timeout 500ms must be less than --agent-poll-interval 500ms"}},
		{[]string{"--agent-poll-interval=1s", "--agent-poll-timeout=2s"}, []string{"--agent-poll-timeout 2s", "--agent-poll-interval 1s"}},
		{[]string{"--agent-failure-threshold=0"}, []string{"--agent-failure-threshold 0"}},
		{[]string{"--agent-dead-after=0"}, []string{"--agent-dead-after 0s"}},
		{[]string{"--agent-poll-interval=2s", "--agent-poll-timeout=1s"}, []string{"--release-timeout 2s", "--agent-poll-interval 2s"}},
	})
}

// refusedCase is a command line refused at start and what its error
// names.
type refusedCase struct {
	args []string
	want []string
}

// refusedAtStart builds egressip-controller and checks that each case
// exits with code 2 and names what it should.
func refusedAtStart(t *testing.T, cases []refusedCase) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "egressip-controller")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	for _, tc := range cases {
		cmd := exec.Command(bin, append([]string{"--agent-ca-namespace=default"}, tc.args...)...)
		var stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stderr, &stderr
		cmd.Env = append(os.Environ(), "KUBECONFIG=/nonexistent")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		var err error
		select {
		case err = <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			t.Fatalf("%q: still running after 30 s", tc.args)
		}
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Fatalf("%q: %v, want exit code 2\n%s", tc.args, err, stderr.String())
		}
		for _, w := range tc.want {
			if !strings.Contains(stderr.String(), w) {
				t.Errorf("%q: output does not name %q:\n%s", tc.args, w, stderr.String())
			}
		}
	}
}
