package datapath

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// MainPluginType is the "type" of the first plugin of the harness's
// network configuration list: the harness's own wiring (WirePod), run in
// process; every plugin after it is executed from Runtime.BinDir.
const MainPluginType = "harness-veth"

// WriteConflist writes the harness's network configuration list (only the
// main plugin) to dir/10-harness.conflist and returns its path.
func WriteConflist(dir string) (string, error) {
	path := filepath.Join(dir, "10-harness.conflist")
	b := []byte(`{
  "cniVersion": "1.0.0",
  "name": "harness",
  "plugins": [
    {
      "type": "` + MainPluginType + `"
    }
  ]
}
`)
	return path, os.WriteFile(path, b, 0o644)
}

// Runtime calls CNI plugins for Pods of the harness as a container runtime
// does (libcni): it reads the first network configuration list of ConfDir
// and, for ADD, runs the main plugin (WirePod) and then every chained
// plugin in order, each with the CNI environment (CNI_COMMAND,
// CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME, CNI_ARGS with the kubelet's
// K8S_POD_* keys, CNI_PATH) and its configuration on stdin with name,
// cniVersion and the previous result; DEL runs the chain in reverse.
type Runtime struct {
	Cluster *Cluster
	ConfDir string
	BinDir  string
}

// PodRef is the Pod object a sandbox is created for.
type PodRef struct {
	Namespace, Name, UID string
}

type conflist struct {
	CNIVersion string            `json:"cniVersion"`
	Name       string            `json:"name"`
	Plugins    []json.RawMessage `json:"plugins"`
}

func (r *Runtime) load() (*conflist, error) {
	m, err := filepath.Glob(filepath.Join(r.ConfDir, "*.conflist"))
	if err != nil || len(m) == 0 {
		return nil, fmt.Errorf("no configuration list in %s: %v", r.ConfDir, err)
	}
	slices.Sort(m)
	b, err := os.ReadFile(m[0])
	if err != nil {
		return nil, err
	}
	var l conflist
	if err := json.Unmarshal(b, &l); err != nil {
		return nil, fmt.Errorf("parse %s: %w", m[0], err)
	}
	if len(l.Plugins) == 0 {
		return nil, fmt.Errorf("%s has no plugins", m[0])
	}
	return &l, nil
}

// mainResult is the main plugin's result (CNI 1.0.0) for p.
func mainResult(p *Pod, version string) map[string]any {
	return map[string]any{
		"cniVersion": version,
		"interfaces": []any{map[string]any{"name": "eth0", "sandbox": "/run/netns/" + p.Name}},
		"ips": []any{
			map[string]any{"address": p.IPv4.String() + "/32", "interface": 0},
			map[string]any{"address": p.IPv6.String() + "/128", "interface": 0},
		},
	}
}

func (r *Runtime) exec(ctx context.Context, command string, l *conflist, raw json.RawMessage, p *Pod, ref PodRef, prev map[string]any) (map[string]any, error) {
	var conf map[string]any
	if err := json.Unmarshal(raw, &conf); err != nil {
		return nil, fmt.Errorf("plugin configuration: %w", err)
	}
	typ, _ := conf["type"].(string)
	conf["name"], conf["cniVersion"] = l.Name, l.CNIVersion
	if prev != nil {
		conf["prevResult"] = prev
	}
	stdin, err := json.Marshal(conf)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(r.BinDir, typ))
	cmd.Env = append(os.Environ(),
		"CNI_COMMAND="+command,
		"CNI_CONTAINERID="+p.Name,
		"CNI_NETNS=/run/netns/"+p.Name,
		"CNI_IFNAME=eth0",
		"CNI_PATH="+r.BinDir,
		"CNI_ARGS="+strings.Join([]string{"IgnoreUnknown=1", "K8S_POD_NAMESPACE=" + ref.Namespace,
			"K8S_POD_NAME=" + ref.Name, "K8S_POD_INFRA_CONTAINER_ID=" + p.Name, "K8S_POD_UID=" + ref.UID}, ";"),
	)
	cmd.Stdin = bytes.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s %s", typ, command, err, strings.TrimSpace(out.String()), strings.TrimSpace(errb.String()))
	}
	if command != "ADD" {
		return nil, nil
	}
	var res map[string]any
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		return nil, fmt.Errorf("%s ADD: result %q: %w", typ, out.String(), err)
	}
	return res, nil
}

// Add creates the sandbox of Pod ref in slot j behind n: the main plugin,
// then the chain. On a chained plugin's failure the Pod is unwired again
// (as a runtime tears a failed sandbox down) and the error returned.
func (r *Runtime) Add(ctx context.Context, n *Node, j int, ref PodRef) (*Pod, error) {
	l, err := r.load()
	if err != nil {
		return nil, err
	}
	var first struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(l.Plugins[0], &first); err != nil || first.Type != MainPluginType {
		return nil, fmt.Errorf("first plugin is %q, want %s", first.Type, MainPluginType)
	}
	p, err := r.Cluster.WirePod(n, j)
	if err != nil {
		return nil, err
	}
	prev := mainResult(p, l.CNIVersion)
	for _, raw := range l.Plugins[1:] {
		if prev, err = r.exec(ctx, "ADD", l, raw, p, ref, prev); err != nil {
			return nil, errors.Join(err, r.Cluster.UnwirePod(p))
		}
	}
	return p, nil
}

// Del runs the chain's DEL in reverse order, then unwires the Pod.
func (r *Runtime) Del(ctx context.Context, p *Pod, ref PodRef) error {
	l, err := r.load()
	if err != nil {
		return err
	}
	var errs []error
	for i := len(l.Plugins) - 1; i >= 1; i-- {
		if _, err := r.exec(ctx, "DEL", l, l.Plugins[i], p, ref, nil); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(append(errs, r.Cluster.UnwirePod(p))...)
}
