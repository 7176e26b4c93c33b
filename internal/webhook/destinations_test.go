package webhook_test

import (
	"context"
	"strings"
	"testing"
	"time"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// TestDestinationsWebhookWarnings: what CEL cannot check about
// destinationCIDRs and excludedCIDRs is admitted with a warning: entries
// of the other family than the Egress's pool, a list with none of its
// family (it carries nothing), and a destination its own exclusions
// cover; a plain list of its family warns nothing about destinations.
func TestDestinationsWebhookWarnings(t *testing.T) {
	c, w := warningClient(t)
	ctx := context.Background()
	create(t, pool("dwarn", v1.IPRange{CIDR: "203.0.113.96/28"}), "")
	for _, tc := range []struct {
		name     string
		dst, exc []v1.DestinationCIDR
		want     string // empty: no warning about destinations
	}{
		{"dwarn-v6-only", []v1.DestinationCIDR{"2001:db8::/32"}, nil, "spec.destinationCIDRs lists no IPv4 network, the family of this Egress: it carries no traffic at all"},
		{"dwarn-mixed", []v1.DestinationCIDR{"198.51.100.0/24", "2001:db8::/32"}, []v1.DestinationCIDR{"2001:db8:1::/48"}, "2001:db8::/32, 2001:db8:1::/48: not IPv4, the family of this Egress, so it never uses them"},
		{"dwarn-excluded", []v1.DestinationCIDR{"198.51.100.0/25"}, []v1.DestinationCIDR{"198.51.100.0/24"}, "spec.destinationCIDRs 198.51.100.0/25 lies inside spec.excludedCIDRs 198.51.100.0/24 of the same Egress"},
		{"dwarn-exclude-all", nil, []v1.DestinationCIDR{"0.0.0.0/0"}, "spec.excludedCIDRs 0.0.0.0/0 excludes every destination of its family and spec.destinationCIDRs is empty"},
		{"dwarn-plain", []v1.DestinationCIDR{"198.51.100.0/24"}, []v1.DestinationCIDR{"198.51.100.128/25"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ws []string
			deadline := time.Now().Add(20 * time.Second)
			for {
				e := egress(tc.name, "dwarn", "")
				e.Spec.DestinationCIDRs, e.Spec.ExcludedCIDRs = tc.dst, tc.exc
				w.take()
				if err := c.Create(ctx, e); err != nil {
					t.Fatalf("create: %v", err)
				}
				ws = w.take()
				if err := c.Delete(ctx, e); err != nil {
					t.Fatal(err)
				}
				// The webhook's cache may not have the pool yet.
				if !containsWarning(ws, "does not exist yet") || time.Now().After(deadline) {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
			switch {
			case tc.want != "" && !containsWarning(ws, tc.want):
				t.Errorf("warnings %q, want one containing %q", ws, tc.want)
			case tc.want == "" && (containsWarning(ws, "destinationCIDRs") || containsWarning(ws, "family of this Egress")):
				t.Errorf("warnings %q, want none about destinations", ws)
			}
			t.Logf("%s: %s", tc.name, strings.Join(ws, " | "))
		})
	}
}
