package cloud

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// Holder is a network interface that holds an address, as the cloud
// describes it: enough to tell whose it is and to name it to a user.
type Holder struct {
	// InterfaceID is the network interface ID.
	InterfaceID string
	// Type is the interface type as the cloud names it (EC2 interfaceType:
	// "interface", "network_load_balancer", "nat_gateway", ...).
	Type string
	// Description is the interface's description (the VPC CNI writes
	// "aws-K8S-<instance ID>", Elastic Load Balancing "ELB <name>").
	Description string
	// RequesterID is the principal or service that created the interface
	// when it is not the account itself (EC2 requesterId, e.g.
	// "amazon-elb"); RequesterManaged is set when a service manages it.
	RequesterID      string
	RequesterManaged bool
	// InstanceID is the instance the interface is attached to; empty for
	// none (a load balancer's interface).
	InstanceID string
	// Primary is set when the address is the interface's primary address.
	Primary bool
}

// vpcCNIDescription is the description prefix the AWS VPC CNI gives the
// interfaces it creates (amazon-vpc-cni-k8s, pkg/awsutils: "aws-K8S-").
const vpcCNIDescription = "aws-K8S-"

// String names the holder for a condition or an Event: its ID, then what
// it is (instance, type, description, requester).
func (h Holder) String() string {
	var what []string
	switch {
	case h.InstanceID != "":
		what = append(what, "attached to instance "+h.InstanceID)
	default:
		what = append(what, "attached to no instance")
	}
	if h.Type != "" && h.Type != "interface" {
		what = append(what, "type "+h.Type)
	}
	if h.Description != "" {
		what = append(what, fmt.Sprintf("description %q", h.Description))
	}
	if h.RequesterID != "" {
		what = append(what, "requester "+h.RequesterID)
	} else if h.RequesterManaged {
		what = append(what, "managed by a cloud service")
	}
	switch {
	case h.Primary:
		what = append(what, "as its primary address")
	case strings.HasPrefix(h.Description, vpcCNIDescription):
		what = append(what, "a Pod IP of the AWS VPC CNI")
	}
	return h.InterfaceID + " (" + strings.Join(what, ", ") + ")"
}

// AddressLookup is implemented by providers that can say which interface
// holds an address and attach an address only if none does; the controller
// uses it so that it never takes an address from anyone else.
type AddressLookup interface {
	// Holders returns, for each of ips held by an interface in the
	// subnet, that interface; free addresses are absent. It makes one
	// cloud call per batch of addresses the API accepts.
	Holders(ctx context.Context, subnetID string, ips []netip.Addr) (map[netip.Addr]Holder, error)
	// AssignFree attaches ips to the interface only if no interface holds
	// them (no reassignment); if one does, the call fails with ErrInUse
	// and attaches nothing.
	AssignFree(ctx context.Context, interfaceID string, ips []netip.Addr) error
}

// ErrInUse: an address is held by another interface and the call did not
// allow taking it (EC2 InvalidIPAddress.InUse).
var ErrInUse = errors.New("address in use")
