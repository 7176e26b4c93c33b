package ec2emu

import (
	"encoding/xml"
	"maps"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// formValues reads the EC2 Query API's flattened lists: Name.1, Name.2, ...
type formValues url.Values

func (f formValues) get(k string) string { return url.Values(f).Get(k) }

func (f formValues) has(k string) bool { _, ok := f[k]; return ok }

// list returns prefix.1, prefix.2, ... up to the first missing index.
func (f formValues) list(prefix string) []string {
	var out []string
	for i := 1; ; i++ {
		k := prefix + "." + strconv.Itoa(i)
		if !f.has(k) {
			return out
		}
		out = append(out, f.get(k))
	}
}

// maxFilterValues is EC2's limit on filter values in one call
// (FilterLimitExceeded).
const maxFilterValues = 200

// filters returns Filter.N.Name -> values, checking names against allowed.
func (f formValues) filters(allowed ...string) (map[string][]string, *apiError) {
	out := map[string][]string{}
	total := 0
	for i := 1; ; i++ {
		p := "Filter." + strconv.Itoa(i)
		if !f.has(p + ".Name") {
			break
		}
		name := f.get(p + ".Name")
		if !slices.Contains(allowed, name) && (!strings.HasPrefix(name, "tag:") || !slices.Contains(allowed, "tag:*")) {
			return nil, errorf("InvalidParameterValue", "The filter '%s' is invalid", name)
		}
		vals := f.list(p + ".Value")
		total += len(vals)
		out[name] = append(out[name], vals...)
	}
	if total > maxFilterValues {
		return nil, errorf("FilterLimitExceeded", "The maximum number of filter values specified on a single call is %d", maxFilterValues)
	}
	return out, nil
}

// match reports whether value passes the filter name (absent: passes).
func match(fs map[string][]string, name, value string) bool {
	vals, ok := fs[name]
	return !ok || slices.Contains(vals, value)
}

// page cuts one page of n items out of a list by MaxResults and NextToken
// (an offset, opaque to clients). Config.MaxPageSize caps a page below
// MaxResults, and Config.TrailingEmptyPage makes a full page that reaches
// the end still carry a NextToken, whose page is then empty: EC2 may do
// both, so clients must follow NextToken until it is absent.
func (s *Server) page(f formValues, n int) (from, to int, next string, _ *apiError) {
	to = n
	if t := f.get("NextToken"); t != "" {
		v, err := strconv.Atoi(strings.TrimPrefix(t, "emu-"))
		if err != nil || v < 0 || v > n {
			return 0, 0, "", errorf("InvalidParameterValue", "Invalid NextToken %q", t)
		}
		from = v
	}
	limit := 0
	if m := f.get("MaxResults"); m != "" {
		v, err := strconv.Atoi(m)
		if err != nil || v < 5 || v > 1000 {
			return 0, 0, "", errorf("InvalidParameterValue", "MaxResults must be between 5 and 1000")
		}
		limit = v
	}
	if c := s.cfg.MaxPageSize; c > 0 && (limit == 0 || c < limit) {
		limit = c
	}
	if limit == 0 {
		return from, to, "", nil
	}
	switch {
	case from+limit < n:
		to = from + limit
		next = "emu-" + strconv.Itoa(to)
	case from+limit == n && s.cfg.TrailingEmptyPage:
		next = "emu-" + strconv.Itoa(n)
	}
	return from, to, next, nil
}

type respMeta struct {
	RequestID string `xml:"requestId"`
}

func (m *respMeta) setRequestID(id string) { m.RequestID = id }

func setRequestID(v any, id string) {
	if m, ok := v.(interface{ setRequestID(string) }); ok {
		m.setRequestID(id)
	}
}

type xmlPrivateIP struct {
	PrivateIPAddress string `xml:"privateIpAddress"`
	Primary          bool   `xml:"primary"`
}

type xmlAttachment struct {
	AttachmentID        string `xml:"attachmentId"`
	InstanceID          string `xml:"instanceId,omitempty"`
	DeviceIndex         int    `xml:"deviceIndex"`
	NetworkCardIndex    int    `xml:"networkCardIndex"`
	Status              string `xml:"status"`
	DeleteOnTermination bool   `xml:"deleteOnTermination"`
}

type xmlTag struct {
	Key   string `xml:"key"`
	Value string `xml:"value"`
}

type xmlGroup struct {
	GroupID   string `xml:"groupId"`
	GroupName string `xml:"groupName"`
}

type xmlENI struct {
	NetworkInterfaceID string         `xml:"networkInterfaceId"`
	SubnetID           string         `xml:"subnetId"`
	VPCID              string         `xml:"vpcId"`
	AvailabilityZone   string         `xml:"availabilityZone,omitempty"`
	MACAddress         string         `xml:"macAddress"`
	PrivateIPAddress   string         `xml:"privateIpAddress"`
	Status             string         `xml:"status"`
	InterfaceType      string         `xml:"interfaceType,omitempty"`
	Description        string         `xml:"description,omitempty"`
	RequesterID        string         `xml:"requesterId,omitempty"`
	RequesterManaged   bool           `xml:"requesterManaged"`
	Attachment         *xmlAttachment `xml:"attachment,omitempty"`
	PrivateIPs         []xmlPrivateIP `xml:"privateIpAddressesSet>item"`
	Groups             []xmlGroup     `xml:"groupSet>item"`
	Tags               []xmlTag       `xml:"tagSet>item"`
}

type xmlInstance struct {
	InstanceID   string `xml:"instanceId"`
	InstanceType string `xml:"instanceType"`
	State        struct {
		Code int    `xml:"code"`
		Name string `xml:"name"`
	} `xml:"instanceState"`
	Placement struct {
		AvailabilityZone string `xml:"availabilityZone"`
	} `xml:"placement"`
	SubnetID         string   `xml:"subnetId,omitempty"`
	VPCID            string   `xml:"vpcId,omitempty"`
	PrivateIPAddress string   `xml:"privateIpAddress,omitempty"`
	ENIs             []xmlENI `xml:"networkInterfaceSet>item"`
}

type xmlReservation struct {
	ReservationID string        `xml:"reservationId"`
	OwnerID       string        `xml:"ownerId"`
	Instances     []xmlInstance `xml:"instancesSet>item"`
}

type describeInstancesResponse struct {
	XMLName xml.Name `xml:"http://ec2.amazonaws.com/doc/2016-11-15/ DescribeInstancesResponse"`
	respMeta
	Reservations []xmlReservation `xml:"reservationSet>item"`
	NextToken    string           `xml:"nextToken,omitempty"`
}

type describeNetworkInterfacesResponse struct {
	XMLName xml.Name `xml:"http://ec2.amazonaws.com/doc/2016-11-15/ DescribeNetworkInterfacesResponse"`
	respMeta
	ENIs      []xmlENI `xml:"networkInterfaceSet>item"`
	NextToken string   `xml:"nextToken,omitempty"`
}

type xmlInstanceType struct {
	InstanceType string `xml:"instanceType"`
	NetworkInfo  struct {
		MaximumNetworkInterfaces  int  `xml:"maximumNetworkInterfaces"`
		IPv4AddressesPerInterface int  `xml:"ipv4AddressesPerInterface"`
		IPv6AddressesPerInterface int  `xml:"ipv6AddressesPerInterface"`
		IPv6Supported             bool `xml:"ipv6Supported"`
	} `xml:"networkInfo"`
}

type describeInstanceTypesResponse struct {
	XMLName xml.Name `xml:"http://ec2.amazonaws.com/doc/2016-11-15/ DescribeInstanceTypesResponse"`
	respMeta
	Types     []xmlInstanceType `xml:"instanceTypeSet>item"`
	NextToken string            `xml:"nextToken,omitempty"`
}

type xmlSubnet struct {
	SubnetID                string `xml:"subnetId"`
	State                   string `xml:"state"`
	VPCID                   string `xml:"vpcId"`
	CIDRBlock               string `xml:"cidrBlock"`
	AvailableIPAddressCount int    `xml:"availableIpAddressCount"`
	AvailabilityZone        string `xml:"availabilityZone"`
}

type describeSubnetsResponse struct {
	XMLName xml.Name `xml:"http://ec2.amazonaws.com/doc/2016-11-15/ DescribeSubnetsResponse"`
	respMeta
	Subnets   []xmlSubnet `xml:"subnetSet>item"`
	NextToken string      `xml:"nextToken,omitempty"`
}

type xmlAssigned struct {
	PrivateIPAddress string `xml:"privateIpAddress"`
}

type assignResponse struct {
	XMLName xml.Name `xml:"http://ec2.amazonaws.com/doc/2016-11-15/ AssignPrivateIpAddressesResponse"`
	respMeta
	NetworkInterfaceID string        `xml:"networkInterfaceId"`
	Assigned           []xmlAssigned `xml:"assignedPrivateIpAddressesSet>item"`
}

type unassignResponse struct {
	XMLName xml.Name `xml:"http://ec2.amazonaws.com/doc/2016-11-15/ UnassignPrivateIpAddressesResponse"`
	respMeta
	Return bool `xml:"return"`
}

func (s *Server) dispatch(action string, f formValues) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Now()
	switch action {
	case "DescribeInstances":
		return s.describeInstances(f, now)
	case "DescribeNetworkInterfaces":
		return s.describeNetworkInterfaces(f, now)
	case "DescribeInstanceTypes":
		return s.describeInstanceTypes(f)
	case "DescribeSubnets":
		return s.describeSubnets(f, now)
	case "AssignPrivateIpAddresses":
		return s.assign(f, now)
	case "UnassignPrivateIpAddresses":
		return s.unassign(f, now)
	case "CreateNetworkInterface":
		return s.createNetworkInterface(f, now)
	case "AttachNetworkInterface":
		return s.attachNetworkInterface(f)
	case "DetachNetworkInterface":
		return s.detachNetworkInterface(f)
	case "DeleteNetworkInterface":
		return s.deleteNetworkInterface(f)
	case "ModifyNetworkInterfaceAttribute":
		return s.modifyNetworkInterfaceAttribute(f)
	}
	if resp, err, ok := s.dispatchEIP(action, f); ok {
		return resp, err
	}
	return nil, errorf("InvalidAction", "The action %s is not valid for this web service.", action)
}

