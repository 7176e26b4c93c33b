// Package cloud is the provider-neutral contract between the controller and
// a cloud API that attaches egress IPs to Nodes' network interfaces, for
// clouds where a gratuitous ARP does not move an address (AWS: a VPC
// delivers an IP only to the network interface it is attached to as a
// secondary private IP). internal/cloud/aws implements it on EC2.
package cloud

import (
	"context"
	"errors"
	"net/netip"
)

// Interface is one Node's primary network interface as the cloud sees it.
type Interface struct {
	// Node is the Kubernetes Node name.
	Node string
	// InstanceID is the cloud instance behind the Node's spec.providerID.
	InstanceID string
	// InstanceType is the instance type, e.g. "m5.large".
	InstanceType string
	// ID is the network interface ID (on AWS the ENI attached at device
	// index 0, not the first in a list).
	ID string
	// MAC is the interface's hardware address, lower-case and
	// colon-separated ("0a:1b:2c:3d:4e:5f"); the agent binds on the Linux
	// interface with this address.
	MAC string
	// SubnetID is the subnet the interface lives in.
	SubnetID string
	// Limit is the number of private IPv4 addresses the interface can hold,
	// primary included, from the instance type's limits.
	Limit int
	// Secondary are the secondary private IPs attached now (the primary
	// excluded), sorted; this includes addresses other software (e.g. a CNI's
	// Pod IPs) attached.
	Secondary []netip.Addr
	// Zone and VPCID are where the instance runs (availability zone, VPC).
	Zone, VPCID string
	// Groups are the primary interface's security group IDs.
	Groups []string
	// MaxInterfaces is the number of interfaces the instance type can have
	// attached (on AWS maximumNetworkInterfaces); 0 if unknown.
	MaxInterfaces int
	// Others are the instance's other attached interfaces (device index
	// above 0, every owner's), sorted by device index.
	Others []ENI
}

// ENI is one network interface other than a Node's primary one.
type ENI struct {
	// ID is the interface ID; MAC its hardware address, lower-case and
	// colon-separated; SubnetID its subnet.
	ID, MAC, SubnetID string
	// InstanceID is the instance it is attached to ("" when detached).
	InstanceID string
	// DeviceIndex is its attachment's device index (-1 when detached).
	DeviceIndex int
	// AttachmentID identifies the attachment ("" when detached).
	AttachmentID string
	// Tags are the interface's tags.
	Tags map[string]string
	// Secondary are its secondary private IPs, sorted.
	Secondary []netip.Addr
}

// InterfaceSpec is a network interface to create.
type InterfaceSpec struct {
	SubnetID    string
	Groups      []string
	Tags        map[string]string
	Description string
}

// Subnet is a subnet's place in the network.
type Subnet struct {
	ID, VPCID, Zone string
}

// InterfaceManager is the part of a provider that creates, attaches,
// detaches and deletes network interfaces of its own (on AWS, ENIs that
// the VPC CNI leaves alone). Each method is one or a few cloud API calls.
type InterfaceManager interface {
	// CreateInterface creates an interface and returns it (detached).
	CreateInterface(ctx context.Context, spec InterfaceSpec) (ENI, error)
	// AttachInterface attaches the interface to the instance at the
	// device index, to be deleted with the instance, and returns the
	// attachment ID.
	AttachInterface(ctx context.Context, interfaceID, instanceID string, deviceIndex int) (string, error)
	// DeleteInterface detaches the interface if attachmentID is set and
	// deletes it once detached.
	DeleteInterface(ctx context.Context, interfaceID, attachmentID string) error
	// TaggedInterfaces returns every interface, attached or not, that
	// carries all the tags.
	TaggedInterfaces(ctx context.Context, tags map[string]string) ([]ENI, error)
	// SubnetZones describes the subnets, keyed by ID; an unknown one is an
	// error wrapping ErrNotFound.
	SubnetZones(ctx context.Context, ids []string) (map[string]Subnet, error)
}

// Provider attaches and detaches secondary IPs. Each method is one cloud API
// call (plus the SDK's own retries), so callers batch.
type Provider interface {
	// Interfaces maps Node names to spec.providerID values and returns each
	// Node's primary interface, keyed by Node name. A Node whose instance
	// does not exist is absent from the result; that is not an error. A
	// Node that cannot be looked up (e.g. a providerID of another cloud) is
	// absent too, and reported in a non-nil error returned alongside the
	// map of the others; a failed cloud API call returns a nil map.
	Interfaces(ctx context.Context, providerIDs map[string]string) (map[string]Interface, error)
	// Assign attaches ips to the interface, taking any of them away from
	// another interface (a failover is one call).
	Assign(ctx context.Context, interfaceID string, ips []netip.Addr) error
	// AssignCount attaches n addresses chosen by the cloud from the
	// interface's subnet and returns them.
	AssignCount(ctx context.Context, interfaceID string, n int) ([]netip.Addr, error)
	// Unassign detaches ips from the interface.
	Unassign(ctx context.Context, interfaceID string, ips []netip.Addr) error
}

// Errors a Provider wraps (match them with errors.Is).
var (
	// ErrLimitExceeded: the interface cannot hold more addresses
	// (EC2 PrivateIpAddressLimitExceeded).
	ErrLimitExceeded = errors.New("interface address limit exceeded")
	// ErrSubnetFull: the subnet has no free address
	// (EC2 InsufficientFreeAddressesInSubnet).
	ErrSubnetFull = errors.New("no free address in subnet")
	// ErrThrottled: the API kept refusing calls for rate after the SDK's
	// retries (EC2 RequestLimitExceeded).
	ErrThrottled = errors.New("cloud API throttled")
	// ErrNotFound: the interface, instance, subnet or security group does
	// not exist.
	ErrNotFound = errors.New("not found")
	// ErrUnauthorized: the caller's policy lacks the permission (EC2
	// UnauthorizedOperation); the error text names the action.
	ErrUnauthorized = errors.New("not authorized")
	// ErrInterfaceLimit: the instance cannot have more interfaces attached
	// (EC2 AttachmentLimitExceeded).
	ErrInterfaceLimit = errors.New("instance interface limit reached")
	// ErrInvalid: the cloud refused the request's parameters (e.g. an
	// interface and an instance in different zones).
	ErrInvalid = errors.New("invalid request")
)
