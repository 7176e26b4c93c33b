// Package nsrun runs a function inside a network namespace without letting
// the namespace switch leak to other goroutines.
package nsrun

import (
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
)

// In runs fn in network namespace ns and returns its error. When ns is not
// open, fn runs on the caller's goroutine, in the caller's namespace.
// Otherwise fn runs on a new goroutine whose OS thread is locked and
// switched into ns, and never unlocked: the Go runtime ends that thread
// with the goroutine, so no other goroutine is ever scheduled on a thread
// left in ns (setns(2) changes only the calling thread). Sockets fn opens
// stay in ns after it returns. The error is fn's, or "setns: ..." when the
// switch fails.
func In(ns netns.NsHandle, fn func() error) error {
	if !ns.IsOpen() {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		if err := netns.Set(ns); err != nil {
			errc <- fmt.Errorf("setns: %w", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}
