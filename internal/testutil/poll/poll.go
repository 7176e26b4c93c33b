// Package poll is the one way the project's tests wait for a condition:
// call a function until it returns nil, and on timeout report the last
// error it returned. It runs on k8s.io/apimachinery's
// wait.PollUntilContextTimeout; nothing here sleeps on its own.
//
// Tests call Until. Test harnesses that are not tests themselves (the e2e
// harness, whose failover figures need a finer interval) call Wait.
package poll

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// Interval is how often Until calls its function: 50 ms, fine enough for
// conditions that take a poll or a pass to come true, coarse enough not to
// load an API server shared by a whole test package.
const Interval = 50 * time.Millisecond

// T is the part of testing.TB that Until uses (so that this package does
// not import testing and a harness binary can link it).
type T interface {
	Helper()
	Fatalf(format string, args ...any)
}

// Until calls fn at once and then every Interval until it returns nil. If
// fn has not returned nil when timeout has passed, Until fails t with
// "<what>: not within <timeout>: <fn's last error>".
func Until(t T, timeout time.Duration, what string, fn func() error) {
	t.Helper()
	if err := Wait(context.Background(), Interval, timeout, fn); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// Wait calls fn at once and then every interval until it returns nil, and
// returns nil then. After timeout it returns "not within <timeout>:
// <fn's last error>" (the last error is wrapped); when ctx ends first it
// returns ctx's error together with fn's last error.
func Wait(ctx context.Context, interval, timeout time.Duration, fn func() error) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, interval, timeout, true, func(context.Context) (bool, error) {
		last = fn()
		return last == nil, nil
	})
	switch {
	case err == nil:
		return nil
	case last == nil:
		return err // ctx ended before the first call
	case ctx.Err() != nil:
		return fmt.Errorf("%w (last: %w)", ctx.Err(), last)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("not within %v: %w", timeout, last)
	default:
		return fmt.Errorf("%w (last: %w)", err, last)
	}
}

// Cond turns a condition without a reason into a function for Until and
// Wait: nil when cond is true, else an error saying it is still false.
func Cond(cond func() bool) func() error {
	return func() error {
		if cond() {
			return nil
		}
		return errNotYet
	}
}

var errNotYet = errors.New("condition still false")
