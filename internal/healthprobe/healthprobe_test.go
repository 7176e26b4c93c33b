package healthprobe

import (
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestMainExitCodes exercises the command line against a unix-socket server that
// is alive but not ready: healthz passes (0), readyz fails (1, with the
// server's body), a missing socket fails (1), bad usage is 2.
func TestMainExitCodes(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "health.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "[-]reconciled failed: no reconcile completed yet", http.StatusInternalServerError)
	})
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	for _, tc := range []struct {
		args    []string
		code    int
		wantErr string
	}{
		{[]string{"--socket", sock, "healthz"}, 0, ""},
		{[]string{"--socket", sock, "readyz"}, 1, "no reconcile completed yet"},
		{[]string{"--socket", sock + ".missing", "healthz"}, 1, "no such file"},
		{[]string{"--socket", sock, "livez"}, 1, "unknown check"},
		{[]string{"--socket", sock}, 2, "usage"},
	} {
		var stderr strings.Builder
		if got := Main("probe", tc.args, &stderr); got != tc.code || !strings.Contains(stderr.String(), tc.wantErr) {
			t.Errorf("Main(%q) = %d, stderr %q; want %d and %q", tc.args, got, stderr.String(), tc.code, tc.wantErr)
		}
	}
}

// TestStandardLibraryOnly: the probe binary must stay small; this package
// may import nothing outside the standard library.
func TestStandardLibraryOnly(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").Output()
	if err != nil {
		t.Fatal(err)
	}
	for p := range strings.FieldsSeq(string(out)) {
		if p != "github.com/egressip/egressip/internal/healthprobe" {
			t.Errorf("healthprobe depends on %s (standard library only)", p)
		}
	}
}
