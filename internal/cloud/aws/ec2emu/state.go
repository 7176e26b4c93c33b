package ec2emu

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"
)

// InstanceType is the part of an EC2 instance type's network limits the
// emulator enforces.
type InstanceType struct {
	// MaxInterfaces is the number of network interfaces an instance can
	// have attached (DescribeInstanceTypes maximumNetworkInterfaces).
	MaxInterfaces int
	// IPv4PerInterface is the number of private IPv4 addresses one interface
	// can hold, primary included (ipv4AddressesPerInterface).
	IPv4PerInterface int
}

// DefaultInstanceTypes returns the limits of a few real instance types, as
// published in the EC2 User Guide's "IP addresses per network interface per
// instance type" table. A fresh map is returned on each call.
func DefaultInstanceTypes() map[string]InstanceType {
	return map[string]InstanceType{
		"t3.micro":   {MaxInterfaces: 2, IPv4PerInterface: 2},
		"t3.medium":  {MaxInterfaces: 3, IPv4PerInterface: 6},
		"t3.large":   {MaxInterfaces: 3, IPv4PerInterface: 12},
		"m5.large":   {MaxInterfaces: 3, IPv4PerInterface: 10},
		"m5.xlarge":  {MaxInterfaces: 4, IPv4PerInterface: 15},
		"c5.4xlarge": {MaxInterfaces: 8, IPv4PerInterface: 30},
	}
}

// Subnet describes a subnet to create with AddSubnet.
type Subnet struct {
	// ID is the subnet ID ("subnet-..."); empty picks one.
	ID string
	// CIDR is the subnet's IPv4 block. As in a VPC, its first four addresses
	// and its last one are reserved and never handed out.
	CIDR netip.Prefix
	// AvailabilityZone defaults to the region followed by "a".
	AvailabilityZone string
	// VPCID defaults to "vpc-emu".
	VPCID string
}

// Instance describes an instance to create with AddInstance.
type Instance struct {
	// ID is the instance ID ("i-" and 17 hex digits); empty picks one.
	ID string
	// Type is an instance type known to the server's Config.InstanceTypes.
	Type string
	// SubnetID is the subnet of the primary interface.
	SubnetID string
	// SecurityGroups are the primary interface's security groups; empty
	// means the server's DefaultSecurityGroup.
	SecurityGroups []string
}

// InstanceInfo is what AddInstance created.
type InstanceInfo struct {
	// ID is the instance ID.
	ID string
	// ProviderID is the Kubernetes spec.providerID of a Node on this
	// instance, "aws:///<availability zone>/<instance ID>".
	ProviderID string
	// PrimaryInterface is the ID of the interface at device index 0.
	PrimaryInterface string
	// MAC is the primary interface's hardware address.
	MAC string
	// PrivateIP is the primary interface's primary private address.
	PrivateIP netip.Addr
}

// InterfaceOptions tunes AddInterface.
type InterfaceOptions struct {
	// SubnetID defaults to the instance's subnet.
	SubnetID string
	// ListFirst puts the interface before the instance's other interfaces
	// in every Describe* list, so a caller that takes the first interface
	// rather than device index 0 picks the wrong one.
	ListFirst bool
	// Tags are set on the interface (e.g. the VPC CNI's
	// node.k8s.amazonaws.com/instance_id, or no_manage).
	Tags map[string]string
}

// InterfaceState is the true (never lagged) state of one network interface.
type InterfaceState struct {
	// ID is the interface ID ("eni-...").
	ID string
	// InstanceID is the instance the interface is attached to.
	InstanceID string
	// SubnetID is the interface's subnet.
	SubnetID string
	// MAC is the hardware address, lower-case and colon-separated.
	MAC string
	// DeviceIndex is the attachment's device index (0: primary interface).
	DeviceIndex int
	// Primary is the primary private address, which never moves.
	Primary netip.Addr
	// Secondary are the secondary private addresses, sorted (never nil).
	Secondary []netip.Addr
	// Tags are the interface's tags (never nil).
	Tags map[string]string
	// Groups are its security group IDs.
	Groups []string
	// Attached is false for an interface that exists but is attached to
	// no instance (status "available"; InstanceID is empty).
	Attached bool
	// DeleteOnTermination: the interface is deleted with its instance.
	DeleteOnTermination bool
}

