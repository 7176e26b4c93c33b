// Package aws implements cloud.Provider on Amazon EC2 with aws-sdk-go-v2.
//
// A Node maps to its instance through spec.providerID
// ("aws:///<availability zone>/<instance ID>", the format of the Kubernetes
// AWS cloud provider) and to the instance's primary network interface, the
// one attached at device index 0 (never "the first in the list": EC2 does
// not order the list). An interface's address limit is the instance type's
// ipv4AddressesPerInterface (DescribeInstanceTypes), cached per type for
// the life of the Provider since a type's limits never change.
//
// Calls are batched: Interfaces makes one DescribeInstances call per 200
// instances (EC2's limit on filter values) whatever the number of Nodes,
// plus one DescribeInstanceTypes call per 100 types not yet cached; Assign,
// AssignCount and Unassign are one call each for any number of addresses.
//
// Errors carry the EC2 error code and message and wrap the cloud package's
// sentinels (PrivateIpAddressLimitExceeded -> cloud.ErrLimitExceeded,
// InsufficientFreeAddressesInSubnet -> cloud.ErrSubnetFull, throttling codes
// such as RequestLimitExceeded -> cloud.ErrThrottled, *.NotFound ->
// cloud.ErrNotFound). Throttled and 5xx attempts are retried by the SDK's
// standard retryer (retry.NewStandard), whose client-side token bucket caps
// retries during an outage; see Options.
//
// IAM: the Provider calls exactly the operations of ec2API (each needs the
// ec2: action of its name, CreateNetworkInterface also ec2:CreateTags);
// docs/cloud-aws.md has the policy, scoped by tag conditions, and
// TestIAMPolicyCoversProvider keeps it in step with ec2API.
package aws

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/egressip/egressip/internal/cloud"
)

// Batch sizes EC2 accepts in one call.
const (
	// maxFilterValues is EC2's limit on filter values per call.
	maxFilterValues = 200
	// maxInstanceTypes is DescribeInstanceTypes' limit on InstanceType.N.
	maxInstanceTypes = 100
	// pageSize is the MaxResults of paginated Describe calls (EC2 allows
	// 5..1000).
	pageSize = 1000
)

// Options tune a Provider. The zero value uses the SDK's defaults and no
// metrics.
type Options struct {
	// Registerer receives the EC2 call metrics (see Metrics); nil: none.
	Registerer prometheus.Registerer
	// MaxAttempts is the number of attempts per call, first one included;
	// 0 means the SDK's default (3).
	MaxAttempts int
	// MaxBackoff caps the jittered exponential delay between attempts; 0
	// means the SDK's default (20 s). Throttling errors back off from a 1 s
	// base, others from 50 ms, each capped by MaxBackoff.
	MaxBackoff time.Duration
	// RetryRateLimiter is the retryer's client-side retry quota; nil keeps
	// the SDK's token bucket (500 tokens, 5 per throttled retry, 14 per
	// other retry), ratelimit.None disables it.
	RetryRateLimiter retry.RateLimiter
}