// statusAvailable is the status of an interface attached to no instance.
const statusAvailable = "available"

func (s *Server) xmlENI(e *eniState, now time.Time, withInstance bool) xmlENI {
	sn := s.subnets[e.subnet]
	x := xmlENI{
		NetworkInterfaceID: e.id,
		SubnetID:           e.subnet,
		VPCID:              sn.vpc,
		MACAddress:         e.mac,
		PrivateIPAddress:   e.primary.String(),
		Status:             statusAvailable,
		Description:        e.description,
		PrivateIPs:         []xmlPrivateIP{{PrivateIPAddress: e.primary.String(), Primary: true}},
	}
	if e.attached() {
		x.Status = "in-use"
		x.Attachment = &xmlAttachment{
			AttachmentID:        attachmentID(e),
			DeviceIndex:         e.deviceIndex,
			Status:              "attached",
			DeleteOnTermination: e.deleteOnTermination,
		}
	}
	for _, g := range e.groups {
		x.Groups = append(x.Groups, xmlGroup{GroupID: g, GroupName: g})
	}
	for _, k := range slices.Sorted(maps.Keys(e.tags)) {
		x.Tags = append(x.Tags, xmlTag{Key: k, Value: e.tags[k]})
	}
	if withInstance {
		x.AvailabilityZone = sn.az
		x.InterfaceType = TypeInterface
		if x.Attachment != nil {
			x.Attachment.InstanceID = e.instance
		}
	}
	if f := e.foreign; f != nil {
		x.InterfaceType, x.RequesterID, x.RequesterManaged = f.typ, f.requesterID, f.requesterManaged
	}
	for _, a := range e.visible(now, s.cfg.ConsistencyDelay) {
		x.PrivateIPs = append(x.PrivateIPs, xmlPrivateIP{PrivateIPAddress: a.String()})
	}
	return x
}

