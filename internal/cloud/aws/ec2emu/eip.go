package ec2emu

import (
	"encoding/xml"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// ElasticIP describes an Elastic IP allocation to create with AddElasticIP.
type ElasticIP struct {
	// PublicIP defaults to the next address of 203.0.113.0/24 (a
	// documentation range: the emulator's internet).
	PublicIP netip.Addr
	// Tags are the allocation's tags.
	Tags map[string]string
}

// eipState is one Elastic IP allocation and its association. An
// association binds the public address to a private address of an
// interface; as in EC2, it follows the private address when
// AssignPrivateIpAddresses moves it to another interface with
// AllowReassignment, and ends when the private address is unassigned.
type eipState struct {
	allocID  string
	public   netip.Addr
	tags     map[string]string
	assocID  string // "" when not associated
	private  netip.Addr
	eni      string // the interface holding private at association time
	external bool   // associated by another party (AssociateElsewhere)
}

// AddElasticIP allocates an Elastic IP and returns its allocation ID
// ("eipalloc-...") and public address.
func (s *Server) AddElasticIP(e ElasticIP) (string, netip.Addr, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.eips == nil {
		s.eips = map[string]*eipState{}
	}
	if !e.PublicIP.IsValid() {
		s.nextPublic++
		e.PublicIP = netip.AddrFrom4([4]byte{203, 0, 113, byte(s.nextPublic)})
	}
	for _, x := range s.eips {
		if x.public == e.PublicIP {
			return "", netip.Addr{}, fmt.Errorf("public address %s is allocated already (%s)", e.PublicIP, x.allocID)
		}
	}
	id := s.newID("eipalloc-")
	s.eips[id] = &eipState{allocID: id, public: e.PublicIP, tags: maps.Clone(e.Tags)}
	return id, e.PublicIP, nil
}

// AssociateElsewhere associates an allocation with a private address of an
// interface on behalf of another party (not counted as an API call).
func (s *Server) AssociateElsewhere(allocID, interfaceID string, private netip.Addr) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	x, ok := s.eips[allocID]
	if !ok {
		return fmt.Errorf("allocation %q does not exist", allocID)
	}
	e, ok := s.enis[interfaceID]
	if !ok || (e.primary != private && !e.secondary[private]) {
		return fmt.Errorf("%s is not an address of interface %q", private, interfaceID)
	}
	s.associate(x, e, private)
	x.external = true
	return nil
}

// NAT returns the emulator's one-to-one NAT table: for each associated
// Elastic IP, the private address it maps to (what an external server sees
// as the source of traffic from that private address).
func (s *Server) NAT() map[netip.Addr]netip.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[netip.Addr]netip.Addr{}
	for _, x := range s.eips {
		if s.current(x) {
			out[x.private] = x.public
		}
	}
	return out
}

// current reports whether x is associated now, following a private
// address that moved to another interface (and forgetting an association
// whose private address nobody holds any more).
func (s *Server) current(x *eipState) bool {
	if x.assocID == "" {
		return false
	}
	for _, sn := range s.subnets {
		if e := sn.used[x.private]; e != nil {
			x.eni = e.id
			return true
		}
	}
	x.assocID, x.private, x.eni, x.external = "", netip.Addr{}, "", false
	return false
}

func (s *Server) associate(x *eipState, e *eniState, private netip.Addr) {
	for _, o := range s.eips {
		if o != x && s.current(o) && o.private == private {
			o.assocID, o.private, o.eni, o.external = "", netip.Addr{}, "", false // one public address per private one
		}
	}
	x.assocID = s.newID("eipassoc-")
	x.private, x.eni, x.external = private, e.id, false
}

// dropAssociations ends the associations of private addresses an
// interface gives up (UnassignPrivateIpAddresses).
func (s *Server) dropAssociations(ips []netip.Addr) {
	for _, x := range s.eips {
		if x.assocID != "" && slices.Contains(ips, x.private) {
			x.assocID, x.private, x.eni, x.external = "", netip.Addr{}, "", false
		}
	}
}

type xmlAddress struct {
	PublicIP                string  `xml:"publicIp"`
	AllocationID            string  `xml:"allocationId"`
	Domain                  string  `xml:"domain"`
	AssociationID           string  `xml:"associationId,omitempty"`
	NetworkInterfaceID      string  `xml:"networkInterfaceId,omitempty"`
	NetworkInterfaceOwnerID string  `xml:"networkInterfaceOwnerId,omitempty"`
	PrivateIPAddress        string  `xml:"privateIpAddress,omitempty"`
	InstanceID              string  `xml:"instanceId,omitempty"`
	Tags                    []xmlKV `xml:"tagSet>item"`
}

type xmlKV struct {
	Key   string `xml:"key"`
	Value string `xml:"value"`
}

type describeAddressesResponse struct {
	XMLName xml.Name `xml:"http://ec2.amazonaws.com/doc/2016-11-15/ DescribeAddressesResponse"`
	respMeta
	Addresses []xmlAddress `xml:"addressesSet>item"`
}

type associateAddressResponse struct {
	XMLName xml.Name `xml:"http://ec2.amazonaws.com/doc/2016-11-15/ AssociateAddressResponse"`
	respMeta
	Return        bool   `xml:"return"`
	AssociationID string `xml:"associationId"`
}

