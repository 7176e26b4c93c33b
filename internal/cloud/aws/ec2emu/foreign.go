package ec2emu

import (
	"fmt"
	"net/netip"
	"slices"
	"time"
)

// Interface types of EC2's interfaceType field that tests use for
// interfaces of other parties (the EC2 API Reference lists the values).
const (
	// TypeInterface is an ordinary network interface, such as an instance's
	// or one the VPC CNI created.
	TypeInterface = "interface"
	// TypeNetworkLoadBalancer is a Network Load Balancer's interface in a
	// subnet, created and managed by Elastic Load Balancing.
	TypeNetworkLoadBalancer = "network_load_balancer"
)

// ForeignInterface describes an interface of another party (a load
// balancer, the VPC CNI, another application) to create with
// AddForeignInterface.
type ForeignInterface struct {
	// SubnetID is the interface's subnet.
	SubnetID string
	// InstanceID, when set, attaches the interface to that instance at the
	// next free device index; empty leaves it attached to no instance (as a
	// load balancer's interface is).
	InstanceID string
	// Type is EC2's interfaceType; default TypeInterface.
	Type string
	// Description is the interface's description, such as
	// "aws-K8S-i-0123456789abcdef0" (the VPC CNI) or "ELB net/name/id".
	Description string
	// RequesterID is the AWS principal or service that created it, such as
	// "amazon-elb"; RequesterManaged is true for interfaces a service
	// manages on the account's behalf.
	RequesterID      string
	RequesterManaged bool
	// Addresses are secondary addresses the interface holds from the
	// start (visible at once).
	Addresses []netip.Addr
}

// foreignInfo is what an interface of another party reports besides the
// common fields.
type foreignInfo struct {
	typ, requesterID string
	requesterManaged bool
}

// AddForeignInterface creates an interface of another party and returns its
// ID. Its primary address is the lowest free one of the subnet.
func (s *Server) AddForeignInterface(fi ForeignInterface) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sn, ok := s.subnets[fi.SubnetID]
	if !ok {
		return "", fmt.Errorf("subnet %q does not exist", fi.SubnetID)
	}
	var inst *instanceState
	device := 0
	if fi.InstanceID != "" {
		if inst, ok = s.instances[fi.InstanceID]; !ok || inst.terminated {
			return "", fmt.Errorf("instance %q does not exist", fi.InstanceID)
		}
		if m := s.cfg.InstanceTypes[inst.typ].MaxInterfaces; len(inst.enis) >= m {
			return "", fmt.Errorf("instance %s (%s) already has %d interfaces, the type's maximum", fi.InstanceID, inst.typ, m)
		}
		for _, e := range inst.enis {
			device = max(device, e.deviceIndex+1)
		}
	}
	for _, a := range fi.Addresses {
		if err := s.checkFree(sn, a); err != nil {
			return "", err
		}
	}
	e, err := s.newENI(inst, sn, device)
	if err != nil {
		return "", err
	}
	e.description = fi.Description
	e.foreign = &foreignInfo{typ: cmpOr(fi.Type, TypeInterface), requesterID: fi.RequesterID, requesterManaged: fi.RequesterManaged}
	if fi.InstanceID != "" {
		inst.enis = append(inst.enis, e)
	}
	s.eniOrder = append(s.eniOrder, e.id)
	for _, a := range fi.Addresses {
		s.attach(e, a, time.Time{})
	}
	return e.id, nil
}

// UseAddresses attaches the named secondary addresses to an interface on
// behalf of another party (e.g. Pod IPs the VPC CNI gave out), visible at
// once and without counting as API calls. Each must be a free, unreserved
// address of the interface's subnet.
func (s *Server) UseAddresses(interfaceID string, ips ...netip.Addr) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.enis[interfaceID]
	if !ok {
		return fmt.Errorf("interface %q does not exist", interfaceID)
	}
	sn := s.subnets[e.subnet]
	for _, a := range ips {
		if err := s.checkFree(sn, a); err != nil {
			return err
		}
	}
	if 1+len(e.secondary)+len(ips) > s.limit(e) {
		return fmt.Errorf("interface %s: %d more addresses exceed the limit of %d", interfaceID, len(ips), s.limit(e))
	}
	for _, a := range ips {
		s.attach(e, a, time.Time{})
	}
	return nil
}

func (s *Server) checkFree(sn *subnetState, a netip.Addr) error {
	switch {
	case !sn.cidr.Contains(a) || sn.reserved(a):
		return fmt.Errorf("%s is not an address subnet %s hands out", a, sn.id)
	case sn.used[a] != nil:
		return fmt.Errorf("%s is in use by %s", a, sn.used[a].id)
	}
	return nil
}

// matchAddress reports whether one of the interface's addresses (primary or
// secondary, as Describe sees them) passes the addresses.private-ip-address
// filter (absent: passes).
func matchAddress(fs map[string][]string, e *eniState, visible []netip.Addr) bool {
	vals, ok := fs["addresses.private-ip-address"]
	if !ok {
		return true
	}
	if slices.Contains(vals, e.primary.String()) {
		return true
	}
	for _, a := range visible {
		if slices.Contains(vals, a.String()) {
			return true
		}
	}
	return false
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// TakeAddress moves a secondary address of the subnet to the interface on
// behalf of another party, as AssignPrivateIpAddresses with
// AllowReassignment would (the VPC CNI or another program taking an
// address away), at once and without counting as an API call. The address
// may be free or a secondary address of another interface.
func (s *Server) TakeAddress(interfaceID string, ip netip.Addr) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.enis[interfaceID]
	if !ok {
		return fmt.Errorf("interface %q does not exist", interfaceID)
	}
	sn := s.subnets[e.subnet]
	if !sn.cidr.Contains(ip) || sn.reserved(ip) {
		return fmt.Errorf("%s is not an address subnet %s hands out", ip, sn.id)
	}
	now := s.cfg.Now()
	if owner := sn.used[ip]; owner != nil {
		if owner.primary == ip {
			return fmt.Errorf("%s is the primary address of %s", ip, owner.id)
		}
		if owner == e {
			return nil
		}
		s.detach(owner, ip, now)
	}
	s.attach(e, ip, now)
	return nil
}