// record is one stretch of time during which a secondary address was
// attached to an interface; Describe* calls look at them as of "now minus
// the consistency delay". A zero from means "since forever" (test set-up);
// a zero to means "still attached".
type record struct {
	ip       netip.Addr
	from, to time.Time
}

type subnetState struct {
	id, vpc, az string
	cidr        netip.Prefix
	used        map[netip.Addr]*eniState // true state: every attached address
}

type eniState struct {
	id, mac, subnet, instance string
	deviceIndex               int
	primary                   netip.Addr
	secondary                 map[netip.Addr]bool
	history                   []record
	// tags are the interface's EC2 tags; groups its security groups.
	tags   map[string]string
	groups []string
	// deleteOnTermination deletes the interface with its instance
	// (primary interfaces: always); otherwise it is detached.
	deleteOnTermination bool
	// description is CreateNetworkInterface's Description.
	description string
	// foreign is set for an interface of another party
	// (AddForeignInterface).
	foreign *foreignInfo
}

// attached reports whether the interface is attached to an instance
// (status in-use); a detached one is "available".
func (e *eniState) attached() bool { return e.instance != "" }

type instanceState struct {
	id, typ, subnet string
	terminated      bool
	enis            []*eniState // list order (not device order)
}

// reserved reports whether a is one of the five addresses a VPC keeps in
// every subnet (network, router, DNS, future use, broadcast).
func (s *subnetState) reserved(a netip.Addr) bool {
	first := s.cidr.Masked().Addr()
	for range 4 {
		if a == first {
			return true
		}
		first = first.Next()
	}
	return a == lastAddr(s.cidr)
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().As4()
	host := 32 - p.Bits()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v |= uint32(uint64(1)<<host - 1)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// size is the number of addresses a subnet can hand out.
func (s *subnetState) size() int {
	return 1<<(32-s.cidr.Bits()) - 5
}

func (s *subnetState) free() int { return s.size() - len(s.used) }

// take returns the n lowest free addresses of the subnet without marking
// them, or false when there are fewer than n.
func (s *subnetState) take(n int) ([]netip.Addr, bool) {
	if s.free() < n {
		return nil, false
	}
	out := make([]netip.Addr, 0, n)
	for a := s.cidr.Masked().Addr(); s.cidr.Contains(a) && len(out) < n; a = a.Next() {
		if s.reserved(a) || s.used[a] != nil {
			continue
		}
		out = append(out, a)
	}
	return out, len(out) == n
}

// visible returns the interface's secondary addresses as a Describe call
// at time now sees them with the given lag, sorted.
func (e *eniState) visible(now time.Time, lag time.Duration) []netip.Addr {
	if lag <= 0 {
		return e.trueSecondary()
	}
	at := now.Add(-lag)
	seen := map[netip.Addr]bool{}
	for _, r := range e.history {
		if !r.from.After(at) && (r.to.IsZero() || r.to.After(at)) {
			seen[r.ip] = true
		}
	}
	return sortedKeys(seen)
}

func (e *eniState) trueSecondary() []netip.Addr {
	out := make([]netip.Addr, 0, len(e.secondary))
	for a := range e.secondary {
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

func sortedKeys(m map[netip.Addr]bool) []netip.Addr {
	out := make([]netip.Addr, 0, len(m))
	for a := range m {
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// attach adds a secondary address at time at (zero: visible at once).
func (s *Server) attach(e *eniState, a netip.Addr, at time.Time) {
	e.secondary[a] = true
	e.history = append(e.history, record{ip: a, from: at})
	s.subnets[e.subnet].used[a] = e
}

// detach removes a secondary address at time at.
func (s *Server) detach(e *eniState, a netip.Addr, at time.Time) {
	delete(e.secondary, a)
	for i := range e.history {
		if e.history[i].ip == a && e.history[i].to.IsZero() {
			e.history[i].to = at
		}
	}
	if sn := s.subnets[e.subnet]; sn.used[a] == e {
		delete(sn.used, a)
	}
}

// prune forgets history no lagged view can see any more.
func (e *eniState) prune(now time.Time, lag time.Duration) {
	cut := now.Add(-lag)
	e.history = slices.DeleteFunc(e.history, func(r record) bool {
		return !r.to.IsZero() && r.to.Before(cut)
	})
}

// AddSubnet creates a subnet and returns its ID.
func (s *Server) AddSubnet(sn Subnet) (string, error) {
	if !sn.CIDR.Addr().Is4() || sn.CIDR.Bits() > 28 || sn.CIDR.Bits() < 16 {
		return "", fmt.Errorf("subnet CIDR %s: want an IPv4 block between /16 and /28 (the VPC bounds)", sn.CIDR)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if sn.ID == "" {
		sn.ID = s.newID("subnet-")
	}
	if _, ok := s.subnets[sn.ID]; ok {
		return "", fmt.Errorf("subnet %s exists", sn.ID)
	}
	if sn.AvailabilityZone == "" {
		sn.AvailabilityZone = s.cfg.Region + "a"
	}
	if sn.VPCID == "" {
		sn.VPCID = "vpc-emu"
	}
	s.subnets[sn.ID] = &subnetState{id: sn.ID, vpc: sn.VPCID, az: sn.AvailabilityZone, cidr: sn.CIDR.Masked(), used: map[netip.Addr]*eniState{}}
	s.subnetOrder = append(s.subnetOrder, sn.ID)
	return sn.ID, nil
}

// AddInstance creates a running instance with its primary interface at
// device index 0, whose primary address is the lowest free one of the
// subnet.
func (s *Server) AddInstance(in Instance) (InstanceInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.cfg.InstanceTypes[in.Type]; !ok {
		return InstanceInfo{}, fmt.Errorf("instance type %q is not configured", in.Type)
	}
	sn, ok := s.subnets[in.SubnetID]
	if !ok {
		return InstanceInfo{}, fmt.Errorf("subnet %q does not exist", in.SubnetID)
	}
	if in.ID == "" {
		in.ID = s.newID("i-")
	}
	if _, ok := s.instances[in.ID]; ok {
		return InstanceInfo{}, fmt.Errorf("instance %s exists", in.ID)
	}
	inst := &instanceState{id: in.ID, typ: in.Type, subnet: sn.id}
	e, err := s.newENI(inst, sn, 0)
	if err != nil {
		return InstanceInfo{}, err
	}
	e.deleteOnTermination = true
	e.groups = slices.Clone(in.SecurityGroups)
	if len(e.groups) == 0 {
		e.groups = []string{DefaultSecurityGroup}
	}
	for _, g := range e.groups {
		s.groups[g] = true
	}
	inst.enis = []*eniState{e}
	s.instances[in.ID] = inst
	s.instanceOrder = append(s.instanceOrder, in.ID)
	s.eniOrder = append(s.eniOrder, e.id)
	return InstanceInfo{
		ID:               in.ID,
		ProviderID:       "aws:///" + sn.az + "/" + in.ID,
		PrimaryInterface: e.id,
		MAC:              e.mac,
		PrivateIP:        e.primary,
	}, nil
}

func (s *Server) newENI(inst *instanceState, sn *subnetState, device int) (*eniState, error) {
	ips, ok := sn.take(1)
	if !ok {
		return nil, fmt.Errorf("subnet %s is full", sn.id)
	}
	s.seq++
	e := &eniState{
		id:          s.newID("eni-"),
		mac:         fmt.Sprintf("02:%02x:%02x:%02x:%02x:%02x", byte(s.seq>>32), byte(s.seq>>24), byte(s.seq>>16), byte(s.seq>>8), byte(s.seq)),
		subnet:      sn.id,
		deviceIndex: device,
		primary:     ips[0],
		secondary:   map[netip.Addr]bool{},
		tags:        map[string]string{},
		groups:      []string{DefaultSecurityGroup},
	}
	if inst != nil {
		e.instance = inst.id
	}
	sn.used[ips[0]] = e
	s.enis[e.id] = e
	return e, nil
}

// AddInterface attaches another interface to an instance at the next free
// device index and returns its ID.
func (s *Server) AddInterface(instanceID string, o InterfaceOptions) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	inst, ok := s.instances[instanceID]
	if !ok || inst.terminated {
		return "", fmt.Errorf("instance %q does not exist", instanceID)
	}
	if max := s.cfg.InstanceTypes[inst.typ].MaxInterfaces; len(inst.enis) >= max {
		return "", fmt.Errorf("instance %s (%s) already has %d interfaces, the type's maximum", instanceID, inst.typ, max)
	}
	if o.SubnetID == "" {
		o.SubnetID = inst.subnet
	}
	sn, ok := s.subnets[o.SubnetID]
	if !ok {
		return "", fmt.Errorf("subnet %q does not exist", o.SubnetID)
	}
	device := 0
	for _, e := range inst.enis {
		device = max(device, e.deviceIndex+1)
	}
	e, err := s.newENI(inst, sn, device)
	if err != nil {
		return "", err
	}
	e.deleteOnTermination = true
	maps.Copy(e.tags, o.Tags)
	if o.ListFirst {
		inst.enis = append([]*eniState{e}, inst.enis...)
		s.eniOrder = append([]string{e.id}, s.eniOrder...)
	} else {
		inst.enis = append(inst.enis, e)
		s.eniOrder = append(s.eniOrder, e.id)
	}
	return e.id, nil
}

// UseSlots attaches n secondary addresses to an interface on behalf of
// another party (e.g. the VPC CNI's Pod IPs), visible at once and without
// counting as API calls, and returns them. It fails like the API would when
// the interface or subnet is full.
func (s *Server) UseSlots(interfaceID string, n int) ([]netip.Addr, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.enis[interfaceID]
	if !ok {
		return nil, fmt.Errorf("interface %q does not exist", interfaceID)
	}
	if 1+len(e.secondary)+n > s.limit(e) {
		return nil, fmt.Errorf("interface %s: %d more addresses exceed the limit of %d", interfaceID, n, s.limit(e))
	}
	ips, ok := s.subnets[e.subnet].take(n)
	if !ok {
		return nil, fmt.Errorf("subnet %s has fewer than %d free addresses", e.subnet, n)
	}
	for _, a := range ips {
		s.attach(e, a, time.Time{})
	}
	return ips, nil
}

// Terminate marks an instance terminated: its interfaces with
// DeleteOnTermination are deleted with their addresses, the others are
// detached (status available, addresses kept), and DescribeInstances
// reports it in state "terminated" (as EC2 does for about an hour).
func (s *Server) Terminate(instanceID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	inst, ok := s.instances[instanceID]
	if !ok {
		return fmt.Errorf("instance %q does not exist", instanceID)
	}
	inst.terminated = true
	for _, e := range inst.enis {
		if !e.deleteOnTermination {
			e.instance, e.deviceIndex = "", -1
			continue
		}
		s.deleteENI(e)
	}
	inst.enis = nil
	return nil
}

// deleteENI removes an interface and frees its addresses.
func (s *Server) deleteENI(e *eniState) {
	sn := s.subnets[e.subnet]
	for a := range e.secondary {
		delete(sn.used, a)
	}
	delete(sn.used, e.primary)
	delete(s.enis, e.id)
	s.eniOrder = slices.DeleteFunc(s.eniOrder, func(id string) bool { return id == e.id })
}

// Interface returns the true state of a network interface, ignoring the
// consistency delay, for assertions.
func (s *Server) Interface(id string) (InterfaceState, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.enis[id]
	if !ok {
		return InterfaceState{}, false
	}
	return InterfaceState{
		ID: e.id, InstanceID: e.instance, SubnetID: e.subnet, MAC: e.mac,
		DeviceIndex: e.deviceIndex, Primary: e.primary, Secondary: e.trueSecondary(),
		Tags: maps.Clone(e.tags), Groups: slices.Clone(e.groups), Attached: e.attached(),
		DeleteOnTermination: e.deleteOnTermination,
	}, true
}

// Interfaces returns the true state of every interface, sorted by ID.
func (s *Server) Interfaces() []InterfaceState {
	s.mu.Lock()
	ids := slices.Sorted(maps.Keys(s.enis))
	s.mu.Unlock()
	out := make([]InterfaceState, 0, len(ids))
	for _, id := range ids {
		if st, ok := s.Interface(id); ok {
			out = append(out, st)
		}
	}
	return out
}

// Owner returns the interface an address is attached to now (true state),
// or "" when it is free.
func (s *Server) Owner(subnetID string, a netip.Addr) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	sn, ok := s.subnets[subnetID]
	if !ok || sn.used[a] == nil {
		return ""
	}
	return sn.used[a].id
}

// FreeAddresses returns the number of addresses a subnet can still hand
// out (true state).
func (s *Server) FreeAddresses(subnetID string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sn, ok := s.subnets[subnetID]; ok {
		return sn.free()
	}
	return 0
}

// detachedLimit is the address limit of an interface attached to no
// instance (EC2 applies the instance type's limit only once attached).
const detachedLimit = 50

func (s *Server) limit(e *eniState) int {
	if !e.attached() {
		return detachedLimit
	}
	return s.cfg.InstanceTypes[s.instances[e.instance].typ].IPv4PerInterface
}

func (s *Server) newID(prefix string) string {
	s.seq++
	return fmt.Sprintf("%s%017x", prefix, 0xe0000000000000|s.seq)
}

// DefaultSecurityGroup is the security group every instance's primary
// interface has unless Instance.SecurityGroups says otherwise.
const DefaultSecurityGroup = "sg-0e0e0e0e0e0e0e0e0"

// AddSecurityGroup makes a security group exist (CreateNetworkInterface
// refuses unknown ones with InvalidGroup.NotFound).
func (s *Server) AddSecurityGroup(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.groups[id] = true
}

// Deny makes every later call of action fail with UnauthorizedOperation
// (HTTP 403), as when the caller's IAM policy lacks ec2:<action>; Allow
// undoes it.
func (s *Server) Deny(action string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.denied[action] = true
}

// Allow undoes Deny.
func (s *Server) Allow(action string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.denied, action)
}

// Mutation is one change an API call (or the Ipamd actor) made to one
// interface.
type Mutation struct {
	// Action is the EC2 action, or "ipamd:adopt"-style names for the
	// actor's own changes ("ipamd:Assign", "ipamd:Unassign").
	Action string
	// Interface is the interface changed.
	Interface string
	// Addresses are the secondary addresses the change named, if any.
	Addresses []netip.Addr
}

// Mutations returns every change made so far, in order.
func (s *Server) Mutations() []Mutation {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.mutations)
}

func (s *Server) mutated(action, eni string, ips ...netip.Addr) {
	s.mutations = append(s.mutations, Mutation{Action: action, Interface: eni, Addresses: slices.Clone(ips)})
}

// SetInstanceType changes an instance's type (as a stop, modify, start
// does), keeping its interfaces.
func (s *Server) SetInstanceType(instanceID, typ string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	inst, ok := s.instances[instanceID]
	if !ok {
		return fmt.Errorf("instance %q does not exist", instanceID)
	}
	if _, ok := s.cfg.InstanceTypes[typ]; !ok {
		return fmt.Errorf("instance type %q is not configured", typ)
	}
	inst.typ = typ
	return nil
}
