package agentcert_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/egressip/egressip/api/v1alpha1"

	certificatesv1 "k8s.io/api/certificates/v1"

	"github.com/egressip/egressip/internal/agent/fence"
	"github.com/egressip/egressip/internal/agentcert"
	"github.com/egressip/egressip/internal/report"
)

const agentUser = "system:serviceaccount:egressip-system:egressip-agent"

// csrFor is a request as an agent's token for tokenNode would send it,
// asking for the identity in tmpl.
func csrFor(t testing.TB, tokenNode string, tmpl *x509.CertificateRequest) (*certificatesv1.CertificateSigningRequest, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return &certificatesv1.CertificateSigningRequest{Spec: certificatesv1.CertificateSigningRequestSpec{
		Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
		SignerName: agentcert.SignerName,
		Usages:     agentcert.Usages,
		Username:   agentUser,
		Extra:      map[string]certificatesv1.ExtraValue{agentcert.NodeNameExtra: {tokenNode}},
	}}, key
}

func TestCheckRequest(t *testing.T) {
	withIP := agentcert.Template("node-a")
	withIP.IPAddresses = []net.IP{net.ParseIP("192.0.2.11")}
	cases := []struct {
		name   string
		mutate func(*certificatesv1.CertificateSigningRequest)
		tmpl   *x509.CertificateRequest
		want   string // substring of the denial; "" accepted
	}{
		{name: "own node", tmpl: agentcert.Template("node-a")},
		{name: "another node's name", tmpl: agentcert.Template("node-b"), want: "must name exactly that Node"},
		{name: "extra IP", tmpl: withIP, want: "must name exactly that Node"},
		{name: "controller identity", tmpl: &x509.CertificateRequest{Subject: pkix.Name{CommonName: agentcert.ControllerCN, Organization: []string{agentcert.Organization}}}, want: "must name exactly that Node"},
		{name: "other requester", tmpl: agentcert.Template("node-a"), mutate: func(c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Username = "system:serviceaccount:default:default"
		}, want: "not by the agent's service account"},
		{name: "token without node", tmpl: agentcert.Template("node-a"), mutate: func(c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Extra = nil
		}, want: "not bound to one Node"},
		{name: "missing client auth", tmpl: agentcert.Template("node-a"), mutate: func(c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Usages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth}
		}, want: `"client auth" is missing`},
		{name: "CA usage", tmpl: agentcert.Template("node-a"), mutate: func(c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Usages = append(c.Spec.Usages, certificatesv1.UsageCertSign)
		}, want: `"cert sign" is not allowed`},
		{name: "other signer", tmpl: agentcert.Template("node-a"), mutate: func(c *certificatesv1.CertificateSigningRequest) {
			c.Spec.SignerName = "kubernetes.io/kubelet-serving"
		}, want: "is not egressip.io/agent"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			csr, _ := csrFor(t, "node-a", tc.tmpl)
			if tc.mutate != nil {
				tc.mutate(csr)
			}
			req, err := agentcert.Check(csr, agentUser)
			if tc.want == "" {
				if err != nil || req.Node != "node-a" {
					t.Fatalf("Check = %+v, %v; want node-a accepted", req.Node, err)
				}
				return
			}
			var d *agentcert.DenyError
			if !errors.As(err, &d) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Check error = %v; want a denial containing %q", err, tc.want)
			}
		})
	}
}

