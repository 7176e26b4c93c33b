package packaging

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

const webhookCertSecret = "webhook-server-cert"

// helm lint --strict passes whoever makes the webhook certificate.
func TestHelmLintCertSources(t *testing.T) {
	for _, cm := range []string{"true", "false"} {
		t.Run("certManager.enabled="+cm, func(t *testing.T) {
			out := run(t, tool(t, "helm"), "lint", "--strict", "charts/chart", "--set", "certManager.enabled="+cm)
			if !strings.Contains(string(out), "0 chart(s) failed") {
				t.Fatalf("helm lint: %s", out)
			}
		})
	}
}

func secretData(t *testing.T, s *unstructured.Unstructured, key string) []byte {
	t.Helper()
	v, _, _ := unstructured.NestedString(s.Object, "data", key)
	if v == "" {
		t.Fatalf("Secret %s: no data[%q]", s.GetName(), key)
	}
	b, err := base64.StdEncoding.DecodeString(v)
	if err != nil {
		t.Fatalf("Secret %s data[%q]: %v", s.GetName(), key, err)
	}
	return b
}

func parseCert(t *testing.T, what string, data []byte) *x509.Certificate {
	t.Helper()
	block, rest := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" {
		t.Fatalf("%s: not a PEM certificate", what)
	}
	if len(strings.TrimSpace(string(rest))) != 0 {
		t.Fatalf("%s: trailing data after the certificate", what)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return c
}

// Without cert-manager the chart generates a CA and a serving certificate:
// the Secret the controller mounts holds a certificate for the webhook
// Service that chains to the caBundle of every webhook, and the rendering is
// admitted by a real API server.
func TestChartSelfSignedWebhookCert(t *testing.T) {
	objs := helmTemplate(t, "--set", "certManager.enabled=false")

	for _, o := range objs {
		if strings.HasPrefix(o.GetAPIVersion(), "cert-manager.io/") {
			t.Errorf("certManager.enabled=false still renders %s %s", o.GetKind(), o.GetName())
		}
	}

	secret := find(objs, "Secret", webhookCertSecret)
	if secret == nil {
		t.Fatalf("no Secret %s rendered", webhookCertSecret)
	}
	if typ, _, _ := unstructured.NestedString(secret.Object, "type"); typ != "kubernetes.io/tls" {
		t.Errorf("Secret type = %q, want kubernetes.io/tls", typ)
	}
	if secret.GetNamespace() != namespace {
		t.Errorf("Secret namespace = %q, want %q", secret.GetNamespace(), namespace)
	}
	caPEM := secretData(t, secret, "ca.crt")
	certPEM := secretData(t, secret, "tls.crt")
	keyPEM := secretData(t, secret, "tls.key")
	ca := parseCert(t, "ca.crt", caPEM)
	cert := parseCert(t, "tls.crt", certPEM)
	if !ca.IsCA {
		t.Error("ca.crt is not a CA certificate")
	}
	if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
		t.Errorf("tls.crt and tls.key do not match: %v", err)
	}

	svc := find(objs, "Service", release+"-webhook-service")
	if svc == nil {
		t.Fatal("no webhook Service rendered")
	}
	dnsNames := []string{
		fmt.Sprintf("%s.%s.svc", svc.GetName(), namespace),
		fmt.Sprintf("%s.%s.svc.cluster.local", svc.GetName(), namespace),
	}

	vwc := find(objs, "ValidatingWebhookConfiguration", release+"-validating-webhook-configuration")
	if vwc == nil {
		t.Fatal("no ValidatingWebhookConfiguration rendered")
	}
	webhooks, _, _ := unstructured.NestedSlice(vwc.Object, "webhooks")
	if len(webhooks) == 0 {
		t.Fatal("ValidatingWebhookConfiguration has no webhooks")
	}
	for _, w := range webhooks {
		w := w.(map[string]any)
		name, _, _ := unstructured.NestedString(w, "name")
		bundle, _, _ := unstructured.NestedString(w, "clientConfig", "caBundle")
		if bundle == "" {
			t.Errorf("webhook %s: empty caBundle", name)
			continue
		}
		bundlePEM, err := base64.StdEncoding.DecodeString(bundle)
		if err != nil {
			t.Errorf("webhook %s: caBundle: %v", name, err)
			continue
		}
		if svcName, _, _ := unstructured.NestedString(w, "clientConfig", "service", "name"); svcName != svc.GetName() {
			t.Errorf("webhook %s calls Service %q, want %q", name, svcName, svc.GetName())
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(bundlePEM) {
			t.Errorf("webhook %s: caBundle holds no PEM certificate", name)
			continue
		}
		// What the API server checks when it calls the webhook.
		for _, dns := range dnsNames {
			if _, err := cert.Verify(x509.VerifyOptions{
				DNSName:   dns,
				Roots:     roots,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			}); err != nil {
				t.Errorf("webhook %s: serving certificate does not verify for %s against the caBundle: %v", name, dns, err)
			}
		}
	}
	for _, dns := range dnsNames {
		if !slices.Contains(cert.DNSNames, dns) {
			t.Errorf("serving certificate DNS names %v lack %s", cert.DNSNames, dns)
		}
	}

	// The controller reads the Secret at --webhook-cert-path.
	dep := find(objs, "Deployment", release+"-controller-manager")
	if dep == nil {
		t.Fatal("no controller Deployment rendered")
	}
	containers, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
	args, _, _ := unstructured.NestedStringSlice(containers[0].(map[string]any), "args")
	certPath := ""
	for _, a := range args {
		if p, ok := strings.CutPrefix(a, "--webhook-cert-path="); ok {
			certPath = p
		}
	}
	if certPath == "" {
		t.Fatalf("controller args lack --webhook-cert-path: %v", args)
	}
	mounts, _, _ := unstructured.NestedSlice(containers[0].(map[string]any), "volumeMounts")
	volume := ""
	for _, m := range mounts {
		m := m.(map[string]any)
		if m["mountPath"] == certPath {
			volume, _ = m["name"].(string)
		}
	}
	if volume == "" {
		t.Fatalf("nothing mounted at --webhook-cert-path=%s: %v", certPath, mounts)
	}
	volumes, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "volumes")
	mounted := false
	for _, v := range volumes {
		v := v.(map[string]any)
		if v["name"] == volume {
			name, _, _ := unstructured.NestedString(v, "secret", "secretName")
			mounted = name == webhookCertSecret
		}
	}
	if !mounted {
		t.Errorf("volume %s at %s is not Secret %s: %v", volume, certPath, webhookCertSecret, volumes)
	}

	apply(t, objs)
}

