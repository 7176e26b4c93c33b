package packaging

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

var podSecurityLabels = map[string]string{
	"pod-security.kubernetes.io/enforce": "privileged",
	"pod-security.kubernetes.io/audit":   "privileged",
	"pod-security.kubernetes.io/warn":    "privileged",
}

// runErr runs a command in the repository and returns its combined output
// and error, for commands that are expected to fail.
func runErr(name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = env.Root
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// agentPod builds a Pod from the chart's agent DaemonSet template, as the
// DaemonSet controller would, in namespace ns.
func agentPod(t *testing.T, objs []*unstructured.Unstructured, ns string) *corev1.Pod {
	t.Helper()
	ds := find(objs, "DaemonSet", "egressip-agent")
	if ds == nil {
		t.Fatal("chart renders no DaemonSet egressip-agent")
	}
	tmpl, _, _ := unstructured.NestedMap(ds.Object, "spec", "template")
	pod := &corev1.Pod{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(tmpl, pod); err != nil {
		t.Fatal(err)
	}
	pod.Name, pod.Namespace = "egressip-agent-psa-check", ns
	pod.Spec.NodeName = "worker-1"
	return pod
}

// The chart labels the namespace it creates for Pod Security "privileged",
// renders no Namespace when it does not create one, and the labels matter:
// the kube-apiserver's PodSecurity admission admits the agent Pod in the
// chart's namespace and refuses it in a namespace that enforces baseline.
func TestChartNamespacePodSecurityLabels(t *testing.T) {
	if ns := find(helmTemplate(t), "Namespace", namespace); ns != nil {
		t.Fatalf("namespace.create=false (default) renders Namespace %s; Helm does not own the release namespace", namespace)
	}

	const created = "egressip-psa"
	objs := decode(t, run(t, tool(t, "helm"), "template", release, "charts/chart", "--namespace", created, "--set", "namespace.create=true"))
	ns := find(objs, "Namespace", created)
	if ns == nil {
		t.Fatalf("namespace.create=true renders no Namespace %s", created)
	}
	for k, v := range podSecurityLabels {
		if got := ns.GetLabels()[k]; got != v {
			t.Errorf("Namespace %s label %s = %q, want %q", created, k, got, v)
		}
	}

	ctx := context.Background()
	baseline := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "egressip-baseline",
		Labels: map[string]string{"pod-security.kubernetes.io/enforce": "baseline"}}}
	for _, o := range []client.Object{ns.DeepCopy(), baseline} {
		if err := env.Client.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	// Server-side dry-run: admission (PodSecurity included) runs, nothing
	// is stored, and no kubelet is needed.
	if err := env.Client.Create(ctx, agentPod(t, objs, created), client.DryRunAll); err != nil {
		t.Errorf("agent Pod in the chart's namespace %s: %v", created, err)
	}
	err := env.Client.Create(ctx, agentPod(t, objs, baseline.Name), client.DryRunAll)
	if err == nil || !strings.Contains(err.Error(), `violates PodSecurity "baseline:latest"`) {
		t.Errorf("agent Pod in a baseline namespace: want a PodSecurity refusal, got %v", err)
	} else {
		t.Logf("baseline namespace, as without the labels: %v", err)
	}
}

// kubeconfig writes a kubeconfig for env's API server, for helm.
func kubeconfig(t *testing.T) string {
	t.Helper()
	c := env.Config
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["envtest"] = &clientcmdapi.Cluster{Server: c.Host, CertificateAuthorityData: c.CAData}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: c.CertData, ClientKeyData: c.KeyData, Token: c.BearerToken}
	cfg.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "admin"}
	cfg.CurrentContext = "envtest"
	p := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, p); err != nil {
		t.Fatal(err)
	}
	return p
}

