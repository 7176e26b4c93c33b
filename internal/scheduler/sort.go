package scheduler

// keyed is a sort record: a 128-bit key (hi, then lo) and the index of what
// it stands for.
type keyed struct {
	hi, lo uint64
	i      int32
}

// radixSort sorts a by (hi, lo), stably, using tmp (same length) as
// scratch, and returns the sorted slice, which is a or tmp. It is an LSD
// radix sort on bytes that skips every byte position where all keys agree,
// so it costs O(n) per byte position that varies: names and creation times
// usually vary in a few bytes only.
func radixSort(a, tmp []keyed) []keyed {
	n := len(a)
	if n < 2 {
		return a
	}
	var count [16][256]int32
	for _, r := range a {
		for b := 0; b < 8; b++ {
			count[b][byte(r.lo>>(8*b))]++
			count[8+b][byte(r.hi>>(8*b))]++
		}
	}
	src, dst := a, tmp
	for b := 0; b < 16; b++ {
		c := &count[b]
		shift, hi := uint(8*(b%8)), b >= 8
		var first uint64
		if hi {
			first = a[0].hi
		} else {
			first = a[0].lo
		}
		if c[byte(first>>shift)] == int32(n) {
			continue // every key has the same byte here
		}
		var sum int32
		for d := range c {
			c[d], sum = sum, sum+c[d]
		}
		for _, r := range src {
			k := r.lo
			if hi {
				k = r.hi
			}
			d := byte(k >> shift)
			dst[c[d]] = r
			c[d]++
		}
		src, dst = dst, src
	}
	return src
}
