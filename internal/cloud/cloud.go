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
	// ErrNotFound: the interface or instance does not exist.
	ErrNotFound = errors.New("not found")
)