// ec2API is every EC2 operation the Provider calls, each method named as
// the operation and its IAM action (ec2:<method name>); *ec2.Client
// implements it. Keeping the Provider to this interface is what lets
// TestIAMPolicyCoversProvider check the documented IAM policy against the
// code: add an operation here and the test demands it in the policy.
type ec2API interface {
	DescribeInstances(context.Context, *ec2.DescribeInstancesInput, ...func(*ec2.Options)) (*ec2.DescribeInstancesOutput, error)
	DescribeInstanceTypes(context.Context, *ec2.DescribeInstanceTypesInput, ...func(*ec2.Options)) (*ec2.DescribeInstanceTypesOutput, error)
	DescribeSubnets(context.Context, *ec2.DescribeSubnetsInput, ...func(*ec2.Options)) (*ec2.DescribeSubnetsOutput, error)
	DescribeNetworkInterfaces(context.Context, *ec2.DescribeNetworkInterfacesInput, ...func(*ec2.Options)) (*ec2.DescribeNetworkInterfacesOutput, error)
	DescribeAddresses(context.Context, *ec2.DescribeAddressesInput, ...func(*ec2.Options)) (*ec2.DescribeAddressesOutput, error)
	AssignPrivateIpAddresses(context.Context, *ec2.AssignPrivateIpAddressesInput, ...func(*ec2.Options)) (*ec2.AssignPrivateIpAddressesOutput, error)
	UnassignPrivateIpAddresses(context.Context, *ec2.UnassignPrivateIpAddressesInput, ...func(*ec2.Options)) (*ec2.UnassignPrivateIpAddressesOutput, error)
	// CreateNetworkInterface also needs ec2:CreateTags, since the call
	// carries the tags (TagSpecifications).
	CreateNetworkInterface(context.Context, *ec2.CreateNetworkInterfaceInput, ...func(*ec2.Options)) (*ec2.CreateNetworkInterfaceOutput, error)
	AttachNetworkInterface(context.Context, *ec2.AttachNetworkInterfaceInput, ...func(*ec2.Options)) (*ec2.AttachNetworkInterfaceOutput, error)
	ModifyNetworkInterfaceAttribute(context.Context, *ec2.ModifyNetworkInterfaceAttributeInput, ...func(*ec2.Options)) (*ec2.ModifyNetworkInterfaceAttributeOutput, error)
	DetachNetworkInterface(context.Context, *ec2.DetachNetworkInterfaceInput, ...func(*ec2.Options)) (*ec2.DetachNetworkInterfaceOutput, error)
	DeleteNetworkInterface(context.Context, *ec2.DeleteNetworkInterfaceInput, ...func(*ec2.Options)) (*ec2.DeleteNetworkInterfaceOutput, error)
	AssociateAddress(context.Context, *ec2.AssociateAddressInput, ...func(*ec2.Options)) (*ec2.AssociateAddressOutput, error)
	DisassociateAddress(context.Context, *ec2.DisassociateAddressInput, ...func(*ec2.Options)) (*ec2.DisassociateAddressOutput, error)
}

var _ ec2API = (*ec2.Client)(nil)

// Provider is the EC2 cloud.Provider. It is safe for concurrent use.
type Provider struct {
	client ec2API

	mu     sync.Mutex
	limits map[string]typeLimit // by instance type
}

// typeLimit is an instance type's network limits (DescribeInstanceTypes
// networkInfo).
type typeLimit struct {
	// perInterface is ipv4AddressesPerInterface, interfaces
	// maximumNetworkInterfaces.
	perInterface, interfaces int
}

var _ cloud.Provider = (*Provider)(nil)

// New returns a Provider using cfg (region, credentials, endpoint, HTTP
// client) with the retryer and metrics of opts; cfg's own Retryer is
// replaced by retry.NewStandard tuned by opts. It fails only when the
// metrics cannot be registered on opts.Registerer.
func New(cfg sdkaws.Config, opts Options) (*Provider, error) {
	var m *Metrics
	if opts.Registerer != nil {
		var err error
		if m, err = NewMetrics(opts.Registerer); err != nil {
			return nil, fmt.Errorf("register cloud metrics: %w", err)
		}
	}
	client := ec2.NewFromConfig(cfg, func(o *ec2.Options) {
		o.Retryer = retry.NewStandard(func(so *retry.StandardOptions) {
			if opts.MaxAttempts > 0 {
				so.MaxAttempts = opts.MaxAttempts
			}
			if opts.MaxBackoff > 0 {
				so.MaxBackoff = opts.MaxBackoff
			}
			if opts.RetryRateLimiter != nil {
				so.RateLimiter = opts.RetryRateLimiter
			}
		})
		o.HTTPClient = withOwnBody(o.HTTPClient)
		if m != nil {
			o.APIOptions = append(o.APIOptions, m.middleware)
		}
	})
	return &Provider{client: client, limits: map[string]typeLimit{}}, nil
}

