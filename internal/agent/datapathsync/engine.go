package datapathsync

import (
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/egressip/egressip/internal/agent/datapath"
	"github.com/egressip/egressip/internal/agent/hoststack"
)

// Engine is the kernel datapath of one Node with the namespace handle it
// programs; Close releases both (the programmed datapath stays).
type Engine struct {
	*datapath.Datapath
	ns netns.NsHandle
}

// Close releases the engine's netlink handle and namespace handle.
func (e *Engine) Close() error {
	err := e.Datapath.Close()
	if e.ns.IsOpen() {
		err = errors.Join(err, e.ns.Close())
	}
	return err
}

// NewEngine opens the datapath engine (package datapath) in the network
// namespace at netnsPath (empty: the agent's own). When cfg names no
// uplink and no uplink MTU, the uplink is the interface of the route to
// 192.0.2.1 (TEST-NET-1, RFC 5737, so in practice the default route) or,
// without one, to 2001:db8::1 (RFC 3849). It fails when the namespace
// cannot be opened, no uplink is found, or datapath.New fails.
func NewEngine(netnsPath string, cfg datapath.Config) (*Engine, error) {
	ns := netns.None()
	if netnsPath != "" {
		h, err := netns.GetFromPath(netnsPath)
		if err != nil {
			return nil, fmt.Errorf("datapath: open network namespace %s: %w", netnsPath, err)
		}
		ns = h
	}
	fail := func(err error) (*Engine, error) {
		if ns.IsOpen() {
			_ = ns.Close()
		}
		return nil, err
	}
	if cfg.Uplink == "" && cfg.UplinkMTU == 0 {
		up, err := routeLink(ns)
		if err != nil {
			return fail(fmt.Errorf("datapath: find the uplink (set it with --datapath-uplink): %w", err))
		}
		cfg.Uplink = up
	}
	d, err := datapath.New(cfg, ns)
	if err != nil {
		return fail(fmt.Errorf("datapath: %w", err))
	}
	return &Engine{Datapath: d, ns: ns}, nil
}

// routeLink returns the name of the interface the main routing decision
// sends a global destination through, trying IPv4 and then IPv6.
func routeLink(ns netns.NsHandle) (string, error) {
	var (
		h   *netlink.Handle
		err error
	)
	if ns.IsOpen() {
		h, err = netlink.NewHandleAt(ns)
	} else {
		h, err = netlink.NewHandle()
	}
	if err != nil {
		return "", fmt.Errorf("open netlink: %w", err)
	}
	defer h.Close()
	var errs []error
	for _, dst := range []string{"192.0.2.1", "2001:db8::1"} {
		rs, err := h.RouteGet(net.ParseIP(dst))
		if err != nil || len(rs) == 0 {
			errs = append(errs, fmt.Errorf("route to %s: %w", dst, err))
			continue
		}
		l, err := h.LinkByIndex(rs[0].LinkIndex)
		if err != nil {
			errs = append(errs, fmt.Errorf("link of the route to %s: %w", dst, err))
			continue
		}
		return l.Attrs().Name, nil
	}
	return "", errors.Join(errs...)
}

// HostCheck is package hoststack's detector on a Node's namespace; Close
// releases both.
type HostCheck struct {
	*hoststack.Detector
	ns netns.NsHandle
}

// Close releases the detector and the namespace handle.
func (c *HostCheck) Close() error {
	err := c.Detector.Close()
	if c.ns.IsOpen() {
		err = errors.Join(err, c.ns.Close())
	}
	return err
}

// NewHostCheck opens the host stack check (package hoststack) in the
// network namespace at netnsPath (empty: the agent's own). It fails when
// the namespace or a netlink socket cannot be opened.
func NewHostCheck(netnsPath string) (*HostCheck, error) {
	ns := netns.None()
	if netnsPath != "" {
		h, err := netns.GetFromPath(netnsPath)
		if err != nil {
			return nil, fmt.Errorf("host stack check: open network namespace %s: %w", netnsPath, err)
		}
		ns = h
	}
	d, err := hoststack.NewDetector(ns)
	if err != nil {
		if ns.IsOpen() {
			_ = ns.Close()
		}
		return nil, err
	}
	return &HostCheck{Detector: d, ns: ns}, nil
}
