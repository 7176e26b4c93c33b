package controller

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/agentcert"
	"github.com/egressip/egressip/internal/report"
	"github.com/egressip/egressip/internal/testutil/poll"
)

const testAgentNS = "egressip-system"

var testAgentUser = "system:serviceaccount:" + testAgentNS + ":egressip-agent"

// asAgentOf is a REST config acting as the agent's service account with a
// token bound to node: the API server records that user and the node-name
// extra on every CertificateSigningRequest it creates, as for a real
// agent's Pod-bound token.
func asAgentOf(node string) *rest.Config {
	c := rest.CopyConfig(env.Config)
	c.Impersonate = rest.ImpersonationConfig{
		UserName: testAgentUser,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + testAgentNS, "system:authenticated"},
		Extra:    map[string][]string{agentcert.NodeNameExtra: {node}},
	}
	return c
}

// grantAgent gives the agent's user its CSR and CA ConfigMap permissions
// (those of config/rbac), once.
func grantAgent(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	objs := []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testAgentNS}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "test-agent-csr"}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"certificatesigningrequests"}, Verbs: []string{"create", "get", "list", "watch"}},
		}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "test-agent-csr"},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "test-agent-csr"},
			Subjects: []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: testAgentUser}}},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: testAgentNS, Name: "test-agent-ca"}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{agentcert.CAConfigMapName}, Verbs: []string{"get"}},
		}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: testAgentNS, Name: "test-agent-ca"},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "test-agent-ca"},
			Subjects: []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: testAgentUser}}},
	}
	for _, o := range objs {
		if err := env.Client.Create(ctx, o); err != nil && !isAlreadyExists(err) {
			t.Fatal(err)
		}
	}
}

func isAlreadyExists(err error) bool { return err != nil && (client.IgnoreAlreadyExists(err) == nil) }

// requestAs creates, as the agent of tokenNode, a request for the
// identity of askNode, and returns its name.
func requestAs(t *testing.T, tokenNode, askNode string) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, agentcert.Template(askNode), key)
	if err != nil {
		t.Fatal(err)
	}
	kube := kubernetes.NewForConfigOrDie(asAgentOf(tokenNode))
	csr, err := kube.CertificatesV1().CertificateSigningRequests().Create(context.Background(), &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "test-agent-"},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), SignerName: agentcert.SignerName,
			Usages: agentcert.Usages,
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create CSR as the agent of %s: %v", tokenNode, err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), csr) })
	return csr.Name
}