// NewForEndpoint returns a Provider talking to an EC2-compatible endpoint
// (such as ec2emu's URL) in region with static credentials; for tests.
func NewForEndpoint(endpoint, region, accessKeyID, secretAccessKey string, opts Options) (*Provider, error) {
	cfg := sdkaws.Config{
		Region:       region,
		Credentials:  credentials.NewStaticCredentialsProvider(accessKeyID, secretAccessKey, ""),
		BaseEndpoint: sdkaws.String(endpoint),
	}
	return New(cfg, opts)
}

// instanceIDPattern matches EC2 instance IDs: "i-" and 8 or 17 lower-case
// hex digits.
var instanceIDPattern = regexp.MustCompile(`^i-([0-9a-f]{8}|[0-9a-f]{17})$`)

// ErrMalformedProviderID is wrapped by errors about spec.providerID values
// that are not "aws:///<zone>/<instance ID>".
var ErrMalformedProviderID = errors.New("malformed AWS providerID")

// ParseProviderID returns the availability zone and instance ID of a
// Node's spec.providerID, which the Kubernetes AWS cloud provider writes as
// "aws:///<availability zone>/<instance ID>" (the zone may be empty:
// "aws:////<instance ID>"). Anything else is an error wrapping
// ErrMalformedProviderID.
func ParseProviderID(providerID string) (zone, instanceID string, err error) {
	rest, ok := strings.CutPrefix(providerID, "aws:///")
	if !ok {
		return "", "", fmt.Errorf("%w %q: want aws:///<zone>/<instance ID>", ErrMalformedProviderID, providerID)
	}
	zone, instanceID, ok = strings.Cut(rest, "/")
	if !ok || strings.Contains(instanceID, "/") || !instanceIDPattern.MatchString(instanceID) {
		return "", "", fmt.Errorf("%w %q: want aws:///<zone>/i-<8 or 17 hex digits>", ErrMalformedProviderID, providerID)
	}
	return zone, instanceID, nil
}

// Interfaces implements cloud.Provider. Nodes whose providerID is malformed
// do not block the others: the result holds every well-formed Node found,
// and the error (non-nil alongside the map) joins one ErrMalformedProviderID
// error per malformed Node. Instances that are terminated, shutting down or
// unknown to EC2 are absent without error. Any EC2 failure returns a nil
// map.
func (p *Provider) Interfaces(ctx context.Context, providerIDs map[string]string) (map[string]cloud.Interface, error) {
	nodeOf := make(map[string][]string, len(providerIDs)) // instance -> Nodes
	var bad []error
	for node, pid := range providerIDs {
		_, id, err := ParseProviderID(pid)
		if err != nil {
			bad = append(bad, fmt.Errorf("node %s: %w", node, err))
			continue
		}
		nodeOf[id] = append(nodeOf[id], node)
	}
	ids := make([]string, 0, len(nodeOf))
	for id := range nodeOf {
		ids = append(ids, id)
	}
	slices.Sort(ids)

	var instances []types.Instance
	for chunk := range slices.Chunk(ids, maxFilterValues) {
		pages := ec2.NewDescribeInstancesPaginator(p.client, &ec2.DescribeInstancesInput{
			Filters:    []types.Filter{{Name: sdkaws.String("instance-id"), Values: chunk}},
			MaxResults: sdkaws.Int32(pageSize),
		})
		for pages.HasMorePages() {
			out, err := pages.NextPage(ctx)
			if err != nil {
				return nil, mapError("describe instances", err)
			}
			for _, r := range out.Reservations {
				instances = append(instances, r.Instances...)
			}
		}
	}

	var typeNames []string
	for _, in := range instances {
		typeNames = append(typeNames, string(in.InstanceType))
	}
	limits, err := p.typeLimits(ctx, typeNames)
	if err != nil {
		return nil, err
	}

	result := make(map[string]cloud.Interface, len(providerIDs))
	for _, in := range instances {
		if in.State != nil && (in.State.Name == types.InstanceStateNameTerminated || in.State.Name == types.InstanceStateNameShuttingDown) {
			continue
		}
		eni, ok := primaryInterface(in.NetworkInterfaces)
		if !ok {
			continue
		}
		lim := limits[string(in.InstanceType)] // zero if EC2 did not describe the type
		iface := cloud.Interface{
			InstanceID:    sdkaws.ToString(in.InstanceId),
			InstanceType:  string(in.InstanceType),
			ID:            sdkaws.ToString(eni.NetworkInterfaceId),
			MAC:           strings.ToLower(sdkaws.ToString(eni.MacAddress)),
			SubnetID:      sdkaws.ToString(eni.SubnetId),
			Limit:         lim.perInterface,
			MaxInterfaces: lim.interfaces,
			VPCID:         sdkaws.ToString(eni.VpcId),
			Others:        otherInterfaces(in),
		}
		if in.Placement != nil {
			iface.Zone = sdkaws.ToString(in.Placement.AvailabilityZone)
		}
		for _, g := range eni.Groups {
			iface.Groups = append(iface.Groups, sdkaws.ToString(g.GroupId))
		}
		for _, a := range eni.PrivateIpAddresses {
			if sdkaws.ToBool(a.Primary) {
				continue
			}
			if ip, err := netip.ParseAddr(sdkaws.ToString(a.PrivateIpAddress)); err == nil {
				iface.Secondary = append(iface.Secondary, ip)
			}
		}
		slices.SortFunc(iface.Secondary, netip.Addr.Compare)
		for _, node := range nodeOf[iface.InstanceID] {
			iface.Node = node
			result[node] = iface
		}
	}
	return result, errors.Join(bad...)
}