// With cert-manager (the default) the chart generates no certificate: the
// Certificate writes the Secret and cert-manager injects the caBundle.
func TestChartCertManagerWebhookCert(t *testing.T) {
	objs := helmTemplate(t)
	if find(objs, "Secret", webhookCertSecret) != nil {
		t.Errorf("certManager.enabled=true renders Secret %s", webhookCertSecret)
	}
	if find(objs, "Certificate", release+"-serving-cert") == nil {
		t.Error("certManager.enabled=true renders no Certificate")
	}
	vwc := find(objs, "ValidatingWebhookConfiguration", release+"-validating-webhook-configuration")
	if vwc == nil {
		t.Fatal("no ValidatingWebhookConfiguration rendered")
	}
	if _, ok := vwc.GetAnnotations()["cert-manager.io/inject-ca-from"]; !ok {
		t.Error("ValidatingWebhookConfiguration lacks cert-manager.io/inject-ca-from")
	}
	webhooks, _, _ := unstructured.NestedSlice(vwc.Object, "webhooks")
	for _, w := range webhooks {
		if b, ok, _ := unstructured.NestedString(w.(map[string]any), "clientConfig", "caBundle"); ok {
			t.Errorf("caBundle %q set although cert-manager injects it", b)
		}
	}
	// No webhook, no certificate either way.
	for _, cm := range []string{"true", "false"} {
		objs := helmTemplate(t, "--set", "webhook.enabled=false", "--set", "certManager.enabled="+cm)
		if find(objs, "Secret", webhookCertSecret) != nil || find(objs, "Certificate", release+"-serving-cert") != nil {
			t.Errorf("webhook.enabled=false certManager.enabled=%s renders a webhook certificate", cm)
		}
	}
}

// The agent metrics Service follows agent.metricsPort (0: no metrics, no Service).
func TestChartAgentMetricsServicePort(t *testing.T) {
	name := release + "-agent-metrics"
	svc := find(helmTemplate(t, "--set", "agent.metricsPort=9500"), "Service", name)
	if svc == nil {
		t.Fatalf("no Service %s rendered", name)
	}
	ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
	if len(ports) != 1 {
		t.Fatalf("Service %s ports = %v", name, ports)
	}
	p := ports[0].(map[string]any)
	if fmt.Sprint(p["port"]) != "9500" || fmt.Sprint(p["targetPort"]) != "9500" {
		t.Errorf("Service %s port %v targetPort %v, want 9500", name, p["port"], p["targetPort"])
	}
	if find(helmTemplate(t, "--set", "agent.metricsPort=0"), "Service", name) != nil {
		t.Errorf("agent.metricsPort=0 still renders Service %s", name)
	}
	if find(helmTemplate(t, "--set", "agent.enabled=false"), "Service", name) != nil {
		t.Errorf("agent.enabled=false still renders Service %s", name)
	}
}