// issued returns node's agent certificate from ca, valid for an hour from
// now.
func issued(t testing.TB, ca *agentcert.CA, node string, now time.Time) tls.Certificate {
	t.Helper()
	csr, key := csrFor(t, node, agentcert.Template(node))
	req, err := agentcert.Check(csr, agentUser)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, err := ca.SignAgent(req, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(certPEM, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
	if err != nil {
		t.Fatal(err)
	}
	return pair
}

// serve runs an HTTPS report server with cfg on 127.0.0.1, as the agent
// does (tls.NewListener), and returns its port.
func serve(t *testing.T, cfg *tls.Config, h http.Handler) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: time.Second}
	go func() { _ = srv.Serve(tls.NewListener(ln, cfg)) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().(*net.TCPAddr).Port
}

// TestPollRefusesImpostors: the controller's poll (report.Client with
// agentcert.ClientConfig) accepts the report of the polled Node's agent
// and refuses, with the reason the metric carries, a plain-HTTP server, a
// self-signed one, one with a certificate of another CA (a man in the
// middle), another Node's agent and an expired certificate; the agent's
// server refuses clients without the controller's certificate.
func TestPollRefusesImpostors(t *testing.T) {
	now := time.Now()
	ca, _, _, err := agentcert.NewCA(now)
	if err != nil {
		t.Fatal(err)
	}
	other, _, _, err := agentcert.NewCA(now)
	if err != nil {
		t.Fatal(err)
	}
	roots := func() *x509.CertPool { return ca.Pool() }
	ctrlCerts := &agentcert.ClientCertificates{CA: ca, Lifetime: time.Hour}
	rep := report.Report{Node: "node-a", Instance: "i1"}
	h := agentcert.Authorize(report.Handler(func() report.Report { return rep }), agentcert.OnlyController)
	serverWith := func(c tls.Certificate) int {
		return serve(t, agentcert.ServerConfig(roots, func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &c, nil }), h)
	}
	selfSigned := httptest.NewTLSServer(report.Handler(func() report.Report { return rep }))
	t.Cleanup(selfSigned.Close)
	plain := httptest.NewServer(report.Handler(func() report.Report { return rep }))
	t.Cleanup(plain.Close)
	portOf := func(raw string) int {
		u, _ := url.Parse(raw)
		p, _ := strconv.Atoi(u.Port())
		return p
	}
	cases := []struct {
		name   string
		port   int
		reason string // "" accepted
	}{
		{"the Node's agent", serverWith(issued(t, ca, "node-a", now)), ""},
		{"plain HTTP", portOf(plain.URL), v1.RefusedNotTLS},
		{"self-signed", portOf(selfSigned.URL), v1.RefusedUntrusted},
		{"another CA (man in the middle)", serverWith(issued(t, other, "node-a", now)), v1.RefusedUntrusted},
		{"another Node's agent", serverWith(issued(t, ca, "node-b", now)), v1.RefusedWrongIdentity},
		{"expired", serverWith(issued(t, ca, "node-a", now.Add(-2*time.Hour))), v1.RefusedInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := report.NewClient(tc.port, 2*time.Second)
			c.TLS = func(node string) *tls.Config { return agentcert.ClientConfig(roots, ctrlCerts.Get, node) }
			got, err := c.Poll(context.Background(), "node-a", netip.MustParseAddr("127.0.0.1"), report.Poll{})
			if tc.reason == "" {
				if err != nil || got.Node != "node-a" {
					t.Fatalf("Poll = %+v, %v; want node-a's report", got, err)
				}
				return
			}
			re, ok := agentcert.Classify(err)
			if !ok || re.Reason != tc.reason {
				t.Fatalf("Poll error %v classified as %+v, %v; want reason %s", err, re, ok, tc.reason)
			}
		})
	}

	// The agent answers only the controller: a client without a
	// certificate fails the handshake; another agent's certificate is
	// authenticated but not allowed to read the report.
	port := serverWith(issued(t, ca, "node-a", now))
	noCert := report.NewClient(port, 2*time.Second)
	noCert.TLS = func(node string) *tls.Config {
		return agentcert.ClientConfig(roots, func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &tls.Certificate{}, nil }, node)
	}
	if _, err := noCert.Poll(context.Background(), "node-a", netip.MustParseAddr("127.0.0.1"), report.Poll{}); err == nil {
		t.Fatal("a client without a certificate read the report")
	}
	peer := issued(t, ca, "node-b", now)
	asPeer := report.NewClient(port, 2*time.Second)
	asPeer.TLS = func(node string) *tls.Config {
		return agentcert.ClientConfig(roots, func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &peer, nil }, node)
	}
	if _, err := asPeer.Poll(context.Background(), "node-a", netip.MustParseAddr("127.0.0.1"), report.Poll{}); err == nil || !strings.Contains(err.Error(), "HTTP 403") {
		t.Fatalf("another agent reading the report: err %v, want HTTP 403", err)
	}
}

