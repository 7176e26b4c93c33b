package poolroute

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/egressip/egressip/internal/testutil/netnstest"
)

// fakeLinks is the LinkOps double: this kernel has no 8021q, so VLAN
// links exist only here. It records every change, by link name.
type fakeLinks struct {
	links []netlink.Link
	next  int
	ops   []string
	conf  map[int]map[int]uint32
}

func newFakeLinks(links ...netlink.Link) *fakeLinks {
	f := &fakeLinks{next: 100, conf: map[int]map[int]uint32{}}
	f.links = append(f.links, links...)
	return f
}

func dev(index int, name string) netlink.Link {
	return &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: index, Name: name}}
}

// vlan is a VLAN link on eth0 (index 2).
func vlan(index, id int, name, alias string) netlink.Link {
	return &netlink.Vlan{LinkAttrs: netlink.LinkAttrs{Index: index, Name: name, ParentIndex: 2, Alias: alias}, VlanId: id}
}

func (f *fakeLinks) LinkList() ([]netlink.Link, error) {
	out := make([]netlink.Link, 0, len(f.links))
	for _, l := range f.links {
		// A copy, as netlink hands out fresh objects per dump.
		switch l := l.(type) {
		case *netlink.Vlan:
			c := *l
			out = append(out, &c)
		case *netlink.Device:
			c := *l
			out = append(out, &c)
		default:
			out = append(out, l)
		}
	}
	return out, nil
}

func (f *fakeLinks) find(l netlink.Link) int {
	return slices.IndexFunc(f.links, func(x netlink.Link) bool { return x.Attrs().Name == l.Attrs().Name })
}

func (f *fakeLinks) LinkAdd(l netlink.Link) error {
	if f.find(l) >= 0 {
		return fmt.Errorf("link %s exists", l.Attrs().Name)
	}
	v := *l.(*netlink.Vlan)
	f.next++
	v.Index = f.next
	f.links = append(f.links, &v)
	f.ops = append(f.ops, "add "+v.Name)
	return nil
}

func (f *fakeLinks) LinkDel(l netlink.Link) error {
	i := f.find(l)
	if i < 0 {
		return errors.New("no such link")
	}
	f.links = slices.Delete(f.links, i, i+1)
	f.ops = append(f.ops, "del "+l.Attrs().Name)
	return nil
}

func (f *fakeLinks) LinkSetUp(l netlink.Link) error {
	i := f.find(l)
	if i < 0 {
		return errors.New("no such link")
	}
	f.links[i].Attrs().Flags |= 1 // net.FlagUp
	f.ops = append(f.ops, "up "+l.Attrs().Name)
	return nil
}

func (f *fakeLinks) LinkSetAlias(l netlink.Link, alias string) error {
	i := f.find(l)
	if i < 0 {
		return errors.New("no such link")
	}
	f.links[i].Attrs().Alias = alias
	f.ops = append(f.ops, "alias "+l.Attrs().Name)
	return nil
}

func (f *fakeLinks) SetIPv4Conf(idx int, conf map[int]uint32) error {
	f.conf[idx] = conf
	name := ""
	for _, l := range f.links {
		if l.Attrs().Index == idx {
			name = l.Attrs().Name
		}
	}
	f.ops = append(f.ops, "sysctl "+name)
	return nil
}

func (f *fakeLinks) byName(n string) netlink.Link {
	for _, l := range f.links {
		if l.Attrs().Name == n {
			return l
		}
	}
	return nil
}

// touched lists the operations on one link.
func (f *fakeLinks) touched(name string) []string {
	var out []string
	for _, o := range f.ops {
		if strings.HasSuffix(o, " "+name) {
			out = append(out, o)
		}
	}
	return out
}

func mustSync(t *testing.T, v *VLANs, wants ...VLANWant) []VLANResult {
	t.Helper()
	res, err := v.Sync(wants)
	if err != nil {
		t.Fatalf("Sync: %v", err)
	}
	return res
}

