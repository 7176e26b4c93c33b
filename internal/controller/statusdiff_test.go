package controller

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// egressStatusEqual decides like equality.Semantic.DeepEqual, including
// where it differs from reflect.DeepEqual.
func TestEgressStatusEqual(t *testing.T) {
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	cond := func(when time.Time, reason string) []metav1.Condition {
		return []metav1.Condition{{Type: v1.ConditionReady, Status: metav1.ConditionTrue, Reason: reason, Message: "m", LastTransitionTime: metav1.NewTime(when)}}
	}
	base := v1.EgressStatus{EgressIP: "192.0.2.5", EgressNode: "n1", Conditions: cond(at, "Announced")}
	with := func(f func(*v1.EgressStatus)) v1.EgressStatus { s := *base.DeepCopy(); f(&s); return s }
	for _, tc := range []struct {
		name string
		b    v1.EgressStatus
		want bool
	}{
		{"identical", *base.DeepCopy(), true},
		{"same instant in another location", with(func(s *v1.EgressStatus) { s.Conditions = cond(at.In(time.FixedZone("x", 3600)), "Announced") }), true},
		{"empty and nil slices", with(func(s *v1.EgressStatus) { s.SharedWith = []string{} }), true},
		{"other Node", with(func(s *v1.EgressStatus) { s.EgressNode = "n2" }), false},
		{"other reason", with(func(s *v1.EgressStatus) { s.Conditions = cond(at, "Binding") }), false},
		{"other instant", with(func(s *v1.EgressStatus) { s.Conditions = cond(at.Add(time.Second), "Announced") }), false},
		{"no conditions", with(func(s *v1.EgressStatus) { s.Conditions = nil }), false},
	} {
		a := *base.DeepCopy()
		if got := egressStatusEqual(&a, &tc.b); got != tc.want {
			t.Errorf("%s: egressStatusEqual = %v, want %v", tc.name, got, tc.want)
		}
		if sem := equality.Semantic.DeepEqual(a, tc.b); sem != tc.want {
			t.Errorf("%s: the case is wrong: Semantic.DeepEqual = %v", tc.name, sem)
		}
	}
}
