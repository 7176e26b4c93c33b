package ipam

import (
	"errors"
	"net/netip"
	"slices"
	"sync"
)

// Allocator tracks which addresses of one Pool are allocated. Its state
// lives only in memory: at start-up, or when the pool's spec changes, the
// controller builds a new Allocator and reserves the IPs found in the
// statuses of the pool's Egresses (ReserveAll); an IP that the new pool
// cannot hold comes back as an error naming it.
//
// An address is either allocated or free; Egresses that name the same IP
// share one allocation, counted once in Used. The caller releases an IP when
// no Egress holds it any more.
//
// The allocated addresses are kept as maximal runs of consecutive addresses
// (so 60000 addresses allocated lowest-first are one run), in sorted blocks
// of at most 256 runs. Memory and the cost of each call grow with the number
// of runs, never with the size of the pool: Reserve, Release and IsAllocated
// are O(log runs) plus copying one block; Allocate is O(log runs) per
// segment of the pool it inspects (a segment is a stretch of allocatable
// addresses between reserved ones or between ranges), and it skips the
// leading segments known to be full. An Allocator is safe for concurrent
// use.
type Allocator struct {
	pool *Pool

	mu   sync.Mutex
	runs runSet // the allocated addresses
	used uint64
	// full is the index of the first segment of pool.segs that may have a
	// free address: every segment before it is fully allocated.
	full int
}

// NewAllocator returns an Allocator for p with nothing allocated.
func NewAllocator(p *Pool) *Allocator { return &Allocator{pool: p} }

// Pool returns the pool the Allocator allocates from.
func (a *Allocator) Pool() *Pool { return a.pool }

// Total returns the number of allocatable addresses of the pool, saturated
// at math.MaxUint64; see Pool.Total.
func (a *Allocator) Total() uint64 { return a.pool.total }

// Used returns the number of allocated addresses. It never exceeds Total.
func (a *Allocator) Used() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.used
}

// Free returns Total - Used. For a pool whose Total saturated, Free is a
// lower bound.
func (a *Allocator) Free() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.pool.total - a.used
}

// IsAllocated reports whether ip is allocated.
func (a *Allocator) IsAllocated(ip netip.Addr) bool {
	if a.pool.Check(ip) != nil {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.runs.contains(fromAddr(ip))
}

// Reserve marks ip as allocated, for an Egress that names its IP or whose
// status already holds one. Reserving an allocated IP again succeeds and
// changes nothing, which is how Egresses share an IP. It returns the
// *AddrError of Pool.Check (wrapping ErrOutsidePool or ErrReservedAddress)
// when the pool cannot hold ip.
func (a *Allocator) Reserve(ip netip.Addr) error {
	if err := a.pool.Check(ip); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.runs.insert(fromAddr(ip)) {
		a.used++
	}
	return nil
}

// ReserveAll reserves every address of ips, as Reserve does, in
// O(n log n + runs) for n addresses: this is how the allocation state is
// rebuilt from Egress statuses. Addresses the pool cannot hold are skipped
// and reported together (errors.Join of their *AddrError, in input order);
// the others are reserved regardless.
func (a *Allocator) ReserveAll(ips []netip.Addr) error {
	var errs []error
	pts := make([]u128, 0, len(ips))
	for _, ip := range ips {
		if err := a.pool.Check(ip); err != nil {
			errs = append(errs, err)
			continue
		}
		pts = append(pts, fromAddr(ip))
	}
	slices.SortFunc(pts, u128.cmp)
	pts = slices.Compact(pts)

	a.mu.Lock()
	defer a.mu.Unlock()
	a.used += a.runs.union(pts)
	return errors.Join(errs...)
}

// Allocate allocates and returns the lowest free address of the pool, so
// that the result depends only on which addresses are allocated. It returns
// ErrExhausted when none is free.
func (a *Allocator) Allocate() (netip.Addr, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for k := a.full; k < len(a.pool.segs); k++ {
		if u, ok := a.runs.firstFree(a.pool.segs[k]); ok {
			a.full = k
			a.runs.insert(u)
			a.used++
			return u.addr(a.pool.is6), nil
		}
	}
	a.full = len(a.pool.segs)
	return netip.Addr{}, ErrExhausted
}

// Release frees ip and reports whether it was allocated. Releasing a free
// address, or one the pool cannot hold, does nothing.
func (a *Allocator) Release(ip netip.Addr) bool {
	if a.pool.Check(ip) != nil {
		return false
	}
	u := fromAddr(ip)
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.runs.remove(u) {
		return false
	}
	a.used--
	if k := spanIndex(a.pool.segs, u); k < a.full {
		a.full = k
	}
	return true
}