func validInstanceID(id string) bool {
	h := strings.TrimPrefix(id, "i-")
	if h == id || (len(h) != 8 && len(h) != 17) {
		return false
	}
	return strings.Trim(h, "0123456789abcdef") == ""
}

func (s *Server) describeInstances(f formValues, now time.Time) (any, *apiError) {
	fs, err := f.filters("instance-id", "instance-type", "subnet-id", "instance-state-name", "availability-zone")
	if err != nil {
		return nil, err
	}
	ids := f.list("InstanceId")
	for _, id := range ids {
		if !validInstanceID(id) {
			return nil, errorf("InvalidInstanceID.Malformed", "Invalid id: \"%s\"", id)
		}
		if _, ok := s.instances[id]; !ok {
			return nil, errorf("InvalidInstanceID.NotFound", "The instance ID '%s' does not exist", id)
		}
	}
	var hits []*instanceState
	for _, id := range s.instanceOrder {
		in := s.instances[id]
		state := "running"
		if in.terminated {
			state = "terminated"
		}
		sn := s.subnets[in.subnet]
		if (len(ids) > 0 && !slices.Contains(ids, id)) || !match(fs, "instance-id", id) ||
			!match(fs, "instance-type", in.typ) || !match(fs, "subnet-id", in.subnet) ||
			!match(fs, "instance-state-name", state) || !match(fs, "availability-zone", sn.az) {
			continue
		}
		hits = append(hits, in)
	}
	from, to, next, err := s.page(f, len(hits))
	if err != nil {
		return nil, err
	}
	resp := &describeInstancesResponse{NextToken: next}
	for _, in := range hits[from:to] {
		sn := s.subnets[in.subnet]
		x := xmlInstance{InstanceID: in.id, InstanceType: in.typ}
		x.Placement.AvailabilityZone = sn.az
		if in.terminated {
			x.State.Code, x.State.Name = 48, "terminated"
		} else {
			x.State.Code, x.State.Name = 16, "running"
			x.SubnetID, x.VPCID = sn.id, sn.vpc
		}
		for _, e := range in.enis {
			xe := s.xmlENI(e, now, false)
			if e.deviceIndex == 0 {
				x.PrivateIPAddress = xe.PrivateIPAddress
			}
			x.ENIs = append(x.ENIs, xe)
		}
		resp.Reservations = append(resp.Reservations, xmlReservation{
			ReservationID: "r-" + strings.TrimPrefix(in.id, "i-"),
			OwnerID:       "123456789012",
			Instances:     []xmlInstance{x},
		})
	}
	return resp, nil
}

