package scheduler

// keyed is a 16-byte sort record: hi, then lo, where the low 32 bits of lo
// carry the index of what the record stands for (see index).
type keyed struct{ hi, lo uint64 }

// index is the payload of r.
func (r keyed) index() int32 { return int32(uint32(r.lo)) }

// radixScratch is the counting memory of radixSort, kept between sorts so
// that a sort neither allocates nor clears more than it uses.
type radixScratch struct {
	count [16][256]int32 // per byte position: histogram, then next index
	dense []int32        // per hi value minus the smallest: the same
}

// radixSort sorts a by hi and then by the bytes of lo where loMask is 0xff
// (loMask is made of 0x00 and 0xff bytes), stably,
// using tmp (same length) as scratch, and returns the sorted slice, which is
// a or tmp. It is an LSD radix sort on bytes that skips every byte position
// where all keys agree, so it costs O(n) plus O(n) per byte position that
// varies: names and creation times usually vary in a few bytes only. When
// the hi values span fewer than 2n consecutive values (creation times
// seconds apart, say) and more than one of their bytes varies, hi takes
// one counting pass over hi minus the smallest value instead of one pass
// per byte. sc holds the counters; nil means fresh ones.
func radixSort(a, tmp []keyed, loMask uint64, sc *radixScratch) []keyed {
	n := len(a)
	if n < 2 {
		return a
	}
	if sc == nil {
		sc = new(radixScratch)
	}
	// Bytes where some key differs from the first one, and the range of
	// hi.
	diffHi, diffLo, minHi, maxHi := keyStats(a)
	diffLo &= loMask
	// Histograms of those bytes only: byte b of lo is position b, byte b
	// of hi is position 8+b.
	var varying [16]bool
	hiBytes := 0
	for b := range 8 {
		varying[b] = byte(diffLo>>(8*b)) != 0
		varying[8+b] = byte(diffHi>>(8*b)) != 0
		if varying[8+b] {
			hiBytes++
		}
	}
	dense := hiBytes > 1 && maxHi-minHi < uint64(2*n)
	if dense {
		for b := 8; b < 16; b++ {
			varying[b] = false
		}
	}
	count := &sc.count
	for b := range 16 {
		if !varying[b] {
			continue
		}
		c := &count[b]
		clear(c[:])
		if b >= 8 {
			histHi(a, c, uint(8*(b-8)))
		} else {
			histLo(a, c, uint(8*b))
		}
	}
	src, dst := a, tmp[:n]
	for b := range 16 {
		if !varying[b] {
			continue
		}
		c := &count[b]
		var sum int32
		for d := range c {
			c[d], sum = sum, sum+c[d]
		}
		if b >= 8 {
			scatterHi(src, dst, c, uint(8*(b-8)))
		} else {
			scatterLo(src, dst, c, uint(8*b))
		}
		src, dst = dst, src
	}
	if dense {
		sc.dense = reuse(sc.dense, int(maxHi-minHi)+1)
		countingSortHi(src, dst, sc.dense, minHi)
		src = dst
	}
	return src
}

// countingSortHi moves the records of src into dst ordered by hi, stably,
// where every hi minus minHi indexes c (zeroed, one counter per value).
//
//go:noinline
func countingSortHi(src, dst []keyed, c []int32, minHi uint64) {
	for _, r := range src {
		c[r.hi-minHi]++
	}
	var sum int32
	for d := range c {
		c[d], sum = sum, sum+c[d]
	}
	for _, r := range src {
		d := r.hi - minHi
		dst[c[d]] = r
		c[d]++
	}
}

// The inner loops of radixSort, kept apart (and not inlined) so that each
// gets registers of its own instead of spilling its counters to the stack
// inside radixSort: keyStats returns which bits of hi and lo differ from
// a[0]'s somewhere in a (a is not empty) and the smallest and largest hi;
// histHi and histLo count the byte of hi or lo at shift into c; scatterHi
// and scatterLo move each record of src to the next index for its byte (c
// holds the running starts) in dst.

//go:noinline
func keyStats(a []keyed) (diffHi, diffLo, minHi, maxHi uint64) {
	first := a[0]
	minHi, maxHi = first.hi, first.hi
	for _, r := range a {
		diffHi |= r.hi ^ first.hi
		diffLo |= r.lo ^ first.lo
		minHi = min(minHi, r.hi)
		maxHi = max(maxHi, r.hi)
	}
	return diffHi, diffLo, minHi, maxHi
}

//go:noinline
func histHi(a []keyed, c *[256]int32, shift uint) {
	for _, r := range a {
		c[byte(r.hi>>(shift&63))]++
	}
}

//go:noinline
func histLo(a []keyed, c *[256]int32, shift uint) {
	for _, r := range a {
		c[byte(r.lo>>(shift&63))]++
	}
}

//go:noinline
func scatterHi(src, dst []keyed, c *[256]int32, shift uint) {
	for _, r := range src {
		d := byte(r.hi >> (shift & 63))
		dst[c[d]] = r
		c[d]++
	}
}

//go:noinline
func scatterLo(src, dst []keyed, c *[256]int32, shift uint) {
	for _, r := range src {
		d := byte(r.lo >> (shift & 63))
		dst[c[d]] = r
		c[d]++
	}
}