// primaryInterface returns the interface at device index 0 on network card
// 0 (instances with several network cards have one device 0 per card).
func primaryInterface(enis []types.InstanceNetworkInterface) (types.InstanceNetworkInterface, bool) {
	for _, e := range enis {
		if e.Attachment != nil && sdkaws.ToInt32(e.Attachment.DeviceIndex) == 0 && sdkaws.ToInt32(e.Attachment.NetworkCardIndex) == 0 {
			return e, true
		}
	}
	return types.InstanceNetworkInterface{}, false
}

// typeLimits returns the network limits of each named type, asking EC2
// only for the types not cached yet, in one call per 100.
func (p *Provider) typeLimits(ctx context.Context, names []string) (map[string]typeLimit, error) {
	out := map[string]typeLimit{}
	var missing []types.InstanceType
	p.mu.Lock()
	for _, n := range names {
		if l, ok := p.limits[n]; ok {
			out[n] = l
		} else if !slices.Contains(missing, types.InstanceType(n)) {
			missing = append(missing, types.InstanceType(n))
		}
	}
	p.mu.Unlock()
	slices.Sort(missing)
	for chunk := range slices.Chunk(missing, maxInstanceTypes) {
		pages := ec2.NewDescribeInstanceTypesPaginator(p.client, &ec2.DescribeInstanceTypesInput{InstanceTypes: chunk})
		for pages.HasMorePages() {
			res, err := pages.NextPage(ctx)
			if err != nil {
				return nil, mapError("describe instance types", err)
			}
			p.mu.Lock()
			for _, t := range res.InstanceTypes {
				if t.NetworkInfo == nil || t.NetworkInfo.Ipv4AddressesPerInterface == nil {
					continue
				}
				l := typeLimit{perInterface: int(*t.NetworkInfo.Ipv4AddressesPerInterface), interfaces: int(sdkaws.ToInt32(t.NetworkInfo.MaximumNetworkInterfaces))}
				p.limits[string(t.InstanceType)] = l
				out[string(t.InstanceType)] = l
			}
			p.mu.Unlock()
		}
	}
	return out, nil
}