// Into an existing namespace that enforces another level, the install
// fails at render time with the kubectl command that fixes it (helm's
// --dry-run=server runs the chart's lookup against the API server, as an
// install does); into a privileged one it renders.
func TestChartRefusesBaselineNamespace(t *testing.T) {
	ctx := context.Background()
	kc := kubeconfig(t)
	helm := tool(t, "helm")
	for _, tc := range []struct {
		ns, level, wantErr string
	}{
		{"egressip-restricted", "restricted", `namespace egressip-restricted enforces Pod Security level "restricted", which refuses the egressip agent Pods (host network, NET_ADMIN, NET_RAW); run ` +
			"`kubectl label namespace egressip-restricted pod-security.kubernetes.io/enforce=privileged pod-security.kubernetes.io/audit=privileged pod-security.kubernetes.io/warn=privileged --overwrite`"},
		{"egressip-labelled", "privileged", ""},
	} {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tc.ns, Labels: map[string]string{"pod-security.kubernetes.io/enforce": tc.level}}}
		if err := env.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		out, err := runErr(helm, "install", release, "charts/chart", "--namespace", tc.ns, "--kubeconfig", kc,
			"--dry-run=server", "--set", "certManager.enabled=false",
			// Names of its own: envtest installed the CRDs and other tests
			// create the RBAC of dist/install.yaml for real.
			"--set", "crd.enabled=false", "--set", "fullnameOverride=psa-"+tc.level)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%s namespace: helm install --dry-run=server: %v\n%s", tc.level, err, out)
		case tc.wantErr != "" && (err == nil || !strings.Contains(out, tc.wantErr)):
			t.Errorf("%s namespace: want failure containing %q, got %v\n%s", tc.level, tc.wantErr, err, out)
		case tc.wantErr != "":
			t.Logf("%s namespace: %s", tc.level, strings.TrimSpace(out))
		}
	}
}

// The values schema refuses unknown keys, so a typo in --set fails with a
// message naming the key instead of being ignored.
func TestChartSchemaRejectsUnknownKeys(t *testing.T) {
	helm := tool(t, "helm")
	for _, tc := range []struct{ set, want string }{
		{"manager.imag=x", "at '/manager': additional properties 'imag' not allowed"},
		{"manager.image.tga=v1", "at '/manager/image': additional properties 'tga' not allowed"},
		{"agent.image.tagg=v1", "at '/agent/image': additional properties 'tagg' not allowed"},
		{"namespace.creat=true", "at '/namespace': additional properties 'creat' not allowed"},
		{"metrics.secur=false", "at '/metrics': additional properties 'secur' not allowed"},
		{"webhok.enabled=false", "at '': additional properties 'webhok' not allowed"},
	} {
		out, err := runErr(helm, "template", release, "charts/chart", "--namespace", namespace, "--set", tc.set)
		if err == nil || !strings.Contains(out, tc.want) {
			t.Errorf("--set %s: want failure containing %q, got %v\n%s", tc.set, tc.want, err, out)
			continue
		}
		t.Logf("--set %s: %s", tc.set, strings.TrimSpace(out))
	}
	// Every key values.yaml documents, including those it leaves commented
	// out, is still accepted.
	out, err := runErr(helm, "template", release, "charts/chart", "--namespace", namespace,
		"--set", "manager.image.tag=v9", "--set", "manager.priorityClassName=x", "--set", "manager.pod.labels.a=b",
		"--set", "manager.labels.a=b", "--set", "manager.annotations.a=b", "--set", "manager.strategy.type=Recreate",
		"--set", "serviceAccount.annotations.a=b", "--set", "prometheus.labels.a=b", "--set", "namespace.create=true",
		"--set", "global.x=y")
	if err != nil {
		t.Errorf("documented keys refused: %v\n%s", err, out)
	}
}