type disassociateAddressResponse struct {
	XMLName xml.Name `xml:"http://ec2.amazonaws.com/doc/2016-11-15/ DisassociateAddressResponse"`
	respMeta
	Return bool `xml:"return"`
}

// dispatchEIP serves the Elastic IP actions; ok is false for others.
func (s *Server) dispatchEIP(action string, f formValues) (resp any, aerr *apiError, ok bool) {
	switch action {
	case "DescribeAddresses":
		resp, aerr = s.describeAddresses(f)
	case "AssociateAddress":
		resp, aerr = s.associateAddress(f)
	case "DisassociateAddress":
		resp, aerr = s.disassociateAddress(f)
	default:
		return nil, nil, false
	}
	return resp, aerr, true
}

// eipFilters reads Filter.N: allocation-id, association-id, public-ip,
// private-ip-address, network-interface-id, tag-key and tag:<key>.
func eipFilters(f formValues) (map[string][]string, *apiError) {
	out := map[string][]string{}
	for i := 1; ; i++ {
		p := "Filter." + strconv.Itoa(i)
		if !f.has(p + ".Name") {
			return out, nil
		}
		name := f.get(p + ".Name")
		switch {
		case strings.HasPrefix(name, "tag:") && len(name) > 4:
		case slices.Contains([]string{"allocation-id", "association-id", "public-ip", "private-ip-address", "network-interface-id", filterTagKey}, name):
		default:
			return nil, errorf("InvalidParameterValue", "The filter '%s' is invalid", name)
		}
		out[name] = append(out[name], f.list(p+".Value")...)
	}
}

func (s *Server) describeAddresses(f formValues) (any, *apiError) {
	fs, err := eipFilters(f)
	if err != nil {
		return nil, err
	}
	ids := f.list("AllocationId")
	for _, id := range ids {
		if _, ok := s.eips[id]; !ok {
			return nil, errorf("InvalidAllocationID.NotFound", "The allocation ID '%s' does not exist", id)
		}
	}
	resp := &describeAddressesResponse{}
	for _, id := range slices.Sorted(maps.Keys(s.eips)) {
		x := s.eips[id]
		assoc := s.current(x)
		priv := ""
		if assoc {
			priv = x.private.String()
		}
		if (len(ids) > 0 && !slices.Contains(ids, id)) || !match(fs, "allocation-id", id) || !match(fs, "public-ip", x.public.String()) ||
			!match(fs, "association-id", x.assocID) || !match(fs, "private-ip-address", priv) || !match(fs, "network-interface-id", x.eni) {
			continue
		}
		skip := false
		for name, vals := range fs {
			switch {
			case name == filterTagKey:
				skip = skip || !slices.ContainsFunc(vals, func(k string) bool { _, ok := x.tags[k]; return ok })
			case strings.HasPrefix(name, "tag:"):
				v, ok := x.tags[strings.TrimPrefix(name, "tag:")]
				skip = skip || !ok || !slices.Contains(vals, v)
			}
		}
		if skip {
			continue
		}
		a := xmlAddress{PublicIP: x.public.String(), AllocationID: id, Domain: "vpc"}
		if assoc {
			a.AssociationID, a.NetworkInterfaceID, a.PrivateIPAddress, a.NetworkInterfaceOwnerID = x.assocID, x.eni, priv, "123456789012"
			if e := s.enis[x.eni]; e != nil {
				a.InstanceID = e.instance
			}
		}
		for _, k := range slices.Sorted(maps.Keys(x.tags)) {
			a.Tags = append(a.Tags, xmlKV{Key: k, Value: x.tags[k]})
		}
		resp.Addresses = append(resp.Addresses, a)
	}
	return resp, nil
}

func (s *Server) associateAddress(f formValues) (any, *apiError) {
	id := f.get("AllocationId")
	x, ok := s.eips[id]
	if !ok {
		return nil, errorf("InvalidAllocationID.NotFound", "The allocation ID '%s' does not exist", id)
	}
	e, aerr := s.findENI(f)
	if aerr != nil {
		return nil, aerr
	}
	private := e.primary
	if v := f.get("PrivateIpAddress"); v != "" {
		a, err := netip.ParseAddr(v)
		if err != nil || (a != e.primary && !e.secondary[a]) {
			return nil, errorf("InvalidParameterValue", "The private IP address %s is not assigned to interface %s", v, e.id)
		}
		private = a
	}
	already := s.current(x) && x.private == private && x.eni == e.id
	if s.current(x) && !already && !parseBool(f, "AllowReassociation") {
		return nil, errorf("Resource.AlreadyAssociated", "resource %s is already associated with associate-id %s", id, x.assocID)
	}
	if !already {
		s.associate(x, e, private)
	}
	return &associateAddressResponse{Return: true, AssociationID: x.assocID}, nil
}

func (s *Server) disassociateAddress(f formValues) (any, *apiError) {
	id := f.get("AssociationId")
	for _, x := range s.eips {
		if x.assocID != "" && x.assocID == id && s.current(x) {
			x.assocID, x.private, x.eni, x.external = "", netip.Addr{}, "", false
			return &disassociateAddressResponse{Return: true}, nil
		}
	}
	return nil, errorf("InvalidAssociationID.NotFound", "The association ID '%s' does not exist", id)
}