// TestVLANOwnershipCreate: a pool's VLAN is created on its parent, marked
// with the alias, given loose rp_filter and arp_ignore 1 (on it only) and
// brought up; a second Sync changes nothing but re-asserts sysctls.
func TestVLANOwnershipCreate(t *testing.T) {
	f := newFakeLinks(dev(1, "lo"), dev(2, "eth0"), dev(3, "eth1"))
	v := NewVLANs(f)
	res := mustSync(t, v, VLANWant{Pool: "dmz", ID: 100, Parent: "eth0"})
	if res[0].Err != nil || res[0].Link != "egv2.100" || !res[0].Created {
		t.Fatalf("result %+v, want egv2.100 created", res[0])
	}
	l := f.byName("egv2.100").(*netlink.Vlan)
	if l.ParentIndex != 2 || l.VlanId != 100 || l.Alias != VLANAlias || l.Flags&1 == 0 {
		t.Errorf("link %+v: want VLAN 100 of eth0, alias %q, up", l.Attrs(), VLANAlias)
	}
	if got := f.conf[l.Index]; got[devconfRPFilter] != 2 || got[devconfARPIgnore] != 1 {
		t.Errorf("sysctls of egv2.100: %v, want rp_filter 2 and arp_ignore 1", got)
	}
	if len(f.conf) != 1 {
		t.Errorf("sysctls written on %d links, want only the sub-interface: %v", len(f.conf), f.conf)
	}
	res = mustSync(t, v, VLANWant{Pool: "dmz", ID: 100, Parent: "eth0"})
	if res[0].Err != nil || res[0].Created || slices.Contains(f.ops[3:], "add egv2.100") {
		t.Errorf("second Sync: %+v, ops %v", res[0], f.ops)
	}
}

// TestVLANOwnershipReuseTwoPools: two pools on the same VLAN and parent
// share one sub-interface, created once; when one pool goes the other
// keeps it.
func TestVLANOwnershipReuseTwoPools(t *testing.T) {
	f := newFakeLinks(dev(2, "eth0"))
	v := NewVLANs(f)
	res := mustSync(t, v, VLANWant{Pool: "a", ID: 200, Parent: "eth0"}, VLANWant{Pool: "b", ID: 200, Parent: "eth0"})
	if res[0].Link != "egv2.200" || res[1].Link != "egv2.200" || res[0].Err != nil || res[1].Err != nil {
		t.Fatalf("results %+v", res)
	}
	if n := len(slices.DeleteFunc(slices.Clone(f.ops), func(o string) bool { return !strings.HasPrefix(o, "add ") })); n != 1 {
		t.Errorf("%d links added, want 1: %v", n, f.ops)
	}
	mustSync(t, v, VLANWant{Pool: "b", ID: 200, Parent: "eth0"})
	if f.byName("egv2.200") == nil || slices.Contains(f.ops, "del egv2.200") {
		t.Errorf("the sub-interface went while pool b needs it: %v", f.ops)
	}
}

// TestVLANOwnershipRemoveUnused: an owned sub-interface no pool wants is
// deleted (also one left by a crash before its alias was set, known by its
// name); foreign VLAN links, wanted or not, stay untouched.
func TestVLANOwnershipRemoveUnused(t *testing.T) {
	f := newFakeLinks(dev(2, "eth0"),
		vlan(10, 300, "egv2.300", VLANAlias),
		vlan(11, 301, "egv2.301", ""), // crash between add and alias
		vlan(12, 302, "eth0.302", ""), // someone else's
		vlan(13, 303, "egv2.303", "site: uplink to the DMZ"))
	v := NewVLANs(f)
	mustSync(t, v)
	for _, n := range []string{"egv2.300", "egv2.301"} {
		if f.byName(n) != nil {
			t.Errorf("%s still there, want it deleted", n)
		}
	}
	for _, n := range []string{"eth0.302", "egv2.303"} {
		if f.byName(n) == nil || len(f.touched(n)) != 0 {
			t.Errorf("foreign %s: present %v, operations %v, want untouched", n, f.byName(n) != nil, f.touched(n))
		}
	}
}

// TestVLANOwnershipRefuseForeign: a pool wanting a VLAN ID that a foreign
// link already has on the parent gets ErrForeignVLAN naming that link;
// the link is neither adopted, nor changed, nor deleted, and nothing else
// is created in its place; other pools are served.
func TestVLANOwnershipRefuseForeign(t *testing.T) {
	f := newFakeLinks(dev(2, "eth0"), vlan(12, 400, "eth0.400", "made by hand"))
	v := NewVLANs(f)
	res := mustSync(t, v, VLANWant{Pool: "dmz", ID: 400, Parent: "eth0"}, VLANWant{Pool: "ok", ID: 401, Parent: "eth0"})
	if !errors.Is(res[0].Err, ErrForeignVLAN) || !strings.Contains(res[0].Err.Error(), "eth0.400") || !strings.Contains(res[0].Err.Error(), "pool dmz") {
		t.Errorf("pool dmz: %v, want ErrForeignVLAN naming eth0.400 and the pool", res[0].Err)
	}
	if res[0].Foreign != "eth0.400" || res[0].Link != "" {
		t.Errorf("pool dmz: Foreign %q Link %q, want the foreign link named and no link of ours", res[0].Foreign, res[0].Link)
	}
	if res[1].Err != nil || res[1].Link != "egv2.401" {
		t.Errorf("pool ok: %+v, want egv2.401", res[1])
	}
	if got := f.touched("eth0.400"); len(got) != 0 || f.byName("eth0.400").Attrs().Alias != "made by hand" {
		t.Errorf("foreign link touched: %v", got)
	}
	if f.byName("egv2.400") != nil {
		t.Errorf("a second VLAN 400 was created beside the foreign one")
	}
	// A foreign link holding our name for another purpose is not taken.
	f2 := newFakeLinks(dev(2, "eth0"), &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Index: 9, Name: "egv2.500"}})
	res = mustSync(t, NewVLANs(f2), VLANWant{Pool: "p", ID: 500, Parent: "eth0"})
	if !errors.Is(res[0].Err, ErrForeignVLAN) || res[0].Foreign != "egv2.500" || len(f2.ops) != 0 {
		t.Errorf("name clash: %v, ops %v", res[0].Err, f2.ops)
	}
}

