package scheduler

import (
	"errors"
	"fmt"
	"strconv"
)

// CapacityAnnotation is the Node annotation that overrides the controller's
// --max-egress-ips-per-node flag for one Node.
const CapacityAnnotation = "egressip.io/max-egress-ips"

// ErrInvalidCapacity is wrapped by every error of ParseCapacity.
var ErrInvalidCapacity = errors.New("invalid " + CapacityAnnotation + " value")

// ParseCapacity parses the value of the egressip.io/max-egress-ips Node
// annotation: the most egress IPs the Node may hold, across all pools.
//
// The value must be a base-10 integer from 0 to limit (the controller's
// maximum for the flag, 255 by default), written in canonical form: ASCII
// digits only, no sign, no spaces, no leading zeros ("0" itself is fine).
// So "", "abc", "-1", "+5", " 5", "5 ", "0x10", "1e2" and "05" are invalid,
// as is any value above limit. Leading zeros are refused rather than read as
// decimal because "010" reads as 8 to anyone used to octal. 0 means the Node
// takes no IPs.
//
// On error the returned int is 0 and the error wraps ErrInvalidCapacity and
// quotes the value (cut to 64 bytes); the caller reports it and applies the
// flag's default. A negative limit makes every value invalid.
func ParseCapacity(annotation string, limit int) (int, error) {
	if limit < 0 {
		return 0, fmt.Errorf("%w: limit %d is negative", ErrInvalidCapacity, limit)
	}
	bad := func(why string) (int, error) {
		return 0, fmt.Errorf("%w %s: %s; want a base-10 integer from 0 to %d", ErrInvalidCapacity, quoteCut(annotation), why, limit)
	}
	if annotation == "" {
		return bad("empty")
	}
	for i := 0; i < len(annotation); i++ {
		if c := annotation[i]; c < '0' || c > '9' {
			return bad(fmt.Sprintf("byte %d is %q, not a digit", i, c))
		}
	}
	if len(annotation) > 1 && annotation[0] == '0' {
		return bad("leading zero")
	}
	n := 0
	for i := 0; i < len(annotation); i++ {
		d := int(annotation[i] - '0')
		if d > limit || n > (limit-d)/10 { // n*10+d > limit, without overflow
			return bad("above the limit")
		}
		n = n*10 + d
	}
	return n, nil
}

// quoteCut quotes v, keeping at most its first 64 bytes.
func quoteCut(v string) string {
	const maxLen = 64
	if len(v) <= maxLen {
		return strconv.Quote(v)
	}
	return strconv.Quote(v[:maxLen]) + "..."
}
