package selection

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// TestSelectShadowedBy: an Egress whose matching Pods all went to older
// Egresses has no members and names those Egresses; one that keeps a Pod,
// or matches none, has no ShadowedBy entry; a dual-stack Pod is shadowed
// only in the family an older Egress won.
func TestSelectShadowedBy(t *testing.T) {
	pay := map[string]string{"team": "pay"}
	nss := []corev1.Namespace{ns("pay", pay)}
	in := Input{
		Namespaces: nss,
		Egresses: []v1.Egress{
			eg("old-a", 0, "192.0.2.1", pay, map[string]string{"app": "a"}),
			eg("old-b", 1, "192.0.2.2", pay, map[string]string{"app": "b"}),
			eg("young", 5, "192.0.2.3", pay, nil),                             // every Pod of pay, all taken
			eg("partial", 6, "192.0.2.4", nil, map[string]string{"app": "c"}), // keeps c
			eg("nothing", 7, "192.0.2.5", nil, map[string]string{"app": "zz"}),
			eg("v6", 8, "2001:db8::5", pay, map[string]string{"app": "a"}), // the IPv6 of a is free
		},
		Pods: []corev1.Pod{
			pod("pay", "a", "n1", map[string]string{"app": "a"}, "10.0.0.1", "fd00::1"),
			pod("pay", "b", "n1", map[string]string{"app": "b"}, "10.0.0.2"),
			pod("other", "c", "n1", map[string]string{"app": "c"}, "10.0.0.3"),
		},
	}
	r := Select(in)
	want := map[string][]string{"young": {"old-a", "old-b"}}
	if diff := cmp.Diff(want, r.ShadowedBy); diff != "" {
		t.Fatalf("ShadowedBy (-want +got):\n%s", diff)
	}
	if len(r.Members["young"]) != 0 || len(r.Members["v6"]) != 1 || len(r.Members["partial"]) != 1 {
		t.Fatalf("members: %v", names(r))
	}
}
