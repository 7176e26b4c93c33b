// Package packaging checks the install artefacts users apply: the Helm chart
// in charts/chart and dist/install.yaml (kustomize config/default). Both are
// linted, rendered, compared with each other and applied with server-side
// dry-run to a real kube-apiserver (envtest); the agent's RBAC is exercised by
// impersonating an agent.
package packaging

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egressip/egressip/internal/testenv"
	"github.com/egressip/egressip/internal/testutil/poll"
)

const (
	namespace = "egressip-system"
	release   = "egressip"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	testenv.Main(m, &env)
}

// tool returns the pinned tool in bin/ (installed by `make helm kustomize`,
// which `make test` runs first), or $HELM / $KUSTOMIZE when set.
func tool(t *testing.T, name string) string {
	t.Helper()
	if p := os.Getenv(strings.ToUpper(name)); p != "" {
		return p
	}
	p := filepath.Join(env.Root, "bin", name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s not found at %s: run `make %s` (make test does)", name, p, name)
	}
	return p
}

func run(t *testing.T, name string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = env.Root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out, stderr.Bytes())
	}
	return out
}

func decode(t *testing.T, data []byte) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	d := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		u := &unstructured.Unstructured{}
		err := d.Decode(&u.Object)
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatalf("decode manifests: %v", err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
}

func helmTemplate(t *testing.T, args ...string) []*unstructured.Unstructured {
	t.Helper()
	base := []string{"template", release, "charts/chart", "--namespace", namespace}
	return decode(t, run(t, tool(t, "helm"), append(base, args...)...))
}

func installYAML(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(env.Root, "dist", "install.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return decode(t, data)
}

func find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

func TestHelmLint(t *testing.T) {
	out := run(t, tool(t, "helm"), "lint", "--strict", "charts/chart")
	t.Logf("%s", out)
	if !bytes.Contains(out, []byte("0 chart(s) failed")) {
		t.Fatalf("helm lint: %s", out)
	}
}

// dist/install.yaml must be what `make build-installer` writes today.
func TestInstallYAMLUpToDate(t *testing.T) {
	built := run(t, tool(t, "kustomize"), "build", "config/default")
	have, err := os.ReadFile(filepath.Join(env.Root, "dist", "install.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(built, have) {
		t.Fatal("dist/install.yaml differs from `kustomize build config/default`: run `make build-installer` (and `make helm-chart`)")
	}
}

// The chart and the kustomize install create the same objects (the chart
// leaves the Namespace to `helm install --create-namespace`).
func TestChartMatchesInstallYAML(t *testing.T) {
	chart, dist := helmTemplate(t), installYAML(t)
	ids := func(objs []*unstructured.Unstructured) []string {
		var s []string
		for _, o := range objs {
			if o.GetKind() == "Namespace" {
				continue
			}
			// The CRD admin/editor/viewer helper roles are off by default
			// in the chart (rbac.helpers.enabled).
			if n := o.GetName(); strings.HasSuffix(n, "-admin-role") || strings.HasSuffix(n, "-editor-role") || strings.HasSuffix(n, "-viewer-role") {
				continue
			}
			s = append(s, o.GetKind()+"/"+o.GetName())
		}
		slices.Sort(s)
		return s
	}
	if c, d := ids(chart), ids(dist); !slices.Equal(c, d) {
		t.Fatalf("chart objects:\n  %s\ndist/install.yaml objects:\n  %s", strings.Join(c, "\n  "), strings.Join(d, "\n  "))
	}

	// The agent DaemonSet is templated by hand: its pod spec must match.
	cds, dds := find(chart, "DaemonSet", "egressip-agent"), find(dist, "DaemonSet", "egressip-agent")
	for _, path := range [][]string{
		{"spec", "template", "spec", "hostNetwork"},
		{"spec", "template", "spec", "priorityClassName"},
		{"spec", "template", "spec", "tolerations"},
		{"spec", "template", "spec", "nodeSelector"},
		{"spec", "template", "spec", "serviceAccountName"},
		{"spec", "template", "spec", "containers"},
		{"spec", "selector"},
		{"spec", "updateStrategy"},
	} {
		cv, _, _ := unstructured.NestedFieldNoCopy(cds.Object, path...)
		dv, _, _ := unstructured.NestedFieldNoCopy(dds.Object, path...)
		// The chart's image defaults to the appVersion tag.
		if path[len(path)-1] == "containers" {
			cv = withoutImage(cv)
			dv = withoutImage(dv)
		}
		if fmt.Sprint(cv) != fmt.Sprint(dv) {
			t.Errorf("DaemonSet %s:\n chart %v\n dist  %v", strings.Join(path, "."), cv, dv)
		}
	}

	// The controller gets the same flags (the order differs).
	args := func(o *unstructured.Unstructured) []string {
		cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		a, _, _ := unstructured.NestedStringSlice(cs[0].(map[string]any), "args")
		a = slices.DeleteFunc(slices.Clone(a), func(s string) bool { return s == "--enable-webhooks=true" }) // the default
		slices.Sort(a)
		return a
	}
	cdep, ddep := find(chart, "Deployment", "egressip-controller-manager"), find(dist, "Deployment", "egressip-controller-manager")
	if c, d := args(cdep), args(ddep); !slices.Equal(c, d) {
		t.Errorf("controller args:\n chart %v\n dist  %v", c, d)
	}
	for _, o := range []*unstructured.Unstructured{cdep, ddep} {
		if r, _, _ := unstructured.NestedFieldNoCopy(o.Object, "spec", "replicas"); fmt.Sprint(r) != "2" {
			t.Errorf("controller replicas = %v, want 2", r)
		}
	}
}

func withoutImage(v any) any {
	cs, ok := v.([]any)
	if !ok {
		return v
	}
	var out []any
	for _, c := range cs {
		m := map[string]any{}
		for k, x := range c.(map[string]any) {
			if k != "image" && k != "imagePullPolicy" {
				m[k] = x
			}
		}
		out = append(out, m)
	}
	return out
}

// Nothing gets `*`, and the agent only reads.
func TestLeastPrivilegeRBAC(t *testing.T) {
	for name, objs := range map[string][]*unstructured.Unstructured{"chart": helmTemplate(t, "--set", "rbac.helpers.enabled=true"), "dist": installYAML(t)} {
		for _, o := range objs {
			if o.GetKind() != "ClusterRole" && o.GetKind() != "Role" {
				continue
			}
			rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
			for _, r := range rules {
				for _, f := range []string{"verbs", "resources", "apiGroups"} {
					vals, _, _ := unstructured.NestedStringSlice(r.(map[string]any), f)
					if slices.Contains(vals, "*") {
						t.Errorf("%s: %s %s has * in %s", name, o.GetKind(), o.GetName(), f)
					}
				}
				if o.GetName() == "egressip-agent-role" {
					verbs, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "verbs")
					resources, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "resources")
					for _, v := range verbs {
						if v == "get" || v == "list" || v == "watch" {
							continue
						}
						// Its one write: the request of its own certificate,
						// and the reviews of its metrics scrapers' tokens.
						if v == "create" && slices.Equal(resources, []string{"certificatesigningrequests"}) ||
							v == "create" && (slices.Equal(resources, []string{"tokenreviews"}) || slices.Equal(resources, []string{"subjectaccessreviews"})) {
							continue
						}
						t.Errorf("%s: agent role has write verb %q on %v", name, v, resources)
					}
				}
			}
		}
	}
}

