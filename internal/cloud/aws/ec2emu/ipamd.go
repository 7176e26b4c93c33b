package ec2emu

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"
)

// NoManageTag is the tag key the AWS VPC CNI reads on an interface: with
// the value "true" its IP address management daemon (ipamd) leaves the
// interface alone. The primary interface is managed whatever its tags.
const NoManageTag = "node.k8s.amazonaws.com/no_manage"

// IpamdConfig sets up an Ipamd actor.
type IpamdConfig struct {
	// InstanceID is the instance whose interfaces the actor manages.
	InstanceID string
	// Period is the time between two reconciles when the actor runs on
	// its own (Run); default 1 s.
	Period time.Duration
	// WarmIPTarget is the VPC CNI's WARM_IP_TARGET: when above 0 the
	// actor keeps that many free addresses in its pool, attaching more
	// when short and releasing the surplus (warm-IP mode). 0 adopts only.
	WarmIPTarget int
}

// Adoption is one address the actor took into, or released from, its
// pool.
type Adoption struct {
	Addr      netip.Addr
	Interface string
	// Step is the reconcile (1, 2, ...) that did it.
	Step int
}

// Ipamd plays the part of the AWS VPC CNI's ipamd on one instance, as its
// pkg/ipamd/ipamd.go reconcile does it: on each period it lists the
// instance's interfaces, leaves out those tagged no_manage=true (never the
// primary one), takes every secondary address it does not know on the
// others into its pool of Pod addresses, free for Pods, and in warm-IP
// mode unassigns free ones above WARM_IP_TARGET (and assigns more when
// short) through EC2. Its changes are the true state at once and are not
// API calls of the caller (they do not count in Counts); Mutations records
// them as "ipamd:Assign" and "ipamd:Unassign".
//
// An egress IP found on a managed interface is therefore adopted (a Pod
// may get it) and, if free, may be released under its owner.
type Ipamd struct {
	s   *Server
	cfg IpamdConfig

	mu      sync.Mutex
	pool    map[netip.Addr]string // address -> interface
	pods    map[netip.Addr]bool   // addresses handed to Pods
	adopted []Adoption
	freed   []Adoption
	steps   int
}

// NewIpamd starts an actor on an instance. Like ipamd's start-up it first
// takes every secondary address already on the managed interfaces into
// its pool; those are not reported as adopted.
func (s *Server) NewIpamd(cfg IpamdConfig) (*Ipamd, error) {
	if cfg.Period <= 0 {
		cfg.Period = time.Second
	}
	s.mu.Lock()
	_, ok := s.instances[cfg.InstanceID]
	s.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("instance %q does not exist", cfg.InstanceID)
	}
	a := &Ipamd{s: s, cfg: cfg, pool: map[netip.Addr]string{}, pods: map[netip.Addr]bool{}}
	s.mu.Lock()
	for _, e := range a.managed() {
		for ip := range e.secondary {
			a.pool[ip] = e.id
		}
	}
	s.mu.Unlock()
	return a, nil
}

// managed returns the interfaces ipamd manages (s.mu held).
func (a *Ipamd) managed() []*eniState {
	inst := a.s.instances[a.cfg.InstanceID]
	var out []*eniState
	for _, e := range inst.enis {
		if e.deviceIndex == 0 || e.tags[NoManageTag] != "true" {
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(x, y *eniState) int { return x.deviceIndex - y.deviceIndex })
	return out
}

// Step runs one reconcile and returns the addresses it adopted and freed.
func (a *Ipamd) Step() (adopted, freed []Adoption) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.s.mu.Lock()
	defer a.s.mu.Unlock()
	a.steps++
	now := a.s.cfg.Now()
	seen := map[netip.Addr]bool{}
	enis := a.managed()
	for _, e := range enis {
		for _, ip := range e.trueSecondary() {
			seen[ip] = true
			if _, ok := a.pool[ip]; !ok {
				a.pool[ip] = e.id
				adopted = append(adopted, Adoption{Addr: ip, Interface: e.id, Step: a.steps})
			}
		}
	}
	for ip := range a.pool {
		if !seen[ip] {
			delete(a.pool, ip) // gone from the interface: forget it
			delete(a.pods, ip)
		}
	}
	if a.cfg.WarmIPTarget > 0 {
		var free []netip.Addr
		for ip := range a.pool {
			if !a.pods[ip] {
				free = append(free, ip)
			}
		}
		slices.SortFunc(free, netip.Addr.Compare)
		switch over := len(free) - a.cfg.WarmIPTarget; {
		case over > 0:
			// Release the highest free addresses first.
			for _, ip := range free[len(free)-over:] {
				e := a.s.enis[a.pool[ip]]
				a.s.detach(e, ip, now)
				a.s.mutated("ipamd:Unassign", e.id, ip)
				delete(a.pool, ip)
				freed = append(freed, Adoption{Addr: ip, Interface: e.id, Step: a.steps})
			}
		case over < 0:
			a.grow(enis, -over, now)
		}
	}
	a.adopted = append(a.adopted, adopted...)
	a.freed = append(a.freed, freed...)
	return adopted, freed
}

// grow attaches n addresses to the managed interfaces with room (s.mu
// held).
func (a *Ipamd) grow(enis []*eniState, n int, now time.Time) {
	for _, e := range enis {
		room := a.s.limit(e) - 1 - len(e.secondary)
		if room <= 0 {
			continue
		}
		ips, ok := a.s.subnets[e.subnet].take(min(room, n))
		if !ok {
			return
		}
		for _, ip := range ips {
			a.s.attach(e, ip, now)
			a.pool[ip] = e.id
		}
		a.s.mutated("ipamd:Assign", e.id, ips...)
		if n -= len(ips); n == 0 {
			return
		}
	}
}

// AssignPod hands a free address of the pool to a Pod, as the CNI does on
// Pod creation, and returns it.
func (a *Ipamd) AssignPod() (netip.Addr, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var free []netip.Addr
	for ip := range a.pool {
		if !a.pods[ip] {
			free = append(free, ip)
		}
	}
	if len(free) == 0 {
		return netip.Addr{}, false
	}
	ip := slices.MinFunc(free, netip.Addr.Compare)
	a.pods[ip] = true
	return ip, true
}

// Pool returns the addresses the actor holds (for Pods or free), sorted.
func (a *Ipamd) Pool() []netip.Addr {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]netip.Addr, 0, len(a.pool))
	for ip := range a.pool {
		out = append(out, ip)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// Adopted returns every address adopted after start-up, in order.
func (a *Ipamd) Adopted() []Adoption {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.adopted)
}

// Freed returns every address the actor unassigned, in order.
func (a *Ipamd) Freed() []Adoption {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.freed)
}

// Steps is the number of reconciles run so far.
func (a *Ipamd) Steps() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.steps
}

// Run reconciles every Period until ctx ends.
func (a *Ipamd) Run(ctx context.Context) {
	t := time.NewTicker(a.cfg.Period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			a.Step()
		}
	}
}
