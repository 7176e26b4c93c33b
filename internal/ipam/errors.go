package ipam

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

var (
	// ErrExhausted is returned by Allocator.Allocate when every allocatable
	// address of the pool is in use.
	ErrExhausted = errors.New("ipam: pool exhausted: no free IP")

	// ErrOutsidePool is wrapped by the *AddrError returned when an address is
	// not in any of the pool's ipRanges, is zero, carries a zone, or belongs
	// to the other IP family.
	ErrOutsidePool = errors.New("ipam: IP not in the pool")

	// ErrReservedAddress is wrapped by the *AddrError returned when an address
	// lies in one of the pool's ipRanges but is never allocated: the pool's
	// gateway, the network or broadcast address of an IPv4 CIDR or subnet, or
	// the Subnet-Router anycast address of an IPv6 CIDR or subnet (see the
	// package documentation).
	ErrReservedAddress = errors.New("ipam: reserved address, never allocated")

	// ErrExcludedAddress is wrapped by the *AddrError returned when an
	// address lies in one of the pool's ipRanges but the caller excluded it
	// (Pool.WithExclusions), e.g. because it is a Node's own address.
	ErrExcludedAddress = errors.New("ipam: excluded address, never allocated")
)

// AddrError explains why an address cannot be allocated from a pool. Err is
// ErrOutsidePool or ErrReservedAddress, so callers can use errors.Is.
type AddrError struct {
	Addr   netip.Addr // the address as given
	Reason string     // completes "IP <addr> ...", e.g. "is the gateway (subnetInfo.gateway)"
	Err    error      // ErrOutsidePool, ErrReservedAddress or ErrExcludedAddress
}

// Error reads "IP <addr> <reason>", plus ", which is never allocated" for a
// reserved address.
func (e *AddrError) Error() string {
	if !e.Addr.IsValid() {
		return "no valid IP address given"
	}
	if errors.Is(e.Err, ErrReservedAddress) || errors.Is(e.Err, ErrExcludedAddress) {
		return fmt.Sprintf("IP %s %s, which is never allocated", e.Addr, e.Reason)
	}
	return fmt.Sprintf("IP %s %s", e.Addr, e.Reason)
}

func (e *AddrError) Unwrap() error { return e.Err }

// FieldError is one problem in a pool specification. Field is the path of
// the offending field relative to the ExternalIPPool spec in its JSON
// spelling, e.g. "ipRanges[2].start" or "subnetInfo.gateway", so that a
// webhook can map it onto a field path. Value is the offending value as
// written (may be empty when the problem is a missing field).
type FieldError struct {
	Field  string
	Value  string
	Reason string
}

func (e *FieldError) Error() string {
	if e.Value != "" {
		return fmt.Sprintf("%s: %q: %s", e.Field, e.Value, e.Reason)
	}
	return fmt.Sprintf("%s: %s", e.Field, e.Reason)
}

// FieldErrors is every problem found in a pool specification: problems of
// single entries in entry order, then problems between entries. ParseRanges
// and NewPool return it as their error; it unwraps to its elements, so
// errors.As finds the first *FieldError.
type FieldErrors []*FieldError

func (l FieldErrors) Error() string {
	s := make([]string, len(l))
	for i, e := range l {
		s[i] = e.Error()
	}
	return strings.Join(s, "; ")
}

// Unwrap returns the elements as errors.
func (l FieldErrors) Unwrap() []error {
	out := make([]error, len(l))
	for i, e := range l {
		out[i] = e
	}
	return out
}
