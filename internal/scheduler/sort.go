package scheduler

// keyed is a 16-byte sort record: hi, then lo, where the low 32 bits of lo
// carry the index of what the record stands for (see index).
type keyed struct{ hi, lo uint64 }

// index is the payload of r.
func (r keyed) index() int32 { return int32(uint32(r.lo)) }

// radixSort sorts a by hi and then by the bytes of lo where loMask is 0xff
// (loMask is made of 0x00 and 0xff bytes), stably,
// using tmp (same length) as scratch, and returns the sorted slice, which is
// a or tmp. It is an LSD radix sort on bytes that skips every byte position
// where all keys agree, so it costs O(n) plus O(n) per byte position that
// varies: names and creation times usually vary in a few bytes only.
func radixSort(a, tmp []keyed, loMask uint64) []keyed {
	n := len(a)
	if n < 2 {
		return a
	}
	// Bytes where some key differs from the first one.
	var diffHi, diffLo uint64
	for _, r := range a {
		diffHi |= r.hi ^ a[0].hi
		diffLo |= r.lo ^ a[0].lo
	}
	diffLo &= loMask
	// Histograms of those bytes only: byte b of lo is position b, byte b
	// of hi is position 8+b.
	var count [16][256]int32
	var varying [16]bool
	for b := 0; b < 8; b++ {
		varying[b] = byte(diffLo>>(8*b)) != 0
		varying[8+b] = byte(diffHi>>(8*b)) != 0
	}
	for b := 0; b < 16; b++ {
		if !varying[b] {
			continue
		}
		c := &count[b]
		shift := uint(8 * (b % 8))
		if b >= 8 {
			for _, r := range a {
				c[byte(r.hi>>shift)]++
			}
		} else {
			for _, r := range a {
				c[byte(r.lo>>shift)]++
			}
		}
	}
	src, dst := a, tmp
	for b := 0; b < 16; b++ {
		if !varying[b] {
			continue
		}
		c := &count[b]
		var sum int32
		for d := range c {
			c[d], sum = sum, sum+c[d]
		}
		shift := uint(8 * (b % 8))
		if b >= 8 {
			for _, r := range src {
				d := byte(r.hi >> shift)
				dst[c[d]] = r
				c[d]++
			}
		} else {
			for _, r := range src {
				d := byte(r.lo >> shift)
				dst[c[d]] = r
				c[d]++
			}
		}
		src, dst = dst, src
	}
	return src
}
