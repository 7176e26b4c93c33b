package e2e

import (
	"context"
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/agentcert"
	"github.com/egressip/egressip/internal/report"
	"github.com/egressip/egressip/test/e2e/harness"
)

const refusedMetric = "egressip_controller_agent_reports_refused_total"

// pinnedEgress creates a pool whose only eligible Node is n (its hostname
// label) with one IP, and an Egress of it, and waits until it is Ready on
// n. While n's report is refused the Egress can be Ready nowhere.
func pinnedEgress(t *testing.T, n *harness.Node, name, ip string) {
	t.Helper()
	ctx := context.Background()
	pool := &v1.ExternalIPPool{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.ExternalIPPoolSpec{
		IPRanges:     []v1.IPRange{{Start: ip, End: ip}},
		SubnetInfo:   &v1.SubnetInfo{Gateway: harness.BridgeV4.String(), PrefixLength: 24},
		NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelHostname: n.Name}},
	}}
	if err := c.Client.Create(ctx, pool); err != nil {
		t.Fatalf("create pool %s: %v", name, err)
	}
	t.Cleanup(func() { _ = c.Client.Delete(context.Background(), pool) })
	newEgress(t, name, name, "")
	e := waitReady(t, name)[name]
	if e.Status.EgressNode != n.Name {
		t.Fatalf("%s: Ready on %q, want %s", name, e.Status.EgressNode, n.Name)
	}
}

// spoofedReport is what an impostor serves: n is alive and holds ip,
// announced.
func spoofedReport(n *harness.Node, ip string) http.Handler {
	return report.Handler(func() report.Report {
		return report.Report{Node: n.Name, Instance: "spoofed", Bound: []report.BoundIP{{IP: netip.MustParseAddr(ip), Interface: "eth0", Announced: true}}}
	})
}

// refused returns the refusal counter of reason.
func refused(t *testing.T, reason string) float64 {
	t.Helper()
	v, err := c.ControllerMetric(context.Background(), refusedMetric, `reason="`+reason+`"`)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// waitRefused waits until the Egress name is no longer Ready on n (its
// Node is not kept alive by the impostor) and the refusal counter of
// reason has grown past before.
func waitRefused(t *testing.T, n *harness.Node, name, reason string, before float64) {
	t.Helper()
	ctx := context.Background()
	var last string
	start := time.Now()
	ok := harness.WaitFor(ctx, 20*time.Second, func() bool {
		e, err := c.Egress(ctx, name)
		if err != nil {
			return false
		}
		last = harness.Describe(e)
		readyOnN := e.Status.EgressNode == n.Name && meta.IsStatusConditionTrue(e.Status.Conditions, v1.ConditionReady)
		return !readyOnN && refused(t, reason) > before
	})
	if !ok {
		t.Fatalf("impostor on %s (%s): still Ready there or not counted after 20 s (counter %v, was %v): %s",
			n.Name, reason, refused(t, reason), before, last)
	}
	t.Logf("impostor on %s (%s): the Egress not Ready there and the refusal counted (%v, was %v) %v after the impostor started: %s",
		n.Name, reason, refused(t, reason), before, time.Since(start).Round(time.Millisecond), last)
}

// waitNodeEvent waits for a Warning AgentReportRefused Event on n.
func waitNodeEvent(t *testing.T, n *harness.Node) {
	t.Helper()
	ctx := context.Background()
	var got int
	ok := harness.WaitFor(ctx, 10*time.Second, func() bool {
		evs, err := c.NodeEvents(ctx, n.Name, v1.ReasonAgentReportRefused)
		got = len(evs)
		for _, e := range evs {
			if e.Type == corev1.EventTypeWarning {
				return err == nil
			}
		}
		return false
	})
	if !ok {
		t.Fatalf("no Warning %s Event on Node %s (%d Events)", v1.ReasonAgentReportRefused, n.Name, got)
	}
	t.Logf("Warning %s Event on Node %s (%d Events)", v1.ReasonAgentReportRefused, n.Name, got)
}

// TestSpoofedReportServer stops a Node's agent and serves a fake report on
// its port, first over plain HTTP, then over TLS with a self-signed
// certificate. Each claims the Node alive and its IP announced; the
// controller refuses both: the Egress pinned to that Node turns not Ready,
// the refusals are counted by reason, and a Warning Event names the Node.
// With the agent back the Egress is Ready there again.
func TestSpoofedReportServer(t *testing.T) {
	ctx := context.Background()
	n := c.Nodes[0]
	const ip = "192.0.2.130"
	pinnedEgress(t, n, "spoof-server", ip)
	c.StopAgent(n, syscall.SIGKILL)
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			_ = c.StartAgent(n)
		}
	})
	port := ":" + strconv.Itoa(report.DefaultPort)

	// Plain HTTP.
	before := refused(t, v1.RefusedNotTLS)
	ln, err := c.ListenInNode(n, port)
	if err != nil {
		t.Fatal(err)
	}
	plain := &http.Server{Handler: spoofedReport(n, ip), ReadHeaderTimeout: time.Second}
	go func() { _ = plain.Serve(ln) }()
	waitRefused(t, n, "spoof-server", v1.RefusedNotTLS, before)
	waitNodeEvent(t, n)
	_ = plain.Close()

	// TLS, self-signed.
	before = refused(t, v1.RefusedUntrusted)
	ln, err = c.ListenInNode(n, port)
	if err != nil {
		t.Fatal(err)
	}
	selfSigned := httptest.NewUnstartedServer(spoofedReport(n, ip))
	selfSigned.Listener = ln
	selfSigned.StartTLS()
	waitRefused(t, n, "spoof-server", v1.RefusedUntrusted, before)
	// Through the spoofing the Egress was never Ready on n.
	if e, _ := c.Egress(ctx, "spoof-server"); e.Status.EgressNode == n.Name && meta.IsStatusConditionTrue(e.Status.Conditions, v1.ConditionReady) {
		t.Fatalf("Ready on %s behind a self-signed report: %s", n.Name, harness.Describe(e))
	}
	selfSigned.Close()

	if err := c.StartAgent(n); err != nil {
		t.Fatal(err)
	}
	restarted = true
	if e := waitReady(t, "spoof-server")["spoof-server"]; e.Status.EgressNode != n.Name {
		t.Fatalf("after the agent came back: %s", harness.Describe(e))
	}
}