// Assign implements cloud.Provider with one AssignPrivateIpAddresses call
// with AllowReassignment, so addresses attached elsewhere move here.
func (p *Provider) Assign(ctx context.Context, interfaceID string, ips []netip.Addr) error {
	if len(ips) == 0 {
		return nil
	}
	_, err := p.client.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{
		NetworkInterfaceId: sdkaws.String(interfaceID),
		PrivateIpAddresses: addrStrings(ips),
		AllowReassignment:  sdkaws.Bool(true),
	})
	return mapError("assign addresses to "+interfaceID, err)
}

// AssignCount implements cloud.Provider with one AssignPrivateIpAddresses
// call with SecondaryPrivateIpAddressCount; the addresses come back sorted.
func (p *Provider) AssignCount(ctx context.Context, interfaceID string, n int) ([]netip.Addr, error) {
	if n <= 0 {
		return nil, nil
	}
	out, err := p.client.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{
		NetworkInterfaceId:             sdkaws.String(interfaceID),
		SecondaryPrivateIpAddressCount: sdkaws.Int32(int32(n)),
	})
	if err != nil {
		return nil, mapError("assign addresses to "+interfaceID, err)
	}
	ips := make([]netip.Addr, 0, len(out.AssignedPrivateIpAddresses))
	for _, a := range out.AssignedPrivateIpAddresses {
		ip, err := netip.ParseAddr(sdkaws.ToString(a.PrivateIpAddress))
		if err != nil {
			return nil, fmt.Errorf("assign addresses to %s: EC2 returned %q: %w", interfaceID, sdkaws.ToString(a.PrivateIpAddress), err)
		}
		ips = append(ips, ip)
	}
	slices.SortFunc(ips, netip.Addr.Compare)
	return ips, nil
}

// Unassign implements cloud.Provider with one UnassignPrivateIpAddresses
// call.
func (p *Provider) Unassign(ctx context.Context, interfaceID string, ips []netip.Addr) error {
	if len(ips) == 0 {
		return nil
	}
	_, err := p.client.UnassignPrivateIpAddresses(ctx, &ec2.UnassignPrivateIpAddressesInput{
		NetworkInterfaceId: sdkaws.String(interfaceID),
		PrivateIpAddresses: addrStrings(ips),
	})
	return mapError("unassign addresses from "+interfaceID, err)
}

// Subnet is a subnet's address space and free-address count as EC2 reports
// them (the count lags assignments, like every Describe call).
type Subnet struct {
	ID   string
	CIDR netip.Prefix
	// Available is the number of addresses EC2 can still hand out.
	Available int
}

// Subnets returns the named subnets, keyed by ID, in one DescribeSubnets
// call per 200 IDs. An unknown ID is an error wrapping cloud.ErrNotFound.
func (p *Provider) Subnets(ctx context.Context, ids []string) (map[string]Subnet, error) {
	out := make(map[string]Subnet, len(ids))
	for chunk := range slices.Chunk(slices.Compact(slices.Sorted(slices.Values(ids))), maxFilterValues) {
		pages := ec2.NewDescribeSubnetsPaginator(p.client, &ec2.DescribeSubnetsInput{SubnetIds: chunk})
		for pages.HasMorePages() {
			res, err := pages.NextPage(ctx)
			if err != nil {
				return nil, mapError("describe subnets", err)
			}
			for _, s := range res.Subnets {
				cidr, err := netip.ParsePrefix(sdkaws.ToString(s.CidrBlock))
				if err != nil {
					return nil, fmt.Errorf("describe subnets: %s has CIDR %q: %w", sdkaws.ToString(s.SubnetId), sdkaws.ToString(s.CidrBlock), err)
				}
				out[sdkaws.ToString(s.SubnetId)] = Subnet{ID: sdkaws.ToString(s.SubnetId), CIDR: cidr, Available: int(sdkaws.ToInt32(s.AvailableIpAddressCount))}
			}
		}
	}
	return out, nil
}

