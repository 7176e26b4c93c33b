package ipam

import (
	"math"
	"math/big"
	"strconv"
)

// TotalText returns the number of allocatable addresses as people read it
// in `kubectl get eip` (status.usage.totalText): the exact decimal count up
// to 2^32 (so every IPv4 pool is exact), and above that a power of two with
// the exponent rounded to one decimal, prefixed with "~" unless the count
// is exactly that power. An IPv6 /64 with its subnet's gateway inside holds
// 2^64-1 allocatable addresses and reads "~2^64"; a start-end range of
// exactly 2^40 addresses reads "2^40". Unlike Total it does not saturate.
func (p *Pool) TotalText() string { return formatCount(p.exactTotal()) }

// TotalText is the pool's TotalText.
func (a *Allocator) TotalText() string { return a.pool.TotalText() }

// exactTotal is the sum of the sizes of the allocatable segments.
func (p *Pool) exactTotal() *big.Int {
	sum := new(big.Int)
	for _, s := range p.segs {
		d := s.last.sub(s.first)
		n := new(big.Int).SetUint64(d.hi)
		n.Lsh(n, 64).Or(n, new(big.Int).SetUint64(d.lo))
		sum.Add(sum, n.Add(n, big.NewInt(1)))
	}
	return sum
}

// exactLimit is the largest count printed in full: 2^32, the size of the
// whole IPv4 address space.
var exactLimit = new(big.Int).Lsh(big.NewInt(1), 32)

func formatCount(n *big.Int) string {
	if n.Cmp(exactLimit) <= 0 {
		return n.String()
	}
	exp := n.BitLen() - 1
	if n.TrailingZeroBits() == uint(exp) {
		return "2^" + strconv.Itoa(exp)
	}
	// log2(n) = exp + log2(n / 2^exp), the mantissa in [1, 2).
	m, _ := new(big.Float).SetMantExp(new(big.Float).SetInt(n), -exp).Float64()
	l := math.Round((float64(exp)+math.Log2(m))*10) / 10
	return "~2^" + strconv.FormatFloat(l, 'f', -1, 64)
}