// TestAgentCertificateIssuing: against a real API server, the controller
// signs the request of a Node's agent for its own Node (the API server
// recorded the node-name extra of the impersonated token) and denies, and
// never signs, one for another Node's name.
func TestAgentCertificateIssuing(t *testing.T) {
	grantAgent(t)
	cl := newNodes(t, env, "iss", 1, 10)
	cl.opts.AgentTLS = &AgentTLSOptions{Namespace: testAgentNS, AgentUser: testAgentUser, Lifetime: time.Hour}
	cl.startController()

	own := requestAs(t, "iss-n1", "iss-n1")
	other := requestAs(t, "iss-n1", "iss-n2")
	get := func(name string) *certificatesv1.CertificateSigningRequest {
		var c certificatesv1.CertificateSigningRequest
		if err := cl.c.Get(cl.ctx, client.ObjectKey{Name: name}, &c); err != nil {
			t.Fatal(err)
		}
		return &c
	}
	cl.eventually("own request signed", func() (bool, string) {
		c := get(own)
		return len(c.Status.Certificate) > 0 && csrCondition(c, certificatesv1.CertificateApproved), describeCSR(c)
	})
	var sec corev1.Secret
	if err := cl.c.Get(cl.ctx, client.ObjectKey{Namespace: testAgentNS, Name: agentcert.CASecretName}, &sec); err != nil {
		t.Fatal(err)
	}
	ca, err := agentcert.ParseCA(sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(get(own).Status.Certificate)
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if err := agentcert.VerifyAgent([]*x509.Certificate{leaf}, ca.Pool(), "iss-n1", time.Now()); err != nil {
		t.Fatalf("issued certificate is not iss-n1's agent's: %v", err)
	}
	var cm corev1.ConfigMap
	if err := cl.c.Get(cl.ctx, client.ObjectKey{Namespace: testAgentNS, Name: agentcert.CAConfigMapName}, &cm); err != nil || cm.Data[agentcert.CAConfigMapKey] != string(ca.CertPEM) {
		t.Fatalf("CA ConfigMap: %v, %q", err, cm.Data)
	}
	cl.eventually("other Node's request denied", func() (bool, string) {
		c := get(other)
		return csrCondition(c, certificatesv1.CertificateDenied), describeCSR(c)
	})
	if c := get(other); len(c.Status.Certificate) > 0 {
		t.Fatal("a request for another Node's name was signed")
	}
}

func describeCSR(c *certificatesv1.CertificateSigningRequest) string {
	s := c.Name + " user=" + c.Spec.Username
	for _, cd := range c.Status.Conditions {
		s += " " + string(cd.Type) + "(" + cd.Reason + ": " + cd.Message + ")"
	}
	return s + " certificate bytes=" + strconv.Itoa(len(c.Status.Certificate))
}

// TestAgentCertificateRotation: an agent whose certificate lives 3 s
// (renewed at 70 to 90 % of that by client-go's certificate manager)
// serves a new certificate on new connections at least twice, with no
// restart, while its Egress stays Ready on its Node throughout: rotating
// credentials moves no IP.
func TestAgentCertificateRotation(t *testing.T) {
	grantAgent(t)
	cl := newNodes(t, env, "rot", 1, 10)
	cl.opts.AgentTLS = &AgentTLSOptions{Namespace: testAgentNS, AgentUser: testAgentUser, Lifetime: 3 * time.Second}
	a := cl.agents["rot-n1"]
	_ = a.srv.Close()
	src, err := agentcert.NewSource(agentcert.SourceConfig{Node: "rot-n1", REST: asAgentOf("rot-n1"), Namespace: testAgentNS, RequestedLifetime: time.Hour, BundleRefresh: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := src.Start(cl.ctx); err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort(a.addr.String(), strconv.Itoa(cl.port))
	// The fake agent's server may not have registered its listener yet
	// when closed; listen once its Serve has returned it.
	var l net.Listener
	cl.eventually("the report port free", func() (bool, string) {
		_ = a.srv.Close()
		l, err = net.Listen("tcp", addr)
		return err == nil, "listen: " + errString(err)
	})
	srv := &http.Server{Handler: agentcert.Authorize(report.Handler(a.current), agentcert.OnlyController), ReadHeaderTimeout: time.Second}
	a.srv = srv
	go func() { _ = srv.Serve(tls.NewListener(l, src.ServerConfig())) }()
	t.Cleanup(func() { _ = a.srv.Close() })
	cl.startController()
	cl.pool("rot-pool", nil)
	cl.egress("rot-e", "rot-pool", "")
	cl.waitReady("rot-e")

	// served is the serial of the certificate a new connection sees.
	var sec corev1.Secret
	if err := cl.c.Get(cl.ctx, client.ObjectKey{Namespace: testAgentNS, Name: agentcert.CASecretName}, &sec); err != nil {
		t.Fatal(err)
	}
	ca, err := agentcert.ParseCA(sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		t.Fatal(err)
	}
	cc := &agentcert.ClientCertificates{CA: ca, Lifetime: time.Hour}
	served := func() string {
		conn, err := tls.Dial("tcp", addr, agentcert.ClientConfig(ca.Pool, cc.Get, "rot-n1"))
		if err != nil {
			return "dial: " + err.Error()
		}
		defer func() { _ = conn.Close() }()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	seen := map[string]bool{}
	// Sampled every 100 ms for up to 20 s; judged below.
	_ = poll.Wait(cl.ctx, 100*time.Millisecond, 20*time.Second, func() error {
		e := cl.get("rot-e")
		if !ready(e) || e.Status.EgressNode != "rot-n1" {
			t.Fatalf("during rotation: %s", describe(e))
		}
		if s := served(); len(s) > 0 && s[0] != 'd' {
			seen[s] = true
		}
		if len(seen) < 3 {
			return fmt.Errorf("%d certificates", len(seen))
		}
		return nil
	})
	if len(seen) < 3 {
		t.Fatalf("saw %d certificates in 20 s, want at least 3 (two rotations): %v", len(seen), seen)
	}
	if e := cl.get("rot-e"); !ready(e) || e.Status.EgressNode != "rot-n1" {
		t.Fatalf("after rotation: %s", describe(e))
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestRefusedReportNeverReady: with the agent channel on, a Node whose
// report port serves plain HTTP (here the test's fake agent, claiming the
// IP bound and announced) is refused on every poll: its Egress is never
// Ready, every refusal is counted, and one Warning Event (rate-limited)
// names the Node.
func TestRefusedReportNeverReady(t *testing.T) {
	grantAgent(t)
	cl := newNodes(t, env, "ref", 1, 10)
	cl.opts.AgentTLS = &AgentTLSOptions{Namespace: testAgentNS, AgentUser: testAgentUser, Lifetime: time.Hour}
	counter := refusedReports.WithLabelValues(v1.RefusedNotTLS)
	before := testutil.ToFloat64(counter)
	cl.startController()
	cl.pool("ref-pool", nil)
	cl.egress("ref-e", "ref-pool", "")
	cl.eventually("ten refused polls", func() (bool, string) {
		n := testutil.ToFloat64(counter) - before
		return n >= 10, fmt.Sprintf("%v refused", n)
	})
	if e := cl.get("ref-e"); ready(e) {
		t.Fatalf("Ready behind a plain-HTTP report: %s", describe(e))
	}
	var evs eventsv1.EventList
	if err := cl.c.List(cl.ctx, &evs); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range evs.Items {
		if e.Regarding.Kind == "Node" && e.Regarding.Name == "ref-n1" && e.Reason == v1.ReasonAgentReportRefused && e.Type == corev1.EventTypeWarning {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d AgentReportRefused Events on ref-n1 after 10 refusals, want 1 (rate-limited)", n)
	}
}

// TestAgentReadsCABundlePublishedAfterItStarted: an agent that starts
// before the controller has published the CA bundle (a fresh install
// starts both at once) has it within a second of its publication, with
// the default bundle refresh of one minute. Before, the agent read again
// only a minute later and served no report meanwhile, so the controller
// declared it dead after --agent-dead-after and moved its IPs: `make
// demo` failed about one run in four on a loaded machine.
func TestAgentReadsCABundlePublishedAfterItStarted(t *testing.T) {
	const ns = "egressip-late-ca"
	ctx := t.Context()
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "test-agent-ca"}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{agentcert.CAConfigMapName}, Verbs: []string{"get"}},
		}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "test-agent-ca"},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "test-agent-ca"},
			Subjects: []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: testAgentUser}}},
	} {
		if err := env.Client.Create(ctx, o); err != nil && !isAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	src, err := agentcert.NewSource(agentcert.SourceConfig{Node: "late-n1", REST: asAgentOf("late-n1"), Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	if err := src.Start(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)           // several failed reads: no ConfigMap yet
	if n := len(src.Roots().Subjects()); n != 0 { //nolint:staticcheck // Subjects is enough to count the roots.
		t.Fatalf("roots before the CA exists: %d", n)
	}
	ca, err := agentcert.EnsureCA(ctx, env.Client, ns, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	published := time.Now()
	want := ca.Pool()
	if err := poll.Wait(ctx, 20*time.Millisecond, 20*time.Second, func() error {
		if !src.Roots().Equal(want) {
			return errors.New("the agent does not have the CA bundle")
		}
		return nil
	}); err != nil {
		t.Fatalf("%v %v after the controller published it (bundle refresh: the default one minute)", err, time.Since(published))
	}
	took := time.Since(published)
	t.Logf("the agent had the CA bundle %v after it was published", took.Round(time.Millisecond))
	// The reads are spaced 200 ms doubling: after 1.5 s the next one is
	// at most 1.6 s away, plus the API round trips; a loaded machine gets
	// a wide margin, far below the minute of the refresh.
	if took > 10*time.Second {
		t.Errorf("the agent read the CA bundle %v after it was published; want within 10 s, not the one-minute refresh", took)
	}
}
