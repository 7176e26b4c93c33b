// Command egressip-cni is a chained CNI plugin (CNI spec 0.4.0 and 1.x):
// placed after the main plugin in the Node's network configuration list,
// it takes the Pod's IPs from the previous result and asks the egressip
// agent of its Node (a unix socket, see package cniapi) to classify the
// Pod. The agent answers once the Node's datapath treats every IP of the
// Pod as what it is (a member of an Egress, or not), so that the Pod's
// very first packet, which can only follow the runtime's ADD, already
// leaves with its egress IP (docs/datapath.md, "Pod start").
//
// Failure: when the agent's socket file does not exist (no agent on this
// Node, or egressip uninstalled) the plugin passes the result on and the
// Pod starts unclassified, as without egressip. When the socket exists but
// the agent refuses, errs or does not answer within timeoutSeconds, ADD
// fails and the kubelet retries the sandbox: a Pod never starts
// unclassified while an agent runs here. DEL and CHECK never fail on the
// agent's account (CNI spec: DEL must succeed when resources are gone).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/egressip/egressip/internal/podstart/cniapi"
)

// netConf is the plugin's entry in the configuration list.
type netConf struct {
	types.PluginConf
	// Socket is the agent's socket; default cniapi.DefaultSocket.
	Socket string `json:"socket,omitempty"`
	// TimeoutSeconds bounds an ADD's wait for the agent; default
	// cniapi.DefaultTimeout.
	TimeoutSeconds int `json:"timeoutSeconds,omitempty"`
}

// k8sArgs are the CNI_ARGS the kubelet's runtime passes (CRI: containerd,
// CRI-O).
type k8sArgs struct {
	types.CommonArgs
	K8S_POD_NAMESPACE          types.UnmarshallableString //nolint:revive,staticcheck // names fixed by the kubelet
	K8S_POD_NAME               types.UnmarshallableString //nolint:revive,staticcheck // names fixed by the kubelet
	K8S_POD_UID                types.UnmarshallableString //nolint:revive,staticcheck // names fixed by the kubelet
	K8S_POD_INFRA_CONTAINER_ID types.UnmarshallableString //nolint:revive,staticcheck // names fixed by the kubelet
}

func parse(args *skel.CmdArgs) (*netConf, cniapi.Request, error) {
	conf := &netConf{}
	if err := json.Unmarshal(args.StdinData, conf); err != nil {
		return nil, cniapi.Request{}, fmt.Errorf("parse network configuration: %w", err)
	}
	if conf.Socket == "" {
		conf.Socket = cniapi.DefaultSocket
	}
	if conf.TimeoutSeconds < 0 {
		return nil, cniapi.Request{}, fmt.Errorf("timeoutSeconds %d: must not be negative", conf.TimeoutSeconds)
	}
	var ka k8sArgs
	ka.IgnoreUnknown = true
	if err := types.LoadArgs(args.Args, &ka); err != nil {
		return nil, cniapi.Request{}, fmt.Errorf("parse CNI_ARGS: %w", err)
	}
	req := cniapi.Request{
		Namespace: string(ka.K8S_POD_NAMESPACE), Name: string(ka.K8S_POD_NAME), UID: string(ka.K8S_POD_UID),
		ContainerID: args.ContainerID,
	}
	return conf, req, nil
}

func timeout(conf *netConf) time.Duration {
	if conf.TimeoutSeconds > 0 {
		return time.Duration(conf.TimeoutSeconds) * time.Second
	}
	return cniapi.DefaultTimeout
}