// TestControllerClientCertificateRenewed: the controller's client
// certificate is replaced once two thirds of its lifetime have passed.
func TestControllerClientCertificateRenewed(t *testing.T) {
	now := time.Now()
	ca, _, _, err := agentcert.NewCA(now)
	if err != nil {
		t.Fatal(err)
	}
	clock := now
	cc := &agentcert.ClientCertificates{CA: ca, Lifetime: 30 * time.Minute, Now: func() time.Time { return clock }}
	first, err := cc.Get(nil)
	if err != nil {
		t.Fatal(err)
	}
	clock = now.Add(10 * time.Minute)
	if again, _ := cc.Get(nil); again != first {
		t.Fatal("renewed before two thirds of the lifetime")
	}
	clock = now.Add(25 * time.Minute)
	renewed, _ := cc.Get(nil)
	if renewed == first || !renewed.Leaf.NotAfter.After(first.Leaf.NotAfter) {
		t.Fatal("not renewed after two thirds of the lifetime")
	}
	if _, err := renewed.Leaf.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, CurrentTime: clock}); err != nil {
		t.Fatalf("renewed certificate does not verify: %v", err)
	}
}

// TestFencePeerProbeMutualTLS: the fencer's peer probe (fence.ProbePeer
// over fence.NewPeerClientTLS with PeerClientConfig's settings) gets the
// answer of the probed Node's agent when it presents its own agent
// certificate; it is refused by a peer that is another Node's agent (the
// identity check), and the peer endpoint refuses the controller's
// certificate (only agents ask the fencing question) and plain HTTP.
func TestFencePeerProbeMutualTLS(t *testing.T) {
	now := time.Now()
	ca, _, _, err := agentcert.NewCA(now)
	if err != nil {
		t.Fatal(err)
	}
	roots := func() *x509.CertPool { return ca.Pool() }
	peerH := agentcert.Authorize(fence.PeerHandler("node-a", func() time.Time { return now }, func() bool { return false }, nil), agentcert.AnyAgent)
	serverWith := func(c tls.Certificate) int {
		return serve(t, agentcert.ServerConfig(roots, func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &c, nil }), peerH)
	}
	portA := serverWith(issued(t, ca, "node-a", now))
	me := issued(t, ca, "node-b", now)
	asAgent := func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &me, nil }
	probe := func(get func(*tls.CertificateRequestInfo) (*tls.Certificate, error), port int, want string) (fence.Answer, error) {
		hc := fence.NewPeerClientTLS(2*time.Second, agentcert.ClientConfig(roots, get, want))
		return fence.ProbePeer(context.Background(), hc, "https", netip.MustParseAddr("127.0.0.1"), port, want)
	}
	if a, err := probe(asAgent, portA, "node-a"); err != nil || a.Node != "node-a" {
		t.Fatalf("probe of node-a's agent by node-b's = %+v, %v; want node-a's answer", a, err)
	}
	impostor := serverWith(issued(t, ca, "node-c", now))
	if _, err := probe(asAgent, impostor, "node-a"); err == nil {
		t.Fatal("a probe accepted node-c's agent answering for node-a")
	}
	ctrlCerts := &agentcert.ClientCertificates{CA: ca, Lifetime: time.Hour}
	if _, err := probe(ctrlCerts.Get, portA, "node-a"); err == nil || !strings.Contains(err.Error(), "HTTP 403") {
		t.Fatalf("the controller asking the fencing question: err %v, want HTTP 403", err)
	}
	if _, err := fence.ProbePeer(context.Background(), fence.NewPeerClient(2*time.Second), "http",
		netip.MustParseAddr("127.0.0.1"), portA, "node-a"); err == nil {
		t.Fatal("a plain-HTTP probe got an answer from a TLS peer endpoint")
	}
}
