package aws

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/egressip/egressip/internal/cloud"
	"github.com/egressip/egressip/internal/cloud/aws/ec2emu"
)

type env struct {
	emu    *ec2emu.Server
	p      *Provider
	reg    *prometheus.Registry
	subnet string
}

// newEnv starts an emulator with one 10.0.0.0/24 subnet and a Provider on
// it with fast retries.
func newEnv(t *testing.T, cfg ec2emu.Config, opts Options) *env {
	t.Helper()
	emu := ec2emu.New(cfg)
	t.Cleanup(emu.Close)
	subnet, err := emu.AddSubnet(ec2emu.Subnet{CIDR: netip.MustParsePrefix("10.0.0.0/24")})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	opts.Registerer = reg
	if opts.MaxBackoff == 0 {
		opts.MaxBackoff = 20 * time.Millisecond
	}
	p, err := NewForEndpoint(emu.URL(), emu.Region(), ec2emu.AccessKeyID, ec2emu.SecretAccessKey, opts)
	if err != nil {
		t.Fatal(err)
	}
	return &env{emu: emu, p: p, reg: reg, subnet: subnet}
}

func (e *env) instance(t *testing.T, typ string) ec2emu.InstanceInfo {
	t.Helper()
	in, err := e.emu.AddInstance(ec2emu.Instance{Type: typ, SubnetID: e.subnet})
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return c
}

func addrs(s ...string) []netip.Addr {
	out := make([]netip.Addr, len(s))
	for i, v := range s {
		out[i] = netip.MustParseAddr(v)
	}
	return out
}

func TestInterfacesUsesDeviceIndexZero(t *testing.T) {
	e := newEnv(t, ec2emu.Config{}, Options{})
	a := e.instance(t, "m5.large")
	// A secondary interface listed before the primary one.
	if _, err := e.emu.AddInterface(a.ID, ec2emu.InterfaceOptions{ListFirst: true}); err != nil {
		t.Fatal(err)
	}
	pods, err := e.emu.UseSlots(a.PrimaryInterface, 2)
	if err != nil {
		t.Fatal(err)
	}
	got, err := e.p.Interfaces(ctx(t), map[string]string{"node-a": a.ProviderID})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]cloud.Interface{"node-a": {
		Node: "node-a", InstanceID: a.ID, InstanceType: "m5.large", ID: a.PrimaryInterface,
		MAC: a.MAC, SubnetID: e.subnet, Limit: 10, Secondary: pods,
	}}
	if d := cmp.Diff(want, got, cmp.Comparer(func(x, y netip.Addr) bool { return x == y })); d != "" {
		t.Fatalf("Interfaces (-want +got):\n%s", d)
	}
}

func TestAssignCountAndUnassign(t *testing.T) {
	e := newEnv(t, ec2emu.Config{}, Options{})
	a := e.instance(t, "t3.medium")
	ips, err := e.p.AssignCount(ctx(t), a.PrimaryInterface, 3)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := e.emu.Interface(a.PrimaryInterface)
	if d := cmp.Diff(ips, st.Secondary, cmp.Comparer(func(x, y netip.Addr) bool { return x == y })); d != "" || len(ips) != 3 {
		t.Fatalf("AssignCount returned %v, interface holds %v", ips, st.Secondary)
	}
	if err := e.p.Unassign(ctx(t), a.PrimaryInterface, ips[:2]); err != nil {
		t.Fatal(err)
	}
	st, _ = e.emu.Interface(a.PrimaryInterface)
	if len(st.Secondary) != 1 || st.Secondary[0] != ips[2] {
		t.Fatalf("after Unassign the interface holds %v, want [%v]", st.Secondary, ips[2])
	}
}
