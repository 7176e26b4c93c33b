package ipam

import (
	"errors"
	"net/netip"
	"slices"
	"sync"
)

// Allocator tracks which addresses of one Pool are allocated. It holds no
// state of its own beyond memory: at start-up, or when the pool changes, the
// controller builds a new Allocator and reserves the IPs found in the
// statuses of the pool's Egresses (ReserveAll).
//
// An address is either allocated or free; Egresses that name the same IP
// share one allocation, counted once in Used. The caller releases an IP when
// no Egress holds it any more.
//
// The allocated addresses are kept as a sorted slice of maximal runs of
// consecutive addresses, so memory and the cost of each call grow with the
// number of runs, never with the size of the pool: Allocate is
// O(segments · log runs), Reserve and Release O(log runs) plus moving at
// most the runs after the change (a copy, no allocation in the common case).
// An Allocator is safe for concurrent use.
type Allocator struct {
	pool *Pool

	mu   sync.Mutex
	runs []span // allocated addresses: sorted, disjoint, non-adjacent
	used uint64
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
	return spanIndex(a.runs, fromAddr(ip)) >= 0
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
	a.insert(fromAddr(ip))
	return nil
}

// ReserveAll reserves every address of ips, as Reserve does, in
// O((len(ips)+runs) log len(ips)): this is how the allocation state is
// rebuilt from Egress statuses. Addresses the pool cannot hold are skipped
// and reported together (errors.Join of their *AddrError); the others are
// reserved regardless.
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
	merged := make([]span, 0, len(a.runs)+len(pts))
	push := func(s span) {
		if n := len(merged); n > 0 && merged[n-1].touches(s) {
			if merged[n-1].last.less(s.last) {
				merged[n-1].last = s.last
			}
			return
		}
		merged = append(merged, s)
	}
	i := 0
	for _, u := range pts {
		for i < len(a.runs) && a.runs[i].first.less(u) {
			push(a.runs[i])
			i++
		}
		// Every old run starting before u is pushed; u is already allocated
		// if the last of them, or the next one, holds it.
		already := (i > 0 && a.runs[i-1].contains(u)) || (i < len(a.runs) && a.runs[i].first == u)
		if !already {
			a.used++
		}
		push(span{u, u})
	}
	for ; i < len(a.runs); i++ {
		push(a.runs[i])
	}
	a.runs = merged
	return errors.Join(errs...)
}

// Allocate allocates and returns the lowest free address of the pool, so
// that the result depends only on which addresses are allocated. It returns
// ErrExhausted when none is free.
func (a *Allocator) Allocate() (netip.Addr, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, seg := range a.pool.segs {
		u := seg.first
		if i := spanIndex(a.runs, u); i >= 0 {
			// Runs are maximal, so the address after a run is free unless
			// it leaves the segment.
			if !a.runs[i].last.less(seg.last) {
				continue
			}
			u = a.runs[i].last.add1()
		}
		a.insert(u)
		return u.addr(a.pool.is6), nil
	}
	return netip.Addr{}, ErrExhausted
}

// Release frees ip and reports whether it was allocated. Releasing a free
// address, or one the pool cannot hold, does nothing.
func (a *Allocator) Release(ip netip.Addr) bool {
	if a.pool.Check(ip) != nil {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	u := fromAddr(ip)
	j := spanIndex(a.runs, u)
	if j < 0 {
		return false
	}
	r := a.runs[j]
	switch {
	case r.first == r.last:
		a.runs = slices.Delete(a.runs, j, j+1)
	case r.first == u:
		a.runs[j].first = u.add1()
	case r.last == u:
		a.runs[j].last = u.sub1()
	default:
		a.runs[j].last = u.sub1()
		a.runs = slices.Insert(a.runs, j+1, span{u.add1(), r.last})
	}
	a.used--
	return true
}

// insert adds u to the runs; it reports false if u was already allocated.
// The caller holds a.mu.
func (a *Allocator) insert(u u128) bool {
	// i is the first run starting after u.
	i, _ := slices.BinarySearchFunc(a.runs, u, func(s span, u u128) int {
		if u.less(s.first) {
			return 1
		}
		return -1
	})
	if i > 0 && a.runs[i-1].contains(u) {
		return false
	}
	joinPrev := i > 0 && a.runs[i-1].last.add1() == u
	joinNext := i < len(a.runs) && u.add1() == a.runs[i].first
	switch {
	case joinPrev && joinNext:
		a.runs[i-1].last = a.runs[i].last
		a.runs = slices.Delete(a.runs, i, i+1)
	case joinPrev:
		a.runs[i-1].last = u
	case joinNext:
		a.runs[i].first = u
	default:
		a.runs = slices.Insert(a.runs, i, span{u, u})
	}
	a.used++
	return true
}
