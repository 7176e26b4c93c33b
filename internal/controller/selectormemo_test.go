package controller

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// TestSelectorMemo: the memo answers what selectorError answers, parses a
// spec again when its generation changes, and forgets Egresses a pass did
// not ask for.
func TestSelectorMemo(t *testing.T) {
	good := &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}
	bad := &metav1.LabelSelector{MatchLabels: map[string]string{"app": "not a value!"}}
	eg := func(uid string, gen int64, sel *metav1.LabelSelector) *v1.Egress {
		e := &v1.Egress{Spec: v1.EgressSpec{AppliedTo: v1.AppliedTo{PodSelector: sel}}}
		e.UID, e.Generation = types.UID(uid), gen
		return e
	}
	var m selectorMemo
	a1 := eg("a", 1, good)
	if err := m.err(a1); err != nil {
		t.Fatalf("valid selector: %v", err)
	}
	// Same UID and generation: the memo answers (even if the object in
	// hand were different, which an API server never allows).
	if err := m.err(eg("a", 1, bad)); err != nil {
		t.Errorf("same generation: got %v, want the remembered nil", err)
	}
	// A new generation is parsed again.
	want := selectorError(eg("a", 2, bad))
	if want == nil {
		t.Fatal("selectorError accepts the invalid selector")
	}
	if err := m.err(eg("a", 2, bad)); err == nil || err.Error() != want.Error() {
		t.Errorf("new generation: got %v, want %v", err, want)
	}
	// Without UID or generation: never remembered.
	if err := m.err(eg("", 0, bad)); err == nil {
		t.Error("an Egress without UID: got nil, want the parse error")
	}
	_ = m.err(eg("b", 1, good))
	m.endPass()
	if len(m.entries) != 2 {
		t.Errorf("after the first pass: %d entries, want 2 (a, b)", len(m.entries))
	}
	_ = m.err(eg("a", 2, bad))
	m.endPass()
	if _, ok := m.entries["b"]; ok || len(m.entries) != 1 {
		t.Errorf("after a pass without b: entries %v, want only a", m.entries)
	}
	var nilMemo *selectorMemo
	if err := nilMemo.err(eg("c", 1, bad)); err == nil {
		t.Error("nil memo: got nil, want the parse error")
	}
	nilMemo.endPass()
}

// TestMatchLabelsValidDifferential: matchLabelsValid says true only for
// selectors metav1.LabelSelectorAsSelector accepts, and for matchLabels
// alone it agrees with it in both directions; selectorError gives
// LabelSelectorAsSelector's error text.
func TestMatchLabelsValidDifferential(t *testing.T) {
	long := strings.Repeat("a", 63)
	keys := []string{"app", "a", "", "-a", "a-", "a.b", "a_b", "A9", long, long + "a", "x/app", "example.com/app", "Example.com/app",
		"example.com/", "/app", "a/b/c", strings.Repeat("d.", 127) + "e/app", "exa mple.com/app", "app!", "ä"}
	values := []string{"", "web", "a-b", "-a", "a-", "a.b_c", long, long + "a", "not a value!", "ä", "A.9"}
	check := func(sel *metav1.LabelSelector) {
		t.Helper()
		_, ref := metav1.LabelSelectorAsSelector(sel)
		if matchLabelsValid(sel) && ref != nil {
			t.Errorf("%v: matchLabelsValid true, LabelSelectorAsSelector says %v", sel, ref)
		}
		if len(sel.MatchExpressions) == 0 && !matchLabelsValid(sel) && ref == nil {
			t.Errorf("%v: matchLabelsValid false, LabelSelectorAsSelector accepts it", sel)
		}
		e := &v1.Egress{Spec: v1.EgressSpec{AppliedTo: v1.AppliedTo{PodSelector: sel}}}
		got := selectorError(e)
		if (got == nil) != (ref == nil) || got != nil && got.Error() != "podSelector: "+ref.Error() {
			t.Errorf("%v: selectorError %v, want podSelector: %v", sel, got, ref)
		}
	}
	for _, k := range keys {
		for _, v := range values {
			check(&metav1.LabelSelector{MatchLabels: map[string]string{k: v}})
			check(&metav1.LabelSelector{MatchLabels: map[string]string{k: v, "tier": "db"}})
			check(&metav1.LabelSelector{MatchLabels: map[string]string{"tier": "db"},
				MatchExpressions: []metav1.LabelSelectorRequirement{{Key: k, Operator: metav1.LabelSelectorOpIn, Values: []string{v}}}})
		}
	}
	check(&metav1.LabelSelector{})
	check(&metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Bogus"}}})
}
