package main

import (
	"fmt"
	"maps"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1alpha1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/test/e2e/harness"
)

// perPod is how many new connections each batch Pod makes in the
// multi-IP step: enough for the spread over two IPs to show.
const perPod = 8

// multiIP is the multi-IP step. It brings the crashed Node back and
// uncordons the cordoned one (so that three Nodes may hold IPs again),
// creates egress/batch from the multi-IP sample, shows where its IPs are
// and which sources the batch Pods' connections leave with, then crashes
// the Node holding its first IP and shows both again. It returns the Node
// it crashed.
func (d *demo) multiIP(samples string, crashed *harness.Node) (*harness.Node, error) {
	if crashed != nil {
		if err := d.c.ReviveNode(crashed); err != nil {
			return nil, err
		}
		fmt.Printf("   %s restarted (its link up, its agent started)\n", crashed.Name)
	}
	if d.cordoned != nil {
		if err := d.c.Cordon(d.ctx, d.cordoned.Name, false); err != nil {
			return nil, err
		}
		fmt.Printf("   %s uncordoned\n", d.cordoned.Name)
	}
	time.Sleep(2 * time.Second) // the restarted agent is seen alive
	created := time.Now()
	if _, err := d.c.ApplyFile(d.ctx, filepath.Join(samples, "egressip_v1alpha1_egress_multi.yaml")); err != nil {
		return nil, err
	}
	e, err := d.allIPsReady("batch", 2)
	if err != nil {
		return nil, err
	}
	fmt.Printf("   egress/batch: 2 of 2 IPs Ready %v after it was created: %s\n", time.Since(created).Round(time.Millisecond), ipsLine(e))
	d.show()
	if err := d.spread(e, nil); err != nil {
		return nil, err
	}

	d.say("Simulating a crash of one of batch's Nodes: its IP moves to another Node, the other IP stays where it is")
	victimIP := e.Status.IPs[0].IP
	victim := d.c.Node(e.Status.IPs[0].Node)
	start := time.Now()
	if err := d.c.CrashNode(victim); err != nil {
		return nil, err
	}
	var after *v1alpha1.Egress
	if !harness.WaitFor(d.ctx, 30*time.Second, func() bool {
		got, err := d.c.Egress(d.ctx, "batch")
		if err != nil || !allReady(got, 2) || got.Status.IPs[0].Node == victim.Name {
			return false
		}
		after = got
		return true
	}) {
		got, _ := d.c.Egress(d.ctx, "batch")
		return nil, fmt.Errorf("egress/batch: %s did not move off crashed %s within 30s: %s", victimIP, victim.Name, ipsLine(got))
	}
	fmt.Printf("   %s crashed; %s moved to %s, 2 of 2 IPs Ready %v after the crash; %s stayed on %s\n",
		victim.Name, victimIP, after.Status.IPs[0].Node, time.Since(start).Round(time.Millisecond), after.Status.IPs[1].IP, after.Status.IPs[1].Node)
	d.show()
	return victim, d.spread(after, victim)
}

// allIPsReady waits up to 30 s until all n IPs of Egress name are Ready.
func (d *demo) allIPsReady(name string, n int) (*v1alpha1.Egress, error) {
	var e *v1alpha1.Egress
	if !harness.WaitFor(d.ctx, 30*time.Second, func() bool {
		got, err := d.c.Egress(d.ctx, name)
		e = got
		return err == nil && allReady(got, n)
	}) {
		return nil, fmt.Errorf("egress/%s: not all %d IPs Ready within 30s: %s", name, n, ipsLine(e))
	}
	return e, nil
}

// allReady reports whether e has n IPs, each with a Node and Ready.
func allReady(e *v1alpha1.Egress, n int) bool {
	if e == nil || len(e.Status.IPs) != n {
		return false
	}
	for _, s := range e.Status.IPs {
		if s.Node == "" || !s.Ready {
			return false
		}
	}
	return true
}

// ipsLine lists e's IPs with their Nodes and readiness.
func ipsLine(e *v1alpha1.Egress) string {
	if e == nil {
		return "(not found)"
	}
	var parts []string
	for _, s := range e.Status.IPs {
		st := "Ready"
		if !s.Ready {
			st = "not Ready: " + s.Reason
		}
		parts = append(parts, fmt.Sprintf("%s on %s (%s)", s.IP, s.Node, st))
	}
	return fmt.Sprintf("readyIPs %s: %s", e.Status.ReadyIPs, strings.Join(parts, ", "))
}

// spread makes perPod new connections from every batch Pod (except those
// of Node down) and prints the sources the external server saw. Every
// source must be one of e's IPs; waiting up to 15 s for the source Nodes
// to see them.
func (d *demo) spread(e *v1alpha1.Egress, down *harness.Node) error {
	ips := map[netip.Addr]string{}
	for _, s := range e.Status.IPs {
		ips[netip.MustParseAddr(s.IP)] = s.Node
	}
	fmt.Printf("   %-28s %-10s server sees, over %d new connections each\n", "Pod", "Node", perPod)
	for _, p := range d.c.PodsIn("batch") {
		if p.Node == down {
			fmt.Printf("   %-28s %-10s (Node down)\n", p.Namespace+"/"+p.Name, p.Node.Name)
			continue
		}
		harness.WaitFor(d.ctx, 15*time.Second, func() bool {
			ip, err := d.c.Who(d.ctx, p, false)
			return err == nil && ips[ip] != ""
		})
		count := map[netip.Addr]int{}
		for range perPod {
			ip, err := d.c.Who(d.ctx, p, false)
			if err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			if ips[ip] == "" {
				return fmt.Errorf("%s: the server saw %s, not an IP of egress/batch (%s)", p, ip, ipsLine(e))
			}
			count[ip]++
		}
		var cols []string
		for _, ip := range slices.SortedFunc(maps.Keys(count), netip.Addr.Compare) {
			cols = append(cols, fmt.Sprintf("%s x%d (held by %s)", ip, count[ip], ips[ip]))
		}
		fmt.Printf("   %-28s %-10s %s\n", p.Namespace+"/"+p.Name, p.Node.Name, strings.Join(cols, ", "))
	}
	return nil
}