// TestChartCNIPluginNeedsDatapath: the egressip-cni plugin without the
// datapath would be rendered as nothing; the chart refuses the combination
// with a message instead of dropping the plugin silently.
func TestChartCNIPluginNeedsDatapath(t *testing.T) {
	helm := tool(t, "helm")
	out, err := runErr(helm, "template", release, "charts/chart", "--namespace", namespace,
		"--set", "agent.datapath.cni.enabled=true", "--set", "agent.datapath.enabled=false")
	if want := "agent.datapath.cni.enabled needs agent.datapath.enabled=true"; err == nil || !strings.Contains(out, want) {
		t.Fatalf("want failure containing %q, got %v\n%s", want, err, out)
	}
	out, err = runErr(helm, "template", release, "charts/chart", "--namespace", namespace,
		"--set", "agent.datapath.cni.enabled=true")
	if err != nil || !strings.Contains(out, "egressip-cni") {
		t.Fatalf("plugin with the datapath on: %v\n%s", err, out)
	}
}

// The chart's CRDs are those of dist/install.yaml (config/crd/bases).
func TestChartCRDsMatchInstallYAML(t *testing.T) {
	chart, dist := helmTemplate(t), installYAML(t)
	n := 0
	for _, d := range dist {
		if d.GetKind() != "CustomResourceDefinition" {
			continue
		}
		n++
		c := find(chart, "CustomResourceDefinition", d.GetName())
		if c == nil {
			t.Errorf("chart lacks CRD %s", d.GetName())
			continue
		}
		if cs, ds := fmt.Sprint(c.Object["spec"]), fmt.Sprint(d.Object["spec"]); cs != ds {
			t.Errorf("CRD %s: the chart's spec differs from dist/install.yaml's: run `make helm-chart` (or copy config/crd/bases into charts/chart/templates/crd)", d.GetName())
		}
	}
	if n != 3 {
		t.Errorf("dist/install.yaml holds %d CRDs, want 3", n)
	}
}