// TestSpoofedReportOnPath puts a man in the middle on a Node's path while
// its agent runs (restarted once, so the controller must connect anew): an
// nftables redirect in the Node's namespace sends the
// controller's connections on the report port to a proxy that terminates
// TLS with a certificate naming the Node from a CA of its own (and would
// relay the report). The controller refuses it as untrusted: the Node is
// not kept alive through it, the Egress pinned to it turns not Ready, the
// refusal is counted and a Warning Event names the Node. Without the
// redirect the Egress is Ready there again.
func TestSpoofedReportOnPath(t *testing.T) {
	n := c.Nodes[1]
	const ip = "192.0.2.131"
	pinnedEgress(t, n, "spoof-path", ip)

	// The proxy's certificate names the Node, issued by another CA.
	otherCA, _, _, err := agentcert.NewCA(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	cert, err := otherCA.ClientCertificate(time.Now(), time.Hour) // any key pair of the other CA
	if err != nil {
		t.Fatal(err)
	}
	const proxyPort = 19445
	ln, err := c.ListenInNode(n, ":"+strconv.Itoa(proxyPort))
	if err != nil {
		t.Fatal(err)
	}
	// The proxy answers with what it would have relayed: the Node's IP
	// bound and announced.
	proxy := &http.Server{Handler: spoofedReport(n, ip), ReadHeaderTimeout: time.Second}
	go func() {
		_ = proxy.Serve(tls.NewListener(ln, &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{*cert}}))
	}()
	t.Cleanup(func() { _ = proxy.Close() })

	before := refused(t, v1.RefusedUntrusted)
	undo, err := c.RedirectPort(n, report.DefaultPort, proxyPort)
	if err != nil {
		t.Fatal(err)
	}
	removed := false
	t.Cleanup(func() {
		if !removed {
			_ = undo()
		}
	})
	// NAT applies to new connections only, and the controller keeps its
	// verified connection to the agent open: restart the agent (a
	// rolling update) so that the controller has to connect again, now
	// through the man in the middle.
	c.StopAgent(n, syscall.SIGTERM)
	if err := c.StartAgent(n); err != nil {
		t.Fatal(err)
	}
	waitRefused(t, n, "spoof-path", v1.RefusedUntrusted, before)
	waitNodeEvent(t, n)
	if err := undo(); err != nil {
		t.Fatal(err)
	}
	removed = true
	if e := waitReady(t, "spoof-path")["spoof-path"]; e.Status.EgressNode != n.Name {
		t.Fatalf("after the redirect was removed: %s", harness.Describe(e))
	}
}
