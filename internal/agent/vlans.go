package agent

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/go-logr/logr"
	"github.com/vishvananda/netns"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/agent/bind"
	"github.com/egressip/egressip/internal/agent/poolroute"
	"github.com/egressip/egressip/internal/report"
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
// bound: a foreign VLAN link is not ours to use. It also returns the
// outcome for the report (report.VLANStatus: the links in place, and per
// failed IP its parent, VLAN ID, foreign link and reason), which the
// controller mirrors in the Node condition EgressVLANLinksReady.
func (k *vlanKeeper) ensure(log logr.Logger, ips []netip.Addr,
	hints map[netip.Addr]bind.Hint) (map[netip.Addr]error, *report.VLANStatus) {
	var wants []poolroute.VLANWant
	var wantIP []netip.Addr
	failed := map[netip.Addr]error{}
	st := &report.VLANStatus{}
	var problems []report.VLANProblem
	for _, ip := range ips {
		h := hints[ip]
		if h.VLAN == 0 || h.MAC != "" {
			continue
		}
		parent := k.parent
		if parent == "" {
			l, err := bind.SelectInterface(k.ops, ip, bind.Hint{Subnet: h.Subnet, Interface: cmpOr(h.Interface, k.iface)})
			if err != nil {
				perr := fmt.Errorf("VLAN %d: %w: %w", h.VLAN, poolroute.ErrNoParent, err)
				failed[ip] = fmt.Errorf("sync: bind %s: %w", ip, perr)
				problems = append(problems, vlanProblem(ip, h.VLAN, "", "", perr))
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
			problems = append(problems, vlanProblem(wantIP[i], r.ID, r.Parent, r.Foreign, r.Err))
		} else if r.Link != "" && !slices.Contains(st.Links, r.Link) {
			st.Links = append(st.Links, r.Link)
		}
	}
	if err != nil && len(res) == 0 {
		// Listing the links failed: no want could be checked.
		for _, ip := range wantIP {
			failed[ip] = fmt.Errorf("sync: bind %s: VLAN sub-interfaces: %w", ip, err)
			problems = append(problems, vlanProblem(ip, hints[ip].VLAN, k.parent, "", err))
		}
	}
	slices.Sort(st.Links)
	slices.SortFunc(problems, func(a, b report.VLANProblem) int { return a.IP.Compare(b.IP) })
	if len(problems) > report.MaxVLANProblems {
		st.More = len(problems) - report.MaxVLANProblems
		problems = problems[:report.MaxVLANProblems]
	}
	st.Problems = problems
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
	return failed, st
}

// vlanProblem is the report's entry for ip's VLAN id failing with err
// (a poolroute.VLANs.Sync error, or no parent found).
func vlanProblem(ip netip.Addr, id int, parent, foreign string, err error) report.VLANProblem {
	p := report.VLANProblem{IP: ip, VLAN: id, Parent: parent, Link: foreign, Reason: v1.ReasonVLANLinkFailed, Message: err.Error()}
	switch {
	case errors.Is(err, poolroute.ErrNoParent):
		p.Reason = v1.ReasonVLANParentMissing
	case errors.Is(err, poolroute.ErrForeignVLAN):
		p.Reason = v1.ReasonVLANForeignLink
	case errors.Is(err, poolroute.ErrVLANConflict):
		p.Reason = v1.ReasonVLANConflict
	}
	if len(p.Message) > report.MaxRefusedMessage {
		p.Message = p.Message[:report.MaxRefusedMessage-3] + "..."
	}
	return p
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
