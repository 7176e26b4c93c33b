package harness

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// MainOptions is what one end-to-end test package asks of Main.
type MainOptions struct {
	// PrefixEnv names the environment variable that holds the run's
	// namespace prefix. When it is unset, the parent picks Stem and four
	// random hex digits, so that two runs on one machine (a developer's
	// and CI's, or two packages run at once by go test) never share a
	// namespace; the re-executed child inherits it.
	PrefixEnv, Stem string
	// Config returns the cluster to start, given the prefix, the directory
	// holding the freshly built egressip-controller and egressip-agent,
	// and the log directory (E2E_LOG_DIR, else a temporary one removed at
	// the end). Log is set to stderr when E2E_VERBOSE is set.
	Config func(prefix, binDir, logDir string) Config
	// Samples are YAML files, relative to the package directory, created
	// once the cluster runs (ApplyFile).
	Samples []string
	// Started is called with the running cluster before the tests run.
	Started func(*Cluster)
}

// Main is the TestMain of an end-to-end package. Not root: it prints why
// and exits 0 (network namespaces need root; CI runs as root). Otherwise
// it re-executes the test binary in a fresh control-plane namespace
// (ReexecInNetNS), builds the two binaries from the module at ../.. of
// the package directory, starts the cluster, applies the samples, runs
// the tests and stops everything. It returns the exit code for os.Exit.
func Main(m *testing.M, o MainOptions) int {
	if os.Geteuid() != 0 {
		fmt.Println("e2e: not root: skipping (network namespaces need root; CI runs as root)")
		return 0
	}
	prefix := os.Getenv(o.PrefixEnv)
	if prefix == "" {
		prefix = fmt.Sprintf("%s%04x", o.Stem, rand.IntN(1<<16))
		_ = os.Setenv(o.PrefixEnv, prefix)
	}
	if err := ReexecInNetNS(prefix); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	root, err := moduleRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	bin, err := os.MkdirTemp("", "egressip-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = os.RemoveAll(bin) }()
	for _, b := range []struct{ out, pkg string }{{"egressip-controller", "./cmd/controller"}, {"egressip-agent", "./cmd/agent"}} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(bin, b.out), b.pkg)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n%s", b.pkg, err, out)
			return 1
		}
	}
	// Every process's log in a file of its own, as the demo keeps them
	// (TestLogFiles); E2E_LOG_DIR keeps them after the run.
	logDir := os.Getenv("E2E_LOG_DIR")
	if logDir == "" {
		if logDir, err = os.MkdirTemp("", "egressip-e2e-logs-"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer func() { _ = os.RemoveAll(logDir) }()
	}
	cfg := o.Config(prefix, bin, logDir)
	// The test process's own controller-runtime clients log nothing
	// unless asked (the processes under test log to their files).
	ctrllog.SetLogger(logr.Discard())
	if os.Getenv("E2E_VERBOSE") != "" {
		cfg.Log = os.Stderr
		ctrllog.SetLogger(zap.New(zap.WriteTo(os.Stderr)))
	}
	ctx := context.Background()
	c, err := Start(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: start cluster:", err)
		return 1
	}
	defer c.Stop()
	for _, f := range o.Samples {
		if _, err := c.ApplyFile(ctx, f); err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
			return 1
		}
	}
	if o.Started != nil {
		o.Started(c)
	}
	return m.Run()
}

// moduleRoot is the nearest directory at or above the working directory
// (the package directory under go test) that holds go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("working directory: %w", err)
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no go.mod at or above %s", dir)
		}
	}
}
