package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestMain lets the test binary act as the plugin when a test execs it
// with EGRESSIP_CNI_TEST_PLUGIN=1, the way a container runtime execs a CNI
// plugin (CNI_* environment, network configuration on stdin).
func TestMain(m *testing.M) {
	if os.Getenv("EGRESSIP_CNI_TEST_PLUGIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runPlugin execs the plugin with command and the configuration conf and
// returns its stdout, stderr and error.
func runPlugin(t *testing.T, command string, conf []byte) (string, string, error) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "EGRESSIP_CNI_TEST_PLUGIN=1", "CNI_COMMAND="+command,
		"CNI_CONTAINERID=c0ffee", "CNI_NETNS=/var/run/netns/none", "CNI_IFNAME=eth0", "CNI_PATH="+t.TempDir())
	cmd.Stdin = bytes.NewReader(conf)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	return out.String(), errOut.String(), err
}

// TestCNIVersionsOfStockConfLists: a chained plugin gets its list's
// cniVersion, and flannel's and Calico's stock lists say 0.3.1. ADD must
// succeed and hand the previous result back in that version for every
// version the plugin announces (here without K8S_POD_* arguments, so the
// agent is not asked); VERSION must list them.
func TestCNIVersionsOfStockConfLists(t *testing.T) {
	for _, v := range []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		t.Run(v, func(t *testing.T) {
			prev := map[string]any{"cniVersion": v, "ips": []map[string]any{{"address": "10.244.1.5/24"}}}
			if strings.HasPrefix(v, "0.3") {
				prev["ips"] = []map[string]any{{"version": "4", "address": "10.244.1.5/24"}}
			}
			conf, err := json.Marshal(map[string]any{
				"cniVersion": v, "name": "cbr0", "type": "egressip-cni",
				"socket": filepath.Join(t.TempDir(), "absent.sock"), "prevResult": prev,
			})
			if err != nil {
				t.Fatal(err)
			}
			out, errOut, err := runPlugin(t, "ADD", conf)
			if err != nil {
				t.Fatalf("ADD with cniVersion %s: %v\nstdout %s\nstderr %s", v, err, out, errOut)
			}
			var res struct {
				CNIVersion string `json:"cniVersion"`
				IPs        []struct {
					Address string `json:"address"`
				} `json:"ips"`
			}
			if err := json.Unmarshal([]byte(out), &res); err != nil {
				t.Fatalf("ADD output %q: %v", out, err)
			}
			if res.CNIVersion != v || len(res.IPs) != 1 || res.IPs[0].Address != "10.244.1.5/24" {
				t.Fatalf("ADD gave %+v, want the previous result in version %s", res, v)
			}
		})
	}
	out, _, err := runPlugin(t, "VERSION", []byte(`{"cniVersion":"0.3.1"}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range supportedVersions {
		if !strings.Contains(out, `"`+v+`"`) {
			t.Fatalf("VERSION %s does not list %s", out, v)
		}
	}
}
