package controller

import (
	"context"
	"fmt"
	"net/netip"
	"path"
	"slices"
	"sync"
	"time"

	"github.com/egressip/egressip/internal/cloud"
)

// fakeCloud is an in-memory cloud.Provider for envtest runs: one subnet,
// one interface per instance, per-interface address limits, reassignment
// on Assign, a call log, and injectable errors and latency.
type fakeCloud struct {
	mu      sync.Mutex
	subnet  string
	limit   int
	latency time.Duration
	enis    map[string]*fakeENI // by instance ID
	free    []netip.Addr        // subnet addresses attached nowhere, ascending
	log     []fakeCall
	// fail holds errors the next calls of an action return, in order.
	fail map[string][]error
}

type fakeENI struct {
	instance, id, mac string
	secondary         []netip.Addr
}

type fakeCall struct {
	Action, ENI string
	IPs         []netip.Addr
	Count       int
	Err         error
	At          time.Time
}

func newFakeCloud(subnet string, limit int) *fakeCloud {
	f := &fakeCloud{subnet: subnet, limit: limit, enis: map[string]*fakeENI{}, fail: map[string][]error{}}
	for i := 10; i < 250; i++ {
		f.free = append(f.free, netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}))
	}
	return f
}

// addInstance registers an instance and returns its providerID.
func (f *fakeCloud) addInstance(n int) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := fmt.Sprintf("i-%017x", n)
	f.enis[id] = &fakeENI{instance: id, id: fmt.Sprintf("eni-%017x", n), mac: fmt.Sprintf("0a:00:00:00:00:%02x", n)}
	return "aws:///us-east-1a/" + id
}

func (f *fakeCloud) eniByID(id string) *fakeENI {
	for _, e := range f.enis {
		if e.id == id {
			return e
		}
	}
	return nil
}

func (f *fakeCloud) record(c fakeCall) error {
	c.At = time.Now()
	if errs := f.fail[c.Action]; len(errs) > 0 {
		c.Err, f.fail[c.Action] = errs[0], errs[1:]
	}
	f.log = append(f.log, c)
	return c.Err
}

func (f *fakeCloud) sleep() {
	if f.latency > 0 {
		time.Sleep(f.latency)
	}
}

func (f *fakeCloud) Interfaces(_ context.Context, providerIDs map[string]string) (map[string]cloud.Interface, error) {
	f.sleep()
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record(fakeCall{Action: "Interfaces"}); err != nil {
		return nil, err
	}
	out := map[string]cloud.Interface{}
	for node, pid := range providerIDs {
		e := f.enis[path.Base(pid)]
		if e == nil {
			continue
		}
		out[node] = cloud.Interface{Node: node, InstanceID: e.instance, InstanceType: "m5.large", ID: e.id, MAC: e.mac, SubnetID: f.subnet, Limit: f.limit, Secondary: slices.Clone(e.secondary)}
	}
	return out, nil
}

func (f *fakeCloud) Assign(_ context.Context, eni string, ips []netip.Addr) error {
	f.sleep()
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record(fakeCall{Action: "Assign", ENI: eni, IPs: slices.Clone(ips)}); err != nil {
		return err
	}
	e := f.eniByID(eni)
	if e == nil {
		return cloud.ErrNotFound
	}
	added := 0
	for _, ip := range ips {
		if !slices.Contains(e.secondary, ip) {
			added++
		}
	}
	if len(e.secondary)+added > f.limit-1 {
		f.log[len(f.log)-1].Err = cloud.ErrLimitExceeded
		return fmt.Errorf("assign: %w", cloud.ErrLimitExceeded)
	}
	for _, ip := range ips {
		for _, o := range f.enis {
			o.secondary = slices.DeleteFunc(o.secondary, func(a netip.Addr) bool { return a == ip })
		}
		f.free = slices.DeleteFunc(f.free, func(a netip.Addr) bool { return a == ip })
		e.secondary = append(e.secondary, ip)
	}
	slices.SortFunc(e.secondary, netip.Addr.Compare)
	return nil
}

func (f *fakeCloud) AssignCount(_ context.Context, eni string, n int) ([]netip.Addr, error) {
	f.sleep()
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record(fakeCall{Action: "AssignCount", ENI: eni, Count: n}); err != nil {
		return nil, err
	}
	e := f.eniByID(eni)
	switch {
	case e == nil:
		return nil, cloud.ErrNotFound
	case len(e.secondary)+n > f.limit-1:
		f.log[len(f.log)-1].Err = cloud.ErrLimitExceeded
		return nil, fmt.Errorf("assign count: %w", cloud.ErrLimitExceeded)
	case n > len(f.free):
		f.log[len(f.log)-1].Err = cloud.ErrSubnetFull
		return nil, fmt.Errorf("assign count: %w", cloud.ErrSubnetFull)
	}
	got := slices.Clone(f.free[:n])
	f.free = f.free[n:]
	e.secondary = append(e.secondary, got...)
	slices.SortFunc(e.secondary, netip.Addr.Compare)
	return got, nil
}

func (f *fakeCloud) Unassign(_ context.Context, eni string, ips []netip.Addr) error {
	f.sleep()
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record(fakeCall{Action: "Unassign", ENI: eni, IPs: slices.Clone(ips)}); err != nil {
		return err
	}
	e := f.eniByID(eni)
	if e == nil {
		return cloud.ErrNotFound
	}
	for _, ip := range ips {
		if slices.Contains(e.secondary, ip) {
			e.secondary = slices.DeleteFunc(e.secondary, func(a netip.Addr) bool { return a == ip })
			f.free = append(f.free, ip)
		}
	}
	slices.SortFunc(f.free, netip.Addr.Compare)
	return nil
}

// calls returns the logged calls of the given actions (all when none).
func (f *fakeCloud) calls(actions ...string) []fakeCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []fakeCall
	for _, c := range f.log {
		if len(actions) == 0 || slices.Contains(actions, c.Action) {
			out = append(out, c)
		}
	}
	return out
}

// attached maps every secondary address to its interface ID.
func (f *fakeCloud) attached() map[netip.Addr]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[netip.Addr]string{}
	for _, e := range f.enis {
		for _, ip := range e.secondary {
			out[ip] = e.id
		}
	}
	return out
}

// attachBehindOurBack attaches n addresses to the instance's interface as
// another program (a CNI) would, without a logged call.
func (f *fakeCloud) attachBehindOurBack(instanceN, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e := f.enis[fmt.Sprintf("i-%017x", instanceN)]
	got := slices.Clone(f.free[len(f.free)-n:])
	f.free = f.free[:len(f.free)-n]
	e.secondary = append(e.secondary, got...)
	slices.SortFunc(e.secondary, netip.Addr.Compare)
}

func (f *fakeCloud) failNext(action string, errs ...error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail[action] = append(f.fail[action], errs...)
}