// stubCertManagerCRDs installs permissive CRDs for the cert-manager kinds, so
// the API server accepts (and checks the metadata of) our Issuer and
// Certificate; their spec is only checked against the real CRDs in a cluster
// with cert-manager.
func stubCertManagerCRDs(t *testing.T, ctx context.Context) {
	t.Helper()
	preserve := true
	for _, k := range []struct{ plural, kind string }{{"certificates", "Certificate"}, {"issuers", "Issuer"}} {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		crd.Name = k.plural + ".cert-manager.io"
		crd.Spec = apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "cert-manager.io",
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: k.plural, Kind: k.kind},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object", XPreserveUnknownFields: &preserve,
				}},
			}},
		}
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(crd)
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{Object: m}
		u.SetAPIVersion("apiextensions.k8s.io/v1")
		u.SetKind("CustomResourceDefinition")
		if err := env.Client.Create(ctx, u); err != nil && !strings.Contains(err.Error(), "already exists") {
			t.Fatal(err)
		}
	}
	// Wait until the API server serves the kinds.
	poll.Until(t, 30*time.Second, "cert-manager stub CRDs served", func() error {
		l := &unstructured.UnstructuredList{}
		l.SetAPIVersion("cert-manager.io/v1")
		l.SetKind("IssuerList")
		return env.Client.List(ctx, l)
	})
}

// apply applies CRDs and the Namespace for real (the rest needs them), then
// every other object with server-side dry-run, so each is validated and
// admitted by the API server without being stored.
func apply(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	ctx := context.Background()
	stubCertManagerCRDs(t, ctx)
	first := func(o *unstructured.Unstructured) bool {
		return o.GetKind() == "CustomResourceDefinition" || o.GetKind() == "Namespace"
	}
	ns := &unstructured.Unstructured{}
	ns.SetAPIVersion("v1")
	ns.SetKind("Namespace")
	ns.SetName(namespace)
	objs = append([]*unstructured.Unstructured{ns}, objs...)
	for _, pass := range []bool{true, false} {
		for _, o := range objs {
			if first(o) != pass {
				continue
			}
			opts := []client.PatchOption{client.ForceOwnership, client.FieldOwner("packaging-test")}
			if !pass {
				opts = append(opts, client.DryRunAll)
			}
			o := o.DeepCopy()
			o.SetResourceVersion("")
			if err := env.Client.Patch(ctx, o, client.Apply, opts...); err != nil { //nolint:staticcheck // server-side apply of arbitrary manifests
				t.Errorf("apply %s %s (dry-run=%v): %v", o.GetKind(), o.GetName(), !pass, err)
			}
		}
	}
}

func TestChartServerSideDryRun(t *testing.T) {
	objs := helmTemplate(t, "--set", "prometheus.enabled=false", "--set", "rbac.helpers.enabled=true", "--set", "networkPolicy.enabled=true")
	if len(objs) < 20 {
		t.Fatalf("helm template rendered only %d objects", len(objs))
	}
	apply(t, objs)
}

func TestInstallYAMLServerSideDryRun(t *testing.T) {
	objs := installYAML(t)
	if len(objs) < 20 {
		t.Fatalf("dist/install.yaml holds only %d objects", len(objs))
	}
	apply(t, objs)
}
