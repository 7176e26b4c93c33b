package ipam

import (
	"cmp"
	"encoding/binary"
	"math"
	"math/bits"
	"net/netip"
)

// u128 is an IP address as an unsigned 128-bit integer, used for interval
// arithmetic. An IPv4 address occupies the low 32 bits; the pool, which holds
// one family, remembers which family to convert back to.
type u128 struct{ hi, lo uint64 }

var maxU128 = u128{math.MaxUint64, math.MaxUint64}

func fromAddr(a netip.Addr) u128 {
	if a.Is4() {
		b := a.As4()
		return u128{lo: uint64(binary.BigEndian.Uint32(b[:]))}
	}
	b := a.As16()
	return u128{binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])}
}

func (u u128) addr(is6 bool) netip.Addr {
	if !is6 {
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], uint32(u.lo))
		return netip.AddrFrom4(b)
	}
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], u.hi)
	binary.BigEndian.PutUint64(b[8:], u.lo)
	return netip.AddrFrom16(b)
}

func (u u128) cmp(v u128) int {
	if u.hi != v.hi {
		return cmp.Compare(u.hi, v.hi)
	}
	return cmp.Compare(u.lo, v.lo)
}

func (u u128) less(v u128) bool { return u.hi < v.hi || (u.hi == v.hi && u.lo < v.lo) }

// add1 returns u+1, wrapping at 2^128.
func (u u128) add1() u128 {
	lo, carry := bits.Add64(u.lo, 1, 0)
	return u128{u.hi + carry, lo}
}

// sub1 returns u-1, wrapping at 0.
func (u u128) sub1() u128 {
	lo, borrow := bits.Sub64(u.lo, 1, 0)
	return u128{u.hi - borrow, lo}
}

func (u u128) sub(v u128) u128 {
	lo, borrow := bits.Sub64(u.lo, v.lo, 0)
	return u128{u.hi - v.hi - borrow, lo}
}

func (u u128) or(v u128) u128 { return u128{u.hi | v.hi, u.lo | v.lo} }

// hostMask returns the mask of the host bits of a prefix of length plen in
// an address of addrBits bits (32 or 128).
func hostMask(addrBits, plen int) u128 {
	h := addrBits - plen
	switch {
	case h <= 0:
		return u128{}
	case h >= 128:
		return maxU128
	case h >= 64:
		return u128{hi: 1<<(h-64) - 1, lo: math.MaxUint64}
	}
	return u128{lo: 1<<h - 1}
}

// span is an inclusive interval of addresses, first <= last.
type span struct{ first, last u128 }

// size returns the number of addresses in s, saturated at math.MaxUint64.
func (s span) size() uint64 {
	d := s.last.sub(s.first)
	if d.hi != 0 || d.lo == math.MaxUint64 {
		return math.MaxUint64
	}
	return d.lo + 1
}

func (s span) contains(u u128) bool { return !u.less(s.first) && !s.last.less(u) }

// touches reports whether t, which starts at or after s, overlaps s or begins
// right after it, so that the two can be merged into one span.
func (s span) touches(t span) bool {
	return !s.last.less(t.first) || (s.last != maxU128 && s.last.add1() == t.first)
}

// satAdd returns a+b, saturated at math.MaxUint64.
func satAdd(a, b uint64) uint64 {
	s, carry := bits.Add64(a, b, 0)
	if carry != 0 {
		return math.MaxUint64
	}
	return s
}

// upperBound returns the number of leading spans of sorted spans that start
// at or before u (the index of the first span starting after u).
func upperBound(spans []span, u u128) int {
	lo, hi := 0, len(spans)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if u.less(spans[m].first) {
			hi = m
		} else {
			lo = m + 1
		}
	}
	return lo
}
