package ec2emu

import (
	"encoding/xml"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The network-interface life cycle: CreateNetworkInterface (with tags and
// security groups), AttachNetworkInterface, ModifyNetworkInterfaceAttribute
// (DeleteOnTermination), DetachNetworkInterface, DeleteNetworkInterface.
// The checks are EC2's as its API reference and user guide describe them:
// an interface attaches only to an instance in its subnet's availability
// zone and VPC, at a device index not in use, within the instance type's
// interface limit (AttachmentLimitExceeded); only a detached interface
// ("available") can be deleted (InvalidNetworkInterface.InUse).

type createNetworkInterfaceResponse struct {
	XMLName xml.Name `xml:"http://ec2.amazonaws.com/doc/2016-11-15/ CreateNetworkInterfaceResponse"`
	respMeta
	ENI xmlENI `xml:"networkInterface"`
}

type attachNetworkInterfaceResponse struct {
	XMLName xml.Name `xml:"http://ec2.amazonaws.com/doc/2016-11-15/ AttachNetworkInterfaceResponse"`
	respMeta
	AttachmentID     string `xml:"attachmentId"`
	NetworkCardIndex int    `xml:"networkCardIndex"`
}

type returnResponse struct {
	XMLName xml.Name
	respMeta
	Return bool `xml:"return"`
}

func okResponse(action string) *returnResponse {
	return &returnResponse{XMLName: xml.Name{Space: Namespace, Local: action + "Response"}, Return: true}
}

// attachmentID is the ID of an interface's current attachment.
func attachmentID(e *eniState) string {
	return "eni-attach-" + strings.TrimPrefix(e.id, "eni-") + "-" + strconv.Itoa(e.deviceIndex)
}

func (s *Server) createNetworkInterface(f formValues, _ time.Time) (any, *apiError) {
	subnet := f.get("SubnetId")
	if subnet == "" {
		return nil, errorf("MissingParameter", "The request must contain the parameter SubnetId")
	}
	sn, ok := s.subnets[subnet]
	if !ok {
		return nil, errorf("InvalidSubnetID.NotFound", "The subnet ID '%s' does not exist", subnet)
	}
	groups := f.list("SecurityGroupId")
	for _, g := range groups {
		if !s.groups[g] {
			return nil, errorf("InvalidGroup.NotFound", "The security group '%s' does not exist", g)
		}
	}
	if len(groups) == 0 {
		groups = []string{DefaultSecurityGroup}
	}
	tags := map[string]string{}
	for i := 1; ; i++ {
		p := "TagSpecification." + strconv.Itoa(i)
		if !f.has(p + ".ResourceType") {
			break
		}
		if rt := f.get(p + ".ResourceType"); rt != "network-interface" {
			return nil, errorf("InvalidParameterValue", "'%s' is not a valid taggable resource type for this operation.", rt)
		}
		for j := 1; ; j++ {
			t := p + ".Tag." + strconv.Itoa(j)
			if !f.has(t + ".Key") {
				break
			}
			tags[f.get(t+".Key")] = f.get(t + ".Value")
		}
	}
	e, err := s.newENI(nil, sn, -1)
	if err != nil {
		return nil, errorf("InsufficientFreeAddressesInSubnet", "The specified subnet does not have enough free addresses to satisfy the request.")
	}
	e.groups = slices.Clone(groups)
	e.tags = tags
	e.description = f.get("Description")
	s.eniOrder = append(s.eniOrder, e.id)
	s.mutated("CreateNetworkInterface", e.id)
	return &createNetworkInterfaceResponse{ENI: s.xmlENI(e, s.cfg.Now(), true)}, nil
}

func (s *Server) attachNetworkInterface(f formValues) (any, *apiError) {
	e, err := s.findENI(f)
	if err != nil {
		return nil, err
	}
	id := f.get("InstanceId")
	inst, ok := s.instances[id]
	if !ok || inst.terminated {
		return nil, errorf("InvalidInstanceID.NotFound", "The instance ID '%s' does not exist", id)
	}
	device, convErr := strconv.Atoi(f.get("DeviceIndex"))
	if convErr != nil || device < 0 {
		return nil, errorf("InvalidParameterValue", "DeviceIndex must be a non-negative integer")
	}
	if card := f.get("NetworkCardIndex"); card != "" && card != "0" {
		return nil, errorf("InvalidParameterValue", "Network card index %s is not valid for instance type %s", card, inst.typ)
	}
	if e.attached() {
		return nil, errorf("InvalidNetworkInterface.InUse", "Interface: [%s] in use.", e.id)
	}
	isn, esn := s.subnets[inst.subnet], s.subnets[e.subnet]
	if isn.az != esn.az {
		return nil, errorf("InvalidParameterCombination", "You may not attach a network interface to an instance if they are not in the same availability zone")
	}
	if isn.vpc != esn.vpc {
		return nil, errorf("InvalidParameterValue", "Network interface %s and instance %s are in different VPCs", e.id, id)
	}
	for _, o := range inst.enis {
		if o.deviceIndex == device {
			return nil, errorf("InvalidParameterValue", "Instance '%s' already has an interface attached at device index '%d'.", id, device)
		}
	}
	if m := s.cfg.InstanceTypes[inst.typ].MaxInterfaces; len(inst.enis) >= m {
		return nil, errorf("AttachmentLimitExceeded", "Interface count %d exceeds the limit for %s", len(inst.enis)+1, inst.typ)
	}
	if 1+len(e.secondary) > s.cfg.InstanceTypes[inst.typ].IPv4PerInterface {
		return nil, errorf("PrivateIpAddressLimitExceeded", "Number of private addresses will exceed limit.")
	}
	e.instance, e.deviceIndex, e.deleteOnTermination = inst.id, device, false
	inst.enis = append(inst.enis, e)
	s.mutated("AttachNetworkInterface", e.id)
	return &attachNetworkInterfaceResponse{AttachmentID: attachmentID(e)}, nil
}

// byAttachment finds the interface of an attachment ID.
func (s *Server) byAttachment(id string) (*eniState, *apiError) {
	if id == "" {
		return nil, errorf("MissingParameter", "The request must contain the parameter AttachmentId")
	}
	for _, e := range s.enis {
		if e.attached() && attachmentID(e) == id {
			return e, nil
		}
	}
	return nil, errorf("InvalidAttachmentID.NotFound", "The attachment ID '%s' does not exist", id)
}

func (s *Server) detachNetworkInterface(f formValues) (any, *apiError) {
	e, err := s.byAttachment(f.get("AttachmentId"))
	if err != nil {
		return nil, err
	}
	if e.deviceIndex == 0 {
		return nil, errorf("OperationNotPermitted", "The network interface at device index 0 cannot be detached.")
	}
	inst := s.instances[e.instance]
	inst.enis = slices.DeleteFunc(inst.enis, func(o *eniState) bool { return o == e })
	e.instance, e.deviceIndex, e.deleteOnTermination = "", -1, false
	s.mutated("DetachNetworkInterface", e.id)
	return okResponse("DetachNetworkInterface"), nil
}

func (s *Server) deleteNetworkInterface(f formValues) (any, *apiError) {
	e, err := s.findENI(f)
	if err != nil {
		return nil, err
	}
	if e.attached() {
		return nil, errorf("InvalidNetworkInterface.InUse", "The network interface %s is currently in use.", e.id)
	}
	s.deleteENI(e)
	s.mutated("DeleteNetworkInterface", e.id)
	return okResponse("DeleteNetworkInterface"), nil
}

func (s *Server) modifyNetworkInterfaceAttribute(f formValues) (any, *apiError) {
	e, err := s.findENI(f)
	if err != nil {
		return nil, err
	}
	if !f.has("Attachment.AttachmentId") {
		return nil, errorf("InvalidParameterCombination", "this emulator modifies only Attachment.DeleteOnTermination")
	}
	if !e.attached() || attachmentID(e) != f.get("Attachment.AttachmentId") {
		return nil, errorf("InvalidAttachmentID.NotFound", "The attachment ID '%s' does not exist", f.get("Attachment.AttachmentId"))
	}
	e.deleteOnTermination = parseBool(f, "Attachment.DeleteOnTermination")
	s.mutated("ModifyNetworkInterfaceAttribute", e.id)
	return okResponse("ModifyNetworkInterfaceAttribute"), nil
}

// filterTagKey is the EC2 Describe filter on tag keys (any value).
const filterTagKey = "tag-key"

// matchTags applies the tag:<key> and tag-key filters.
func matchTags(fs map[string][]string, tags map[string]string) bool {
	for name, vals := range fs {
		switch {
		case name == filterTagKey:
			if !slices.ContainsFunc(vals, func(k string) bool { _, ok := tags[k]; return ok }) {
				return false
			}
		case strings.HasPrefix(name, "tag:"):
			v, ok := tags[strings.TrimPrefix(name, "tag:")]
			if !ok || !slices.Contains(vals, v) {
				return false
			}
		}
	}
	return true
}

// SetTags sets tags on an interface outside the API (another party's
// tagging), for tests.
func (s *Server) SetTags(interfaceID string, tags map[string]string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.enis[interfaceID]
	if ok {
		maps.Copy(e.tags, tags)
	}
	return ok
}

// Detach detaches an interface outside the API (another party's, or what
// a crash between create and attach leaves), keeping its addresses; it
// reports whether the interface existed and was attached.
func (s *Server) Detach(interfaceID string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.enis[interfaceID]
	if !ok || !e.attached() || e.deviceIndex == 0 {
		return false
	}
	inst := s.instances[e.instance]
	inst.enis = slices.DeleteFunc(inst.enis, func(o *eniState) bool { return o == e })
	e.instance, e.deviceIndex = "", -1
	return true
}
