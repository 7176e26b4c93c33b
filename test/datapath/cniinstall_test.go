package datapath_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/egressip/egressip/internal/podstart"
	"github.com/egressip/egressip/internal/podstart/cniapi"
	"github.com/egressip/egressip/internal/testutil/poll"
)

// A conflist as a CNI writes it: its own key order, spacing and numbers,
// which Uninstall must give back byte for byte.
const flannelList = `{
  "name": "cbr0",
  "cniVersion": "0.4.0",
  "plugins": [
    { "type": "flannel", "delegate": { "hairpinMode": true, "isDefaultGateway": true, "mtu": 1450 } },
    { "type": "portmap", "capabilities": {"portMappings": true} }
  ]
}
`

// TestPodStartCNIInstall (issue 23, fault 2): the agent chains
// egressip-cni into the first configuration list of a directory standing
// in for /etc/cni/net.d (the one the runtime uses, in libcni's order),
// atomically (no temporary file left where a runtime would load it);
// installing again changes nothing; a list the CNI rewrote without our
// entry gets it back on the next pass; uninstalling restores the original
// byte for byte and leaves no backup; a later list and a single-plugin
// .conf are refused or untouched as documented. Then the same through the
// agent's Run: the entry goes in once the socket serves, and out when the
// agent stops.
func TestPodStartCNIInstall(t *testing.T) {
	dir := t.TempDir()
	first := filepath.Join(dir, "10-flannel.conflist")
	later := filepath.Join(dir, "20-other.conflist")
	if err := os.WriteFile(first, []byte(flannelList), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(later, []byte(flannelList), 0o600); err != nil {
		t.Fatal(err)
	}
	entry := podstart.Entry{Socket: "/run/egressip-cni/agent.sock", TimeoutSeconds: 7}
	path, changed, err := podstart.Install(dir, entry)
	if err != nil || path != first || !changed {
		t.Fatalf("Install = %s, %v, %v; want %s changed", path, changed, err, first)
	}
	installed, _ := os.ReadFile(first)
	if !strings.Contains(string(installed), `"type": "`+cniapi.PluginType+`"`) || strings.LastIndex(string(installed), "portmap") > strings.LastIndex(string(installed), cniapi.PluginType) {
		t.Fatalf("entry missing or not last:\n%s", installed)
	}
	if !strings.Contains(string(installed), `"timeoutSeconds": 7`) || !strings.Contains(string(installed), `"mtu": 1450`) {
		t.Errorf("entry settings or the CNI's numbers lost:\n%s", installed)
	}
	if b, _ := os.ReadFile(later); string(b) != flannelList {
		t.Errorf("a later list was changed:\n%s", b)
	}
	// Idempotent.
	if _, changed, err := podstart.Install(dir, entry); err != nil || changed {
		t.Fatalf("second Install: changed %v, %v", changed, err)
	}
	if b, _ := os.ReadFile(first); string(b) != string(installed) {
		t.Errorf("second Install rewrote the list")
	}
	// Nothing a runtime would load besides the two lists.
	loadable := func() []string {
		var out []string
		des, _ := os.ReadDir(dir)
		for _, de := range des {
			switch filepath.Ext(de.Name()) {
			case ".conf", ".conflist", ".json":
				out = append(out, de.Name())
			}
		}
		return out
	}
	if l := loadable(); len(l) != 2 {
		t.Errorf("loadable files after Install: %v", l)
	}
	// The CNI rewrites its list (a restart of its DaemonSet): our entry
	// comes back, and the backup is the rewritten original.
	if err := os.WriteFile(first, []byte(flannelList), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, changed, err := podstart.Install(dir, entry); err != nil || !changed {
		t.Fatalf("Install after the CNI's rewrite: changed %v, %v", changed, err)
	}
	files, err := podstart.Uninstall(dir)
	if err != nil || len(files) != 1 || files[0] != first {
		t.Fatalf("Uninstall = %v, %v", files, err)
	}
	if b, _ := os.ReadFile(first); string(b) != flannelList {
		t.Errorf("Uninstall did not restore the original byte for byte:\n%s", b)
	}
	if st, _ := os.Stat(first); st.Mode().Perm() != 0o644 {
		t.Errorf("mode after Uninstall %v", st.Mode())
	}
	if des, _ := os.ReadDir(dir); len(des) != 2 {
		t.Errorf("files left after Uninstall: %v", des)
	}
	if files, err := podstart.Uninstall(dir); err != nil || len(files) != 0 {
		t.Errorf("second Uninstall = %v, %v", files, err)
	}
	// A single-plugin .conf first: refused with a clear error, untouched.
	conf := filepath.Join(dir, "05-bridge.conf")
	single := `{"cniVersion":"0.4.0","name":"br","type":"bridge"}`
	if err := os.WriteFile(conf, []byte(single), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := podstart.Install(dir, entry); err == nil || !strings.Contains(err.Error(), "05-bridge.conf") || !strings.Contains(err.Error(), "conflist") {
		t.Errorf("Install over a .conf: %v, want an error naming it", err)
	}
	if b, _ := os.ReadFile(conf); string(b) != single {
		t.Errorf(".conf changed")
	}
	if err := os.Remove(conf); err != nil {
		t.Fatal(err)
	}

	// Through Run, as the agent runs it: installed once the socket
	// serves, removed (byte for byte) when it stops, socket gone too.
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- podstart.Run(ctx, podstart.Options{Socket: sock, ConfDir: dir, Period: 10 * time.Millisecond, Gate: noGate{}})
	}()
	poll.Until(t, 10*time.Second, "the installer to write the CNI config", poll.Cond(func() bool { b, _ := os.ReadFile(first); return strings.Contains(string(b), cniapi.PluginType) }))
	if _, err := os.Stat(sock); err != nil {
		t.Errorf("socket while running: %v", err)
	}
	// The CNI rewrites its list while the agent runs: restored by the
	// next pass.
	if err := os.WriteFile(first, []byte(flannelList), 0o644); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "the installer to write the CNI config", poll.Cond(func() bool { b, _ := os.ReadFile(first); return strings.Contains(string(b), cniapi.PluginType) }))
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if b, _ := os.ReadFile(first); string(b) != flannelList {
		t.Errorf("after the agent stopped, the list is not the original:\n%s", b)
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket left after the agent stopped: %v", err)
	}
}

// noGate classifies nothing (the install path does not need it).
type noGate struct{}

func (noGate) PodAdded(context.Context, cniapi.Request) ([]string, error) { return nil, nil }
func (noGate) PodDeleted(context.Context, cniapi.Request) error           { return nil }