func cmdAdd(args *skel.CmdArgs) error {
	conf, req, err := parse(args)
	if err != nil {
		return err
	}
	if err := version.ParsePrevResult(&conf.PluginConf); err != nil {
		return fmt.Errorf("parse prevResult: %w", err)
	}
	if conf.PrevResult == nil {
		return errors.New("no prevResult: egressip-cni must be chained after the plugin that gives the Pod its IPs")
	}
	res, err := current.NewResultFromResult(conf.PrevResult)
	if err != nil {
		return fmt.Errorf("convert prevResult: %w", err)
	}
	for _, ipc := range res.IPs {
		if a, ok := netip.AddrFromSlice(ipc.Address.IP); ok {
			req.IPs = append(req.IPs, a.Unmap())
		}
	}
	if req.Namespace == "" {
		// Not a Kubernetes Pod (no K8S_POD_* arguments): nothing to classify.
		return types.PrintResult(conf.PrevResult, conf.CNIVersion)
	}
	if err := req.Validate(true); err != nil {
		return err
	}
	req.TimeoutMillis = timeout(conf).Milliseconds()
	ctx, cancel := context.WithTimeout(context.Background(), timeout(conf))
	defer cancel()
	if _, err := cniapi.Call(ctx, conf.Socket, cniapi.PathAdd, req); err != nil && !errors.Is(err, cniapi.ErrNoAgent) {
		return fmt.Errorf("classify pod %s/%s: %w", req.Namespace, req.Name, err)
	}
	return types.PrintResult(conf.PrevResult, conf.CNIVersion)
}

func cmdDel(args *skel.CmdArgs) error {
	conf, req, err := parse(args)
	if err != nil || req.Namespace == "" {
		return nil //nolint:nilerr // DEL must not fail (CNI spec): nothing to release
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout(conf))
	defer cancel()
	if _, err := cniapi.Call(ctx, conf.Socket, cniapi.PathDel, req); err != nil {
		// The agent drops what it knows of the Pod anyway when the Pod
		// object goes; a missed DEL only delays that.
		fmt.Fprintf(os.Stderr, "egressip-cni: DEL %s/%s: %v\n", req.Namespace, req.Name, err)
	}
	return nil
}

func cmdCheck(args *skel.CmdArgs) error {
	conf, _, err := parse(args)
	if err != nil {
		return err
	}
	if err := version.ParsePrevResult(&conf.PluginConf); err != nil {
		return fmt.Errorf("parse prevResult: %w", err)
	}
	return nil
}

// copyTo installs this binary into dir (the CNI bin directory) as
// egressip-cni: written to a temporary name there, then renamed, so that a
// runtime never executes a partial file. The DaemonSet's init container
// runs it (the image has no shell or cp).
func copyTo(dir string) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find this binary: %w", err)
	}
	b, err := os.ReadFile(self)
	if err != nil {
		return fmt.Errorf("read this binary: %w", err)
	}
	dst := filepath.Join(dir, cniapi.PluginType)
	tmp := filepath.Join(dir, "."+cniapi.PluginType+".tmp")
	if err := os.WriteFile(tmp, b, 0o755); err != nil {
		return fmt.Errorf("install into %s: %w", dir, err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("install into %s: %w", dir, err)
	}
	return nil
}

// supportedVersions are the CNI spec versions the plugin accepts. 0.3.x
// stays in because the stock configuration lists of widely used main
// plugins (flannel, Calico) still declare cniVersion 0.3.1, and a chained
// plugin must accept its list's version or every Pod start on the Node
// fails; CHECK needs 0.4.0 or later (the library refuses it below).
var supportedVersions = []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}

func main() {
	if len(os.Args) == 3 && os.Args[1] == "copy-to" && os.Getenv("CNI_COMMAND") == "" {
		if err := copyTo(os.Args[2]); err != nil {
			fmt.Fprintf(os.Stderr, "egressip-cni: %v\n", err)
			os.Exit(1)
		}
		fmt.Fprintf(os.Stderr, "egressip-cni: installed into %s\n", os.Args[2])
		return
	}
	skel.PluginMainFuncs(skel.CNIFuncs{Add: cmdAdd, Del: cmdDel, Check: cmdCheck},
		version.PluginSupports(supportedVersions...),
		"egressip-cni: classifies a new Pod for egressip before it can send")
}
