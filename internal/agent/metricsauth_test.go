package agent_test

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/egressip/egressip/internal/agent"
	"github.com/egressip/egressip/internal/testutil/poll"
)

// TestAgentMetricsAuthenticated: the agent's metrics, served as with
// --metrics-secure (the default), refuse a scrape without a token (401)
// and one whose service account may not GET /metrics (403), and serve one
// whose service account is bound to the metrics-reader role (200): the
// same filter as the controller's (filters.WithAuthenticationAndAuthorization),
// checked by the real API server's TokenReview and SubjectAccessReview.
func TestAgentMetricsAuthenticated(t *testing.T) {
	env := apiServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kube := kubernetes.NewForConfigOrDie(env.Config)
	ns := uniq("metrics")
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	token := func(sa string) string {
		t.Helper()
		if _, err := kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		tr, err := kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	reader, stranger := token("prometheus"), token("stranger")
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: ns + "-metrics-reader"},
		Rules: []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}}
	if _, err := kube.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: "prometheus"}}}
	if _, err := kube.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	mgr, err := agent.NewManager(env.Config, ns+"-node", manager.Options{Metrics: agent.MetricsOptions(addr, true, nil), HealthProbeBindAddress: "0"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	}()

	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		// controller-runtime's self-signed certificate (no agent identity here).
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the test checks authorization, not the server
	}}
	scrape := func(tok string) int {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+"/metrics", nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return -1
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	// The metrics server starts with the manager; the scrapes below judge.
	_ = poll.Wait(ctx, 100*time.Millisecond, 30*time.Second, poll.Cond(func() bool { return scrape("") != -1 }))
	for _, tc := range []struct {
		who   string
		token string
		want  int
	}{{"no token", "", http.StatusUnauthorized}, {"unbound service account", stranger, http.StatusForbidden}, {"metrics reader", reader, http.StatusOK}} {
		if got := scrape(tc.token); got != tc.want {
			t.Errorf("%s: HTTP %s, want %d", tc.who, strconv.Itoa(got), tc.want)
		}
	}
}