// copyTree copies the repository's tracked and untracked, not ignored
// files (the working tree as it would be committed) into dir.
func copyTree(t *testing.T, dir string) {
	t.Helper()
	files := run(t, "git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	for f := range bytes.SplitSeq(bytes.TrimRight(files, "\x00"), []byte{0}) {
		src := filepath.Join(env.Root, string(f))
		fi, err := os.Lstat(src)
		if os.IsNotExist(err) {
			continue // deleted in the working tree
		}
		if err != nil {
			t.Fatal(err)
		}
		if fi.IsDir() || fi.Mode()&os.ModeSymlink != 0 {
			continue // the bin symlink of a worktree, submodules
		}
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(dir, string(f))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, data, fi.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
}

func gitIn(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "user.name=packaging-test", "-c", "user.email=packaging-test@example.invalid", "-c", "commit.gpgsign=false"}, args...)...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// `make build-installer` on a fresh clone changes no tracked file: the
// committed dist/install.yaml, config/ and generated files are what it
// writes, with the default image IMAGE_REPO:VERSION (not controller:latest),
// which is also the chart's default. With another IMG only
// dist/install.yaml changes.
func TestBuildInstallerLeavesCloneClean(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatalf("make not found: %v", err)
	}
	dir := t.TempDir()
	copyTree(t, dir)
	gitIn(t, dir, "init", "-q")
	gitIn(t, dir, "add", "-A")
	gitIn(t, dir, "commit", "-q", "-m", "snapshot")

	// The pinned tools of this checkout (LOCALBIN, resolved so that the
	// Makefile's version check finds its own links and installs nothing).
	bin, err := filepath.EvalSymlinks(filepath.Join(env.Root, "bin"))
	if err != nil {
		t.Fatal(err)
	}
	makeIn := func(args ...string) {
		t.Helper()
		cmd := exec.Command("make", append([]string{"--no-print-directory", "LOCALBIN=" + bin}, args...)...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("make %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	makeIn("build-installer")
	if st := gitIn(t, dir, "status", "--porcelain"); st != "" {
		t.Errorf("git status after make build-installer on a fresh clone:\n%s%s", st, gitIn(t, dir, "diff", "--stat"))
	}

	wantImage := strings.TrimSpace(string(run(t, "make", "--no-print-directory", "-s", "print-IMG")))
	if wantImage == "" || strings.HasPrefix(wantImage, "controller:") || strings.HasSuffix(wantImage, ":latest") {
		t.Errorf("default IMG %q: want a pinned image", wantImage)
	}
	images := func(objs []*unstructured.Unstructured) map[string]string {
		m := map[string]string{}
		for _, o := range objs {
			cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
			for _, c := range cs {
				img, _, _ := unstructured.NestedString(c.(map[string]any), "image")
				m[o.GetKind()+"/"+o.GetName()] = img
			}
		}
		return m
	}
	for name, objs := range map[string][]*unstructured.Unstructured{"dist/install.yaml": installYAML(t), "chart": helmTemplate(t)} {
		imgs := images(objs)
		if len(imgs) != 2 {
			t.Errorf("%s: images %v, want the controller Deployment and the agent DaemonSet", name, imgs)
		}
		for o, img := range imgs {
			if img != wantImage {
				t.Errorf("%s: %s image %q, want the default IMG %q", name, o, img, wantImage)
			}
		}
	}

	const other = "registry.example/egressip:v9.9.9"
	makeIn("build-installer", "IMG="+other)
	if st := gitIn(t, dir, "status", "--porcelain"); st != " M dist/install.yaml\n" {
		t.Errorf("git status after make build-installer IMG=%s: want only dist/install.yaml modified, got\n%s", other, st)
	}
	data, err := os.ReadFile(filepath.Join(dir, "dist", "install.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(data, []byte("image: "+other+"\n")); n != 2 {
		t.Errorf("dist/install.yaml built with IMG=%s names it %d times, want 2", other, n)
	}
}

// TestChartLeaderElectionRules: leader-election values that
// egressip-controller refuses at start (LeaderElectionConfig.Check) fail
// the render with a message naming them, instead of a controller that
// exits 2 in a crash loop; values it accepts render, with the flags passed
// as given.
func TestChartLeaderElectionRules(t *testing.T) {
	helm := tool(t, "helm")
	for _, tc := range []struct{ set, want string }{
		{"controller.leaderElection.leaseDuration=3500ms", "leaseDuration 3500ms must be a whole number of seconds"},
		{"controller.leaderElection.leaseDuration=500ms", "leaseDuration 500ms must be a whole number of seconds"},
		{"controller.leaderElection.leaseDuration=2s", "leaseDuration 2s must be more than renewDeadline 2s + retryPeriod 250ms"},
		{"controller.leaderElection.renewDeadline=300ms", "renewDeadline 300ms must be more than 1.2 x retryPeriod 250ms"},
		{"controller.leaderElection.retryPeriod=0s", "must be positive"},
	} {
		out, err := runErr(helm, "template", release, "charts/chart", "--namespace", namespace, "--set", tc.set)
		if err == nil || !strings.Contains(out, tc.want) {
			t.Errorf("--set %s: want failure containing %q, got %v\n%s", tc.set, tc.want, err, out)
			continue
		}
		t.Logf("--set %s: %s", tc.set, strings.TrimSpace(out))
	}
	for _, set := range []string{
		"controller.leaderElection.leaseDuration=1m,controller.leaderElection.renewDeadline=40s,controller.leaderElection.retryPeriod=5s",
		"controller.leaderElection.leaseDuration=4s,controller.leaderElection.renewDeadline=2500ms,controller.leaderElection.retryPeriod=1s",
	} {
		args := containerArgs(t, helmTemplate(t, "--set", set), "Deployment", "egressip-controller-manager")
		for kv := range strings.SplitSeq(set, ",") {
			k, v, _ := strings.Cut(kv, "=")
			flag := map[string]string{"leaseDuration": "leader-elect-lease-duration", "renewDeadline": "leader-elect-renew-deadline",
				"retryPeriod": "leader-elect-retry-period"}[strings.TrimPrefix(k, "controller.leaderElection.")]
			if got := flagValue(args, flag); got != v {
				t.Errorf("--set %s: --%s=%q, want %q", set, flag, got, v)
			}
		}
	}
}