// TestVLANOwnershipBadInput: a parent that does not exist on the Node and
// two pools wanting one VLAN ID on different parents fail with errors
// naming the pools and links; the first pool (by name) keeps its VLAN.
func TestVLANOwnershipBadInput(t *testing.T) {
	f := newFakeLinks(dev(2, "eth0"), dev(3, "eth1"))
	v := NewVLANs(f)
	res := mustSync(t, v,
		VLANWant{Pool: "b", ID: 600, Parent: "eth1"},
		VLANWant{Pool: "a", ID: 600, Parent: "eth0"},
		VLANWant{Pool: "c", ID: 601, Parent: "bond7"},
		VLANWant{Pool: "d", ID: 4095, Parent: "eth0"})
	if res[1].Err != nil || res[1].Link != "egv2.600" {
		t.Errorf("pool a: %+v, want egv2.600", res[1])
	}
	if !errors.Is(res[0].Err, ErrVLANConflict) || !strings.Contains(res[0].Err.Error(), "pool a has it on eth0") {
		t.Errorf("pool b: %v, want ErrVLANConflict naming pool a and eth0", res[0].Err)
	}
	if !errors.Is(res[2].Err, ErrNoParent) || !strings.Contains(res[2].Err.Error(), `"bond7"`) {
		t.Errorf("pool c: %v, want ErrNoParent naming bond7", res[2].Err)
	}
	if res[3].Err == nil {
		t.Errorf("pool d: VLAN 4095 accepted")
	}
	if f.byName("egv3.600") != nil {
		t.Errorf("VLAN 600 created on eth1 too")
	}
}

// TestVLANOwnershipNetlinkOps runs the real LinkOps in a network
// namespace where the kernel can: the alias and the devconf values on a
// veth (read back from /proc/sys), and a VLAN creation, which this
// kernel (no 8021q) refuses: Sync reports the kernel's error for that
// pool and leaves no link behind.
func TestVLANOwnershipNetlinkOps(t *testing.T) {
	ns := netnstest.NewNS(t, "vlan")
	ns.MustIP(t, "link", "add", "eth0", "type", "veth", "peer", "name", "eth9")
	ops, err := NewNetlinkLinks(ns.Handle)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ops.Close)
	l, err := ops.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	ns.Sysctl(t, "net/ipv4/conf/all/rp_filter", "0")
	if err := ops.SetIPv4Conf(l.Attrs().Index, VLANSysctls); err != nil {
		t.Fatal(err)
	}
	if err := ops.LinkSetAlias(l, VLANAlias); err != nil {
		t.Fatal(err)
	}
	if got := ns.ReadSysctl(t, "net/ipv4/conf/eth0/rp_filter"); got != "2" {
		t.Errorf("rp_filter of eth0: %s, want 2", got)
	}
	if got := ns.ReadSysctl(t, "net/ipv4/conf/eth0/arp_ignore"); got != "1" {
		t.Errorf("arp_ignore of eth0: %s, want 1", got)
	}
	if got := ns.ReadSysctl(t, "net/ipv4/conf/eth9/rp_filter"); got != "0" {
		t.Errorf("rp_filter of the other veth end: %s, want 0 (untouched)", got)
	}
	if l, _ = ops.LinkByName("eth0"); l.Attrs().Alias != VLANAlias {
		t.Errorf("alias %q, want %q", l.Attrs().Alias, VLANAlias)
	}
	before, _ := ns.IP("-o", "link")
	res, err := NewVLANs(ops).Sync([]VLANWant{{Pool: "dmz", ID: 100, Parent: "eth0"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("VLAN creation on this kernel: %v", res[0].Err)
	after, _ := ns.IP("-o", "link")
	if res[0].Err == nil {
		// A kernel with 8021q: the sub-interface must be ours.
		if !strings.Contains(after, "egv") {
			t.Errorf("Sync reported success but no sub-interface is listed:\n%s", after)
		}
		return
	}
	if !strings.Contains(res[0].Err.Error(), "create egv") || before != after {
		t.Errorf("refused VLAN: %v; links before:\n%s\nafter:\n%s", res[0].Err, before, after)
	}
}
