package controller

import (
	"reflect"

	"k8s.io/apimachinery/pkg/api/equality"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// egressStatusEqual reports whether a and b are the same status in the
// sense of equality.Semantic (times compared as instants, nil and empty
// slices alike), which decides whether the pass patches an Egress.
// Identical values (reflect.DeepEqual) are semantically equal, and they
// are the common case of a pass that changes nothing; Semantic's
// reflection, which calls a function per metav1.Time, was a third of a
// warm pass over 5,000 Egresses (BenchmarkPass). Only values that differ
// in representation go to the Semantic comparison.
func egressStatusEqual(a, b *v1.EgressStatus) bool {
	return reflect.DeepEqual(a, b) || equality.Semantic.DeepEqual(a, b)
}
