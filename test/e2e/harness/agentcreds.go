package harness

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/egressip/egressip/internal/agentcert"
	"github.com/egressip/egressip/internal/report"
)

// AgentNamespace is the namespace of the agent CA (the controller's
// --agent-ca-namespace and the agents' --agent-ca-namespace), and of the
// agents' service account.
const AgentNamespace = "egressip-system"

// AgentUser is the agents' user: their service account.
const AgentUser = "system:serviceaccount:" + AgentNamespace + ":egressip-agent"

// bootstrapUser impersonates the agents. In a cluster each agent holds a
// Pod-bound service-account token, and the API server adds the
// authentication.kubernetes.io/node-name extra to the agent's identity
// itself; envtest issues no such tokens to processes outside Pods, so
// every agent's kubeconfig names this user and impersonates the agent's
// service account with its Node's extra (kubeconfig "as",
// "as-groups", "as-user-extra"). The API server then records exactly what
// it records for a real agent on the agent's CertificateSigningRequests,
// and authorizes every request as the agent: the signer's rule is the
// production one, unchanged. This user may impersonate nothing but that.
const bootstrapUser = "egressip-e2e-agent-bootstrap"

// agentCredentials grants the agents' user what the agent role of
// config/rbac grants (read the Egress inputs, request its certificate,
// read the CA ConfigMap) and lets bootstrapUser impersonate it.
func (c *Cluster) agentCredentials(ctx context.Context) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: AgentNamespace}}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "egressip-agent"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"egressip.io"}, Resources: []string{"egresses", "externalippools", "egressmemberslices"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"pods", "namespaces", "nodes"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"certificatesigningrequests"}, Verbs: []string{"create", "get", "list", "watch"}},
	}}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "egressip-agent"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: AgentUser}}}
	caRole := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: AgentNamespace, Name: "egressip-agent-ca"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{agentcert.CAConfigMapName}, Verbs: []string{"get"}},
	}}
	caBinding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: AgentNamespace, Name: "egressip-agent-ca"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: caRole.Name},
		Subjects: []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: AgentUser}}}
	imp := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: bootstrapUser}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"users"}, ResourceNames: []string{AgentUser}, Verbs: []string{"impersonate"}},
		// A service-account user name is checked as the serviceaccounts
		// resource of its namespace.
		{APIGroups: []string{""}, Resources: []string{"serviceaccounts"}, ResourceNames: []string{"egressip-agent"}, Verbs: []string{"impersonate"}},
		{APIGroups: []string{""}, Resources: []string{"groups"}, ResourceNames: []string{"system:serviceaccounts", "system:serviceaccounts:" + AgentNamespace}, Verbs: []string{"impersonate"}},
		{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"userextras/" + agentcert.NodeNameExtra}, ResourceNames: c.nodeNames(), Verbs: []string{"impersonate"}},
	}}
	impBinding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: bootstrapUser},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: imp.Name},
		Subjects: []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: bootstrapUser}}}
	for _, o := range []client.Object{ns, role, binding, caRole, caBinding, imp, impBinding} {
		if err := c.Client.Create(ctx, o); err != nil {
			return fmt.Errorf("create %T %s: %w", o, o.GetName(), err)
		}
	}
	u, err := c.Env.AddUser(envtest.User{Name: bootstrapUser})
	if err != nil {
		return fmt.Errorf("add agent bootstrap user: %w", err)
	}
	base, err := u.KubeConfig()
	if err != nil {
		return fmt.Errorf("agent bootstrap kubeconfig: %w", err)
	}
	for _, n := range c.Nodes {
		kc, err := clientcmd.Load(base)
		if err != nil {
			return fmt.Errorf("agent kubeconfig: %w", err)
		}
		for _, ai := range kc.AuthInfos {
			ai.Impersonate = AgentUser
			ai.ImpersonateGroups = []string{"system:serviceaccounts", "system:serviceaccounts:" + AgentNamespace}
			ai.ImpersonateUserExtra = map[string][]string{agentcert.NodeNameExtra: {n.Name}}
		}
		b, err := clientcmd.Write(*kc)
		if err != nil {
			return fmt.Errorf("agent kubeconfig: %w", err)
		}
		n.kubeconfig = filepath.Join(c.dir, n.Name+".kubeconfig")
		if err := os.WriteFile(n.kubeconfig, b, 0o600); err != nil {
			return fmt.Errorf("write %s: %w", n.kubeconfig, err)
		}
	}
	return nil
}

// AgentReport reads n's agent report as the controller does: over mutual
// TLS, with a client certificate of the agent CA (read from its Secret),
// the server verified as n's agent. Like any poll, it counts as a
// controller poll for that agent. It fails when the CA is not there yet,
// or the poll fails.
func (c *Cluster) AgentReport(ctx context.Context, n *Node) (report.Report, error) {
	var sec corev1.Secret
	if err := c.Client.Get(ctx, client.ObjectKey{Namespace: AgentNamespace, Name: agentcert.CASecretName}, &sec); err != nil {
		return report.Report{}, fmt.Errorf("agent CA: %w", err)
	}
	ca, err := agentcert.ParseCA(sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return report.Report{}, fmt.Errorf("agent CA: %w", err)
	}
	certs := &agentcert.ClientCertificates{CA: ca, Lifetime: time.Hour}
	rc := report.NewClient(report.DefaultPort, 2*time.Second)
	rc.TLS = func(node string) *tls.Config {
		return agentcert.ClientConfig(func() *x509.CertPool { return ca.Pool() }, certs.Get, node)
	}
	defer rc.Forget(nil)
	return rc.Poll(ctx, n.Name, n.IPv4, report.Poll{})
}
