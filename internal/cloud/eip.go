package cloud

import (
	"context"
	"net/netip"
)

// ElasticIP is a public address allocation (AWS: an Elastic IP) and its
// association with a private address, if any.
type ElasticIP struct {
	// AllocationID is the allocation's ID ("eipalloc-...").
	AllocationID string
	// PublicIP is the public IPv4 address.
	PublicIP netip.Addr
	// AssociationID is the current association's ID; empty when the
	// allocation is not associated.
	AssociationID string
	// InterfaceID and PrivateIP are what it is associated with.
	InterfaceID string
	PrivateIP   netip.Addr
}

// ElasticIPs is implemented by providers that can give egress IPs public
// addresses through one-to-one NAT (AWS Elastic IPs).
type ElasticIPs interface {
	// ElasticIPs returns the allocations among ids that exist, plus those
	// carrying every tag of tags (nil: none by tag), in one call. IDs that
	// do not exist are simply absent.
	ElasticIPs(ctx context.Context, ids []string, tags map[string]string) ([]ElasticIP, error)
	// Associate associates the allocation with the private address of
	// the interface (re-associating it if it is associated elsewhere) and
	// returns the association ID.
	Associate(ctx context.Context, allocationID, interfaceID string, private netip.Addr) (string, error)
	// Disassociate ends an association.
	Disassociate(ctx context.Context, associationID string) error
}