func (s *Server) describeNetworkInterfaces(f formValues, now time.Time) (any, *apiError) {
	fs, err := f.filters("network-interface-id", "attachment.instance-id", "attachment.device-index", "subnet-id", "status", "vpc-id", filterTagKey, "tag:*", "addresses.private-ip-address")
	if err != nil {
		return nil, err
	}
	ids := f.list("NetworkInterfaceId")
	for _, id := range ids {
		if _, ok := s.enis[id]; !ok {
			return nil, errorf("InvalidNetworkInterfaceID.NotFound", "The networkInterface ID '%s' does not exist", id)
		}
	}
	var hits []*eniState
	for _, id := range s.eniOrder {
		e := s.enis[id]
		status := statusAvailable
		if e.attached() {
			status = "in-use"
		}
		if (len(ids) > 0 && !slices.Contains(ids, id)) || !match(fs, "network-interface-id", id) ||
			!match(fs, "attachment.instance-id", e.instance) || !match(fs, "subnet-id", e.subnet) ||
			!match(fs, "attachment.device-index", strconv.Itoa(e.deviceIndex)) || !match(fs, "status", status) ||
			!match(fs, "vpc-id", s.subnets[e.subnet].vpc) || !matchTags(fs, e.tags) ||
			!matchAddress(fs, e, e.visible(now, s.cfg.ConsistencyDelay)) {
			continue
		}
		hits = append(hits, e)
	}
	from, to, next, err := s.page(f, len(hits))
	if err != nil {
		return nil, err
	}
	resp := &describeNetworkInterfacesResponse{NextToken: next}
	for _, e := range hits[from:to] {
		resp.ENIs = append(resp.ENIs, s.xmlENI(e, now, true))
	}
	return resp, nil
}

