package packaging

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"slices"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// agentClient acts as the agent of node: the DaemonSet's ServiceAccount with
// the Node name its bound token carries.
func agentClient(t *testing.T, node string) client.WithWatch {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + namespace + ":egressip-agent",
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
		Extra:    map[string][]string{"authentication.kubernetes.io/node-name": {node}},
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestAgentRBAC installs dist/install.yaml's RBAC for real and checks, as the
// agent of node-a, that it can read what it needs and change nothing: not the
// status of an Egress on node-b, not its own Node's Egresses, not pools. The
// agent's report is served by the agent itself and polled by the controller,
// so there is no API object for one Node's agent to forge for another.
func TestAgentRBAC(t *testing.T) {
	ctx := context.Background()
	for _, o := range installYAML(t) {
		switch o.GetKind() {
		case "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding":
			o := o.DeepCopy()
			if err := env.Client.Patch(ctx, o, client.Apply, client.ForceOwnership, client.FieldOwner("packaging-test")); err != nil { //nolint:staticcheck
				t.Fatalf("apply %s %s: %v", o.GetKind(), o.GetName(), err)
			}
		}
	}

	pool := &v1.ExternalIPPool{ObjectMeta: metav1.ObjectMeta{Name: "rbac-pool"}}
	pool.Spec.IPRanges = []v1.IPRange{{CIDR: "198.51.100.0/28"}}
	if err := env.Client.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	egs := map[string]*v1.Egress{}
	for _, node := range []string{"node-a", "node-b"} {
		eg := &v1.Egress{ObjectMeta: metav1.ObjectMeta{Name: "rbac-" + node}}
		eg.Spec.ExternalIPPool = pool.Name
		eg.Spec.AppliedTo.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": node}}
		if err := env.Client.Create(ctx, eg); err != nil {
			t.Fatal(err)
		}
		eg.Status.EgressNode = node
		if err := env.Client.Status().Update(ctx, eg); err != nil {
			t.Fatal(err)
		}
		egs[node] = eg
	}

	agent := agentClient(t, "node-a")

	// What the agent needs: its Node's Egresses (field selector), the pools,
	// and a watch on both.
	var mine v1.EgressList
	if err := agent.List(ctx, &mine, client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector(v1.EgressNodeField, "node-a")}); err != nil {
		t.Fatalf("agent lists its Node's Egresses: %v", err)
	}
	if len(mine.Items) != 1 || mine.Items[0].Name != "rbac-node-a" {
		t.Fatalf("agent of node-a listed %d Egresses, want rbac-node-a", len(mine.Items))
	}
	if err := agent.Get(ctx, client.ObjectKeyFromObject(pool), &v1.ExternalIPPool{}); err != nil {
		t.Fatalf("agent gets a pool: %v", err)
	}
	for _, l := range []client.ObjectList{&v1.EgressList{}, &v1.ExternalIPPoolList{}} {
		w, err := agent.Watch(ctx, l)
		if err != nil {
			t.Fatalf("agent watches %T: %v", l, err)
		}
		w.Stop()
	}

	// With the datapath: its own Node's Pods (field selector), Namespaces,
	// Nodes and the member slices, listed and watched.
	var pods corev1.PodList
	if err := agent.List(ctx, &pods, client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("spec.nodeName", "node-a")}); err != nil {
		t.Fatalf("agent lists its Node's Pods: %v", err)
	}
	for _, l := range []client.ObjectList{&corev1.PodList{}, &corev1.NamespaceList{}, &corev1.NodeList{}, &v1.EgressMemberSliceList{}} {
		if err := agent.List(ctx, l); err != nil {
			t.Fatalf("agent lists %T: %v", l, err)
		}
		w, err := agent.Watch(ctx, l)
		if err != nil {
			t.Fatalf("agent watches %T: %v", l, err)
		}
		w.Stop()
	}

	forbidden := func(what string, err error) {
		t.Helper()
		if !apierrors.IsForbidden(err) {
			t.Errorf("agent of node-a: %s: got %v, want Forbidden", what, err)
		}
	}
	for _, node := range []string{"node-b", "node-a"} {
		eg := egs[node].DeepCopy()
		if err := agent.Get(ctx, client.ObjectKeyFromObject(eg), eg); err != nil {
			t.Fatal(err)
		}
		eg.Status.EgressNode = "node-a-stolen"
		forbidden("update status of the Egress on "+node, agent.Status().Update(ctx, eg))
		forbidden("patch status of the Egress on "+node, agent.Status().Patch(ctx, eg, client.Merge))
		forbidden("update the Egress on "+node, agent.Update(ctx, eg))
		forbidden("delete the Egress on "+node, agent.Delete(ctx, eg))
	}
	p := pool.DeepCopy()
	if err := agent.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
		t.Fatal(err)
	}
	p.Status.Usage.Used = 99
	forbidden("update pool status", agent.Status().Update(ctx, p))
	forbidden("update pool", agent.Update(ctx, p))
	forbidden("create Egress", agent.Create(ctx, &v1.Egress{ObjectMeta: metav1.ObjectMeta{Name: "rbac-new"}, Spec: v1.EgressSpec{ExternalIPPool: pool.Name, AppliedTo: v1.AppliedTo{NamespaceSelector: &metav1.LabelSelector{}}}}))
	node := &unstructured.Unstructured{}
	node.SetAPIVersion("v1")
	node.SetKind("Node")
	node.SetName("node-a")
	forbidden("create its Node", agent.Create(ctx, node))
	forbidden("create a member slice", agent.Create(ctx, &v1.EgressMemberSlice{ObjectMeta: metav1.ObjectMeta{Name: "rbac-node-a-0"}, Egress: "rbac-node-a",
		Members: []v1.EgressMember{{PodIP: "10.0.0.66", HostIP: "192.0.2.66"}}}))

	// It may request a certificate, but neither approve nor sign one (its
	// own or another's): only the controller holds the signer.
	csr := &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: "rbac-node-a"},
		Spec: certificatesv1.CertificateSigningRequestSpec{Request: testCSR(t, "node-a"), SignerName: "egressip.io/agent",
			Usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth, certificatesv1.UsageClientAuth}}}
	if err := agent.Create(ctx, csr); err != nil {
		t.Fatalf("agent requests its certificate: %v", err)
	}
	if err := agent.Get(ctx, client.ObjectKeyFromObject(csr), csr); err != nil {
		t.Fatalf("agent reads its request back: %v", err)
	}
	if got := csr.Spec.Extra["authentication.kubernetes.io/node-name"]; len(got) != 1 || got[0] != "node-a" {
		t.Errorf("the API server recorded node-name %v on the agent's request, want [node-a]", got)
	}
	approved := csr.DeepCopy()
	approved.Status.Conditions = append(approved.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "Self"})
	forbidden("approve its own certificate", agent.SubResource("approval").Update(ctx, approved))
	signed := csr.DeepCopy()
	signed.Status.Certificate = []byte("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")
	forbidden("sign its own certificate", agent.SubResource("status").Update(ctx, signed))
	forbidden("delete a certificate request", agent.Delete(ctx, csr))
	forbidden("read the agent CA's Secret", agent.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "egressip-agent-ca"}, &corev1.Secret{}))

	// The whole rule set the API server grants the agent holds no write
	// verb but the creation of certificate requests and of the reviews of
	// its metrics scrapers' tokens.
	review := &authorizationv1.SelfSubjectRulesReview{Spec: authorizationv1.SelfSubjectRulesReviewSpec{Namespace: namespace}}
	if err := agent.Create(ctx, review); err != nil {
		t.Fatal(err)
	}
	for _, r := range review.Status.ResourceRules {
		for _, v := range r.Verbs {
			// create on selfsubject*reviews is granted to every
			// authenticated user by the default system:basic-user role.
			if slices.Contains(r.APIGroups, "authorization.k8s.io") || slices.Contains(r.APIGroups, "authentication.k8s.io") {
				continue
			}
			if v == "create" && (slices.Equal(r.Resources, []string{"certificatesigningrequests"}) ||
				slices.Equal(r.Resources, []string{"tokenreviews"}) || slices.Equal(r.Resources, []string{"subjectaccessreviews"})) {
				continue
			}
			if !slices.Contains([]string{"get", "list", "watch"}, v) {
				t.Errorf("agent may %s %v/%v", v, r.APIGroups, r.Resources)
			}
		}
	}
	t.Logf("agent rules: %+v", review.Status.ResourceRules)
}

// testCSR is a PEM certificate request for node's agent identity.
func testCSR(t *testing.T, node string) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "egressip-agent:" + node, Organization: []string{"egressip.io"}}, DNSNames: []string{node}}, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}