// InterfaceAddresses returns the secondary addresses (sorted) of the named
// interfaces, keyed by interface ID, in one DescribeNetworkInterfaces call
// per 200 IDs; use it to re-read a few interfaces without a whole
// Interfaces pass. Unknown interfaces are absent, not an error.
func (p *Provider) InterfaceAddresses(ctx context.Context, interfaceIDs []string) (map[string][]netip.Addr, error) {
	out := make(map[string][]netip.Addr, len(interfaceIDs))
	for chunk := range slices.Chunk(slices.Compact(slices.Sorted(slices.Values(interfaceIDs))), maxFilterValues) {
		pages := ec2.NewDescribeNetworkInterfacesPaginator(p.client, &ec2.DescribeNetworkInterfacesInput{
			Filters:    []types.Filter{{Name: sdkaws.String("network-interface-id"), Values: chunk}},
			MaxResults: sdkaws.Int32(pageSize),
		})
		for pages.HasMorePages() {
			res, err := pages.NextPage(ctx)
			if err != nil {
				return nil, mapError("describe network interfaces", err)
			}
			for _, e := range res.NetworkInterfaces {
				ips := []netip.Addr{}
				for _, a := range e.PrivateIpAddresses {
					if ip, err := netip.ParseAddr(sdkaws.ToString(a.PrivateIpAddress)); err == nil && !sdkaws.ToBool(a.Primary) {
						ips = append(ips, ip)
					}
				}
				slices.SortFunc(ips, netip.Addr.Compare)
				out[sdkaws.ToString(e.NetworkInterfaceId)] = ips
			}
		}
	}
	return out, nil
}

func addrStrings(ips []netip.Addr) []string {
	out := make([]string, len(ips))
	for i, a := range ips {
		out[i] = a.String()
	}
	return out
}

// throttleCodes are the error codes the SDK's retryer treats as throttling
// (retry.DefaultThrottleErrorCodes); EC2 uses RequestLimitExceeded.
var throttleCodes = retry.DefaultThrottleErrorCodes

// mapError wraps an SDK error with what was being done and, for the codes
// the controller reacts to, a cloud sentinel; the SDK error (with the EC2
// code, message and request ID) stays in the chain and the text.
func mapError(doing string, err error) error {
	if err == nil {
		return nil
	}
	var ae smithy.APIError
	if !errors.As(err, &ae) {
		return fmt.Errorf("%s: %w", doing, err)
	}
	var sentinel error
	switch code := ae.ErrorCode(); {
	case code == "PrivateIpAddressLimitExceeded":
		sentinel = cloud.ErrLimitExceeded
	case code == "InsufficientFreeAddressesInSubnet":
		sentinel = cloud.ErrSubnetFull
	case code == "InvalidIPAddress.InUse":
		sentinel = cloud.ErrInUse
	case strings.HasSuffix(code, ".NotFound"):
		sentinel = cloud.ErrNotFound
	case code == "UnauthorizedOperation":
		sentinel = cloud.ErrUnauthorized
	case code == "AttachmentLimitExceeded":
		sentinel = cloud.ErrInterfaceLimit
	case code == "InvalidParameterCombination" || code == "InvalidParameterValue" || code == "InvalidNetworkInterface.InUse":
		sentinel = cloud.ErrInvalid
	default:
		if _, ok := throttleCodes[code]; ok {
			sentinel = cloud.ErrThrottled
		}
	}
	if sentinel == nil {
		return fmt.Errorf("%s: %w", doing, err)
	}
	var oe *smithy.OperationError
	if sentinel == cloud.ErrUnauthorized && errors.As(err, &oe) {
		// Name the exact IAM action the policy lacks.
		return fmt.Errorf("%s: %w: the IAM policy lacks ec2:%s: %w", doing, sentinel, oe.OperationName, err)
	}
	return fmt.Errorf("%s: %w: %w", doing, sentinel, err)
}