func (s *Server) describeInstanceTypes(f formValues) (any, *apiError) {
	names := f.list("InstanceType")
	var missing []string
	for _, n := range names {
		if _, ok := s.cfg.InstanceTypes[n]; !ok {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return nil, errorf("InvalidInstanceType", "The following supplied instance types do not exist: [%s]", strings.Join(missing, ", "))
	}
	if len(names) == 0 {
		for n := range s.cfg.InstanceTypes {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	names = slices.Compact(names)
	from, to, next, err := s.page(f, len(names))
	if err != nil {
		return nil, err
	}
	resp := &describeInstanceTypesResponse{NextToken: next}
	for _, n := range names[from:to] {
		t := s.cfg.InstanceTypes[n]
		x := xmlInstanceType{InstanceType: n}
		x.NetworkInfo.MaximumNetworkInterfaces = t.MaxInterfaces
		x.NetworkInfo.IPv4AddressesPerInterface = t.IPv4PerInterface
		x.NetworkInfo.IPv6AddressesPerInterface = t.IPv4PerInterface
		x.NetworkInfo.IPv6Supported = true
		resp.Types = append(resp.Types, x)
	}
	return resp, nil
}

func (s *Server) describeSubnets(f formValues, now time.Time) (any, *apiError) {
	fs, err := f.filters("subnet-id", "vpc-id", "availability-zone")
	if err != nil {
		return nil, err
	}
	ids := f.list("SubnetId")
	for _, id := range ids {
		if _, ok := s.subnets[id]; !ok {
			return nil, errorf("InvalidSubnetID.NotFound", "The subnet ID '%s' does not exist", id)
		}
	}
	var hits []*subnetState
	for _, id := range s.subnetOrder {
		sn := s.subnets[id]
		if (len(ids) > 0 && !slices.Contains(ids, id)) || !match(fs, "subnet-id", id) ||
			!match(fs, "vpc-id", sn.vpc) || !match(fs, "availability-zone", sn.az) {
			continue
		}
		hits = append(hits, sn)
	}
	from, to, next, err := s.page(f, len(hits))
	if err != nil {
		return nil, err
	}
	resp := &describeSubnetsResponse{NextToken: next}
	for _, sn := range hits[from:to] {
		// The free count lags like the interfaces' address lists do.
		inUse := 0
		for _, e := range s.enis {
			if e.subnet == sn.id {
				inUse += 1 + len(e.visible(now, s.cfg.ConsistencyDelay))
			}
		}
		resp.Subnets = append(resp.Subnets, xmlSubnet{
			SubnetID: sn.id, State: "available", VPCID: sn.vpc, CIDRBlock: sn.cidr.String(),
			AvailableIPAddressCount: sn.size() - inUse, AvailabilityZone: sn.az,
		})
	}
	return resp, nil
}

func parseBool(f formValues, k string) bool {
	v, _ := strconv.ParseBool(f.get(k))
	return v
}

func (s *Server) findENI(f formValues) (*eniState, *apiError) {
	id := f.get("NetworkInterfaceId")
	if id == "" {
		return nil, errorf("MissingParameter", "The request must contain the parameter NetworkInterfaceId")
	}
	e, ok := s.enis[id]
	if !ok {
		return nil, errorf("InvalidNetworkInterfaceID.NotFound", "The networkInterface ID '%s' does not exist", id)
	}
	return e, nil
}

func (s *Server) parseAddrs(list []string) ([]netip.Addr, *apiError) {
	out := make([]netip.Addr, 0, len(list))
	for _, v := range list {
		a, err := netip.ParseAddr(v)
		if err != nil || !a.Is4() {
			return nil, errorf("InvalidParameterValue", "Invalid IPv4 address: %s", v)
		}
		out = append(out, a)
	}
	return out, nil
}

// assign implements AssignPrivateIpAddresses: all or nothing, checked
// against the true state.
func (s *Server) assign(f formValues, now time.Time) (any, *apiError) {
	e, err := s.findENI(f)
	if err != nil {
		return nil, err
	}
	sn := s.subnets[e.subnet]
	named := f.list("PrivateIpAddress")
	countStr := f.get("SecondaryPrivateIpAddressCount")
	if len(named) > 0 && countStr != "" {
		return nil, errorf("InvalidParameterCombination", "PrivateIpAddress and SecondaryPrivateIpAddressCount cannot both be given")
	}
	limit := s.limit(e)
	var ips []netip.Addr
	if countStr != "" {
		n, convErr := strconv.Atoi(countStr)
		if convErr != nil || n < 1 {
			return nil, errorf("InvalidParameterValue", "SecondaryPrivateIpAddressCount must be a positive integer")
		}
		if 1+len(e.secondary)+n > limit {
			return nil, errorf("PrivateIpAddressLimitExceeded", "Number of private addresses will exceed limit.")
		}
		var ok bool
		if ips, ok = sn.take(n); !ok {
			return nil, errorf("InsufficientFreeAddressesInSubnet", "The specified subnet does not have enough free addresses to satisfy the request.")
		}
	} else {
		if len(named) == 0 {
			return nil, errorf("MissingParameter", "Either PrivateIpAddress or SecondaryPrivateIpAddressCount is required")
		}
		if ips, err = s.parseAddrs(named); err != nil {
			return nil, err
		}
		reassign := parseBool(f, "AllowReassignment")
		fresh := 0
		for _, a := range ips {
			if !sn.cidr.Contains(a) || sn.reserved(a) {
				return nil, errorf("InvalidParameterValue", "Address %s does not fall within the subnet's address range", a)
			}
			owner := sn.used[a]
			switch {
			case owner == e:
				continue
			case owner == nil:
			case owner.primary == a:
				return nil, errorf("InvalidParameterValue", "Address %s is the primary address of %s and cannot be reassigned", a, owner.id)
			case !reassign:
				return nil, errorf("InvalidIPAddress.InUse", "Address %s is in use.", a)
			}
			fresh++
		}
		if 1+len(e.secondary)+fresh > limit {
			return nil, errorf("PrivateIpAddressLimitExceeded", "Number of private addresses will exceed limit.")
		}
	}
	resp := &assignResponse{NetworkInterfaceID: e.id}
	for _, a := range ips {
		if owner := sn.used[a]; owner != e {
			if owner != nil {
				s.detach(owner, a, now)
				owner.prune(now, s.cfg.ConsistencyDelay)
				s.mutated("AssignPrivateIpAddresses:reassigned-from", owner.id, a)
			}
			s.attach(e, a, now)
		}
		resp.Assigned = append(resp.Assigned, xmlAssigned{PrivateIPAddress: a.String()})
	}
	s.mutated("AssignPrivateIpAddresses", e.id, ips...)
	e.prune(now, s.cfg.ConsistencyDelay)
	return resp, nil
}

func (s *Server) unassign(f formValues, now time.Time) (any, *apiError) {
	e, err := s.findENI(f)
	if err != nil {
		return nil, err
	}
	named := f.list("PrivateIpAddress")
	if len(named) == 0 {
		return nil, errorf("MissingParameter", "The request must contain the parameter PrivateIpAddress")
	}
	ips, err := s.parseAddrs(named)
	if err != nil {
		return nil, err
	}
	for _, a := range ips {
		if a == e.primary {
			return nil, errorf("InvalidParameterValue", "The primary address %s of %s cannot be unassigned", a, e.id)
		}
		if !e.secondary[a] {
			return nil, errorf("InvalidParameterValue", "Some of the specified addresses are not assigned to interface %s", e.id)
		}
	}
	for _, a := range ips {
		s.detach(e, a, now)
	}
	s.dropAssociations(ips)
	e.prune(now, s.cfg.ConsistencyDelay)
	s.mutated("UnassignPrivateIpAddresses", e.id, ips...)
	return &unassignResponse{Return: true}, nil
}
