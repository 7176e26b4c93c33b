package agent

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/go-logr/logr"
	"github.com/vishvananda/netns"

	"github.com/egressip/egressip/internal/agent/bind"
	"github.com/egressip/egressip/internal/agent/poolroute"
)

// vlanKeeper creates and removes the VLAN sub-interfaces that the pools
// of the IPs bound here need (Config.CreateVLANs; package poolroute's
// VLAN rules).
type vlanKeeper struct {
	ops    *poolroute.NetlinkLinks
	vlans  *poolroute.VLANs
	parent string // Config.VLANParent
	iface  string // Config.Interface
	last   string // the last outcome logged
}

func newVLANKeeper(ns netns.NsHandle, cfg Config) (*vlanKeeper, error) {
	ops, err := poolroute.NewNetlinkLinks(ns)
	if err != nil {
		return nil, fmt.Errorf("VLAN sub-interfaces: %w", err)
	}
	return &vlanKeeper{ops: ops, vlans: poolroute.NewVLANs(ops), parent: cfg.VLANParent, iface: cfg.Interface}, nil
}

func (k *vlanKeeper) Close() { k.ops.Close() }

// ensure makes the owned VLAN sub-interfaces those that ips need (their
// hint's VLAN, on --vlan-parent or the link carrying the untagged subnet:
// the interface bind chooses for the IP without the VLAN) and returns the
// IPs whose sub-interface could not be had, each with an error worded as
// bind words its own ("sync: bind <ip>: ..."), so the report's refusal
// names the foreign link or the missing parent. Those IPs must not be
// bound: a foreign VLAN link is not ours to use.
func (k *vlanKeeper) ensure(log logr.Logger, ips []netip.Addr, hints map[netip.Addr]bind.Hint) map[netip.Addr]error {
	var wants []poolroute.VLANWant
	var wantIP []netip.Addr
	failed := map[netip.Addr]error{}
	for _, ip := range ips {
		h := hints[ip]
		if h.VLAN == 0 || h.MAC != "" {
			continue
		}
		parent := k.parent
		if parent == "" {
			l, err := bind.SelectInterface(k.ops, ip, bind.Hint{Subnet: h.Subnet, Interface: cmpOr(h.Interface, k.iface)})
			if err != nil {
				failed[ip] = fmt.Errorf("sync: bind %s: VLAN %d: no parent interface: %w", ip, h.VLAN, err)
				continue
			}
			parent = l.Attrs().Name
		}
		wants = append(wants, poolroute.VLANWant{Pool: "of egress IP " + ip.String(), ID: h.VLAN, Parent: parent})
		wantIP = append(wantIP, ip)
	}
	res, err := k.vlans.Sync(wants)
	var msgs []string
	for i, r := range res {
		if r.Err != nil {
			failed[wantIP[i]] = fmt.Errorf("sync: bind %s: %w", wantIP[i], r.Err)
			msgs = append(msgs, r.Err.Error())
		}
	}
	if err != nil {
		msgs = append(msgs, err.Error())
	}
	slices.Sort(msgs)
	if s := fmt.Sprint(msgs); s != k.last {
		k.last = s
		if len(msgs) > 0 {
			log.Error(errors.Join(errors.New("VLAN sub-interfaces"), err), "some VLAN sub-interfaces cannot be had", "problems", msgs)
		} else {
			log.Info("VLAN sub-interfaces in place", "vlans", len(wants))
		}
	}
	return failed
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
