package v1alpha1_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

func cidrs(ss ...string) []v1.DestinationCIDR {
	out := make([]v1.DestinationCIDR, len(ss))
	for i, s := range ss {
		out[i] = v1.DestinationCIDR(s)
	}
	return out
}

// TestDestinationsCEL creates Egresses with destinationCIDRs and
// excludedCIDRs on the real API server: each rule of DestinationCIDR and
// the list bounds reject with their message, and valid lists of both
// families are stored as written.
func TestDestinationsCEL(t *testing.T) {
	ctx := context.Background()
	many := make([]string, 65)
	for i := range many {
		many[i] = fmt.Sprintf("198.51.100.%d/32", i)
	}
	withDst := func(name string, dst, exc []v1.DestinationCIDR) *v1.Egress {
		e := egress(name, "office-egress", "")
		e.Spec.DestinationCIDRs, e.Spec.ExcludedCIDRs = dst, exc
		return e
	}
	for _, tc := range []struct {
		name     string
		dst, exc []v1.DestinationCIDR
		wantErr  string // empty: accepted
	}{
		{"both families", cidrs("198.51.100.0/24", "2001:db8:1::/48"), nil, ""},
		{"every destination written out", cidrs("0.0.0.0/0", "::/0"), nil, ""},
		{"host routes", cidrs("203.0.113.7/32", "2001:db8::7/128"), cidrs("198.51.100.0/25"), ""},
		{"only exclusions", nil, cidrs("203.0.113.0/25", "2001:db8:2::/64"), ""},
		{"64 entries", cidrs(many[:64]...), cidrs(many[:64]...), ""},

		{"not a CIDR", cidrs("198.51.100.10"), nil, "destination CIDRs must be CIDRs such as 198.51.100.0/24"},
		{"prefix too long", cidrs("198.51.100.0/33"), nil, "destination CIDRs must be CIDRs such as 198.51.100.0/24"},
		{"excluded not a CIDR", nil, cidrs("partner-net"), "spec.excludedCIDRs[0]: Invalid value: \"partner-net\": destination CIDRs must be CIDRs such as"},
		{"host bits", cidrs("198.51.100.7/24"), nil, "destination CIDRs must not have host bits set"},
		{"host bits ipv6", nil, cidrs("2001:db8::1/64"), "destination CIDRs must not have host bits set"},
		{"upper case ipv6", cidrs("2001:DB8::/32"), nil, "destination CIDRs must be written in canonical form"},
		{"uncompressed ipv6", cidrs("2001:db8:0:0::/64"), nil, "destination CIDRs must be written in canonical form"},
		{"leading zeros", cidrs("198.051.100.0/24"), nil, "destination CIDRs must be CIDRs such as"},
		{"65 destinations", cidrs(many...), nil, "spec.destinationCIDRs: Too many: 65: must have at most 64 items"},
		{"65 exclusions", nil, cidrs(many...), "spec.excludedCIDRs: Too many: 65: must have at most 64 items"},
		{"duplicate", cidrs("198.51.100.0/24", "198.51.100.0/24"), nil, "spec.destinationCIDRs[1]: Duplicate value"},
		{"too long", cidrs("2001:db8:1111:2222:3333:4444:5555:6666:7777/128"), nil, "spec.destinationCIDRs[0]: Too long"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := withDst("dst-"+strings.ToLower(strings.ReplaceAll(tc.name, " ", "-")), tc.dst, tc.exc)
			err := env.Client.Create(ctx, e)
			if err == nil {
				t.Cleanup(func() { _ = env.Client.Delete(context.Background(), e) })
			}
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("rejected: %v", err)
			case tc.wantErr == "":
				var got v1.Egress
				if err := env.Client.Get(ctx, client.ObjectKeyFromObject(e), &got); err != nil {
					t.Fatal(err)
				}
				if fmt.Sprint(got.Spec.DestinationCIDRs, got.Spec.ExcludedCIDRs) != fmt.Sprint(tc.dst, tc.exc) {
					t.Errorf("stored %v / %v, want %v / %v", got.Spec.DestinationCIDRs, got.Spec.ExcludedCIDRs, tc.dst, tc.exc)
				}
			case err == nil:
				t.Fatalf("accepted, want rejection %q", tc.wantErr)
			case !rejectionMatches(err.Error(), tc.wantErr) || strings.Contains(err.Error(), "evaluating rule"):
				t.Fatalf("want rejection %q, got %v", tc.wantErr, err)
			default:
				t.Logf("%v", err)
			}
		})
	}
}

// TestDestinationsColumn reads the Destinations column of `kubectl get
// egress -o wide` from the CRD as the API server serves it.
func TestDestinationsColumn(t *testing.T) {
	crd := &unstructured.Unstructured{}
	crd.SetAPIVersion("apiextensions.k8s.io/v1")
	crd.SetKind("CustomResourceDefinition")
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: "egresses.egressip.io"}, crd); err != nil {
		t.Fatal(err)
	}
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	if len(versions) == 0 {
		t.Fatal("no versions")
	}
	cols, _, _ := unstructured.NestedSlice(versions[0].(map[string]any), "additionalPrinterColumns")
	for _, c := range cols {
		m := c.(map[string]any)
		if m["name"] == "Destinations" {
			if m["jsonPath"] != ".spec.destinationCIDRs" {
				t.Errorf("Destinations column reads %v, want .spec.destinationCIDRs", m["jsonPath"])
			}
			return
		}
	}
	t.Errorf("no Destinations column among %v", cols)
}
