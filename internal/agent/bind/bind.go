// Package bind puts egress IPs on a Linux interface with netlink and takes
// them off again, touching only addresses it added itself.
//
// # Addresses
//
// Every egress IP is added as a host address (/32 or /128) with
// IFA_F_NOPREFIXROUTE, so the kernel installs no prefix route and the Node's
// routing is unchanged, and for IPv6 with IFA_F_NODAD, so the address is
// usable (not tentative) at once, and deprecated (preferred lifetime 0) so
// the Node never picks it as a source address. Before adding an IPv4 address the
// interface's net.ipv4.conf.<if>.promote_secondaries is set to 1, so deleting
// a primary address never deletes the secondaries of its subnet. The devconf
// is written with RTM_SETLINK (IFLA_INET_CONF) instead of /proc/sys: both
// reach the same value in the agent's (host) namespace, but container
// runtimes mount /proc/sys read-only unless the container is privileged,
// whereas netlink needs only CAP_NET_ADMIN.
//
// # Ownership
//
// The agent must know which addresses it added, across crashes and
// restarts, and never touch the others (the Node's own IPs, even inside a
// pool range, addresses added by hand or by another daemon). Two
// mechanisms keep that knowledge, chosen by Config.Ownership:
//
//   - the address protocol attribute IFA_PROTO, set to DefaultProto on the
//     address itself. The kernel keeps it since Linux 5.18 (commit
//     47f0bd503210, "net: Add new protocol attribute to IP addresses");
//     iproute2 shows and sets it as `proto` since 6.3. Older kernels
//     silently ignore it.
//   - the ownership record (record.go): a file on the Node listing every
//     address egressip added, written atomically before each add and
//     after each delete, tied to the kernel's boot and to the network
//     namespace.
//
// OwnershipAuto (the default) writes and honours both, so it works on
// every kernel from 4.18 on and migrates in either direction without
// unbinding anything; OwnershipProto uses the mark alone and fails with
// ErrOwnershipUnsupported where the kernel drops it (also keeping the
// record when one is configured); OwnershipRecord uses the record alone and
// neither writes nor reads IFA_PROTO, as on a kernel without it.
//
// vishvananda/netlink v1.3.1 has no field for IFA_PROTO (netlink.Addr has
// no Proto), so the package builds the RTM_NEWADDR / RTM_GETADDR messages it
// needs itself with the library's nl helpers (see rtnl.go), and uses the
// library for links and routes.
//
// The first address a Binder adds with the mark is read back. If the mark
// is missing, OwnershipAuto with a record goes on with the record alone;
// otherwise the address is deleted again and Bind fails with
// ErrOwnershipUnsupported, so an unmarked (and so unremovable) egress IP is
// never left behind.
package bind

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// DefaultProto is the IFA_PROTO value that marks addresses bound by egressip.
//
// The kernel defines IFAPROT_UNSPEC (0), IFAPROT_KERNEL_LO (1),
// IFAPROT_KERNEL_RA (2) and IFAPROT_KERNEL_LL (3) in linux/if_addr.h, which
// is also all that iproute2's rt_addrprotos names. Daemons that mark
// addresses tend to reuse their route protocol number (keepalived:
// RTPROT_KEEPALIVED, 18), so the value also avoids every RTPROT_* in
// linux/rtnetlink.h (0-4, 8-18, 42, 84, 99, 186-189, 192) and 255. 101 is
// ASCII 'e'. Config.Proto overrides it should a site already use 101.
const DefaultProto uint8 = 101

// Ownership selects how a Binder records which addresses are its own (see
// the package documentation).
type Ownership string

// Ownership modes.
const (
	// OwnershipAuto marks addresses with IFA_PROTO and, when
	// Config.RecordPath is set, records them too; an address is owned when
	// it carries the mark or is in the record.
	OwnershipAuto Ownership = "auto"
	// OwnershipProto relies on IFA_PROTO and fails with
	// ErrOwnershipUnsupported where the kernel drops it. A configured
	// record is kept too, so a later switch to OwnershipRecord adopts.
	OwnershipProto Ownership = "proto"
	// OwnershipRecord relies on the record alone (Config.RecordPath is
	// required) and neither writes nor reads IFA_PROTO, exactly as on a
	// kernel without it.
	OwnershipRecord Ownership = "record"
)

// ParseOwnership parses a mode name ("" is OwnershipAuto).
func ParseOwnership(s string) (Ownership, error) {
	switch o := Ownership(s); o {
	case "":
		return OwnershipAuto, nil
	case OwnershipAuto, OwnershipProto, OwnershipRecord:
		return o, nil
	}
	return "", fmt.Errorf("unknown address ownership mode %q: want auto, proto or record", s)
}

var (
	// ErrNotOwned is returned by Unbind for an address egressip did not add.
	ErrNotOwned = errors.New("address is not owned by egressip")
	// ErrForeignAddress is returned by Bind when the IP is already present
	// on the Node without egressip's mark; it is left untouched.
	ErrForeignAddress = errors.New("address already present on the node and not owned by egressip")
	// ErrOwnershipUnsupported is returned when the kernel drops IFA_PROTO
	// (Linux < 5.18) and no ownership record may stand in for it.
	ErrOwnershipUnsupported = errors.New("kernel does not keep the address protocol (IFA_PROTO, Linux 5.18+); " +
		"run the agent with --address-ownership=auto or record and an ownership record")
	// ErrRecordMissing is reported (Status) when the ownership record
	// disappeared after it listed addresses: those are left alone.
	ErrRecordMissing = errors.New("ownership record missing")
	// ErrInvalidIP is returned for addresses that cannot be egress IPs.
	ErrInvalidIP = errors.New("not a usable egress IP")
)

// Test hook points: where a test may stop the process (export_test.go).
const (
	hookBeforeRecord = "before-record" // about to write the record for an add
	hookRecorded     = "recorded"      // record written, address not yet added
	hookBound        = "bound"         // address added
	hookUnbound      = "unbound"       // address deleted, record not yet updated
	hookRecordRename = "record-rename" // temporary record file synced, not yet renamed
)

// testHook, when set (tests only), is called at each hook point.
var testHook func(point string, ip netip.Addr)

// testDropMark (tests only) leaves IFA_PROTO out of every RTM_NEWADDR that
// adds an address, which is what a kernel before 5.18 does with it.
var testDropMark bool

func hook(point string, ip netip.Addr) {
	if testHook != nil {
		testHook(point, ip)
	}
}

// Config configures a Binder.
type Config struct {
	// Interface, when set, is used for every IP whose Hint names none.
	Interface string
	// HintFor, when set, returns per-IP selection hints (typically from the
	// pool's subnetInfo). Its Interface overrides Config.Interface.
	HintFor func(netip.Addr) Hint
	// Proto overrides DefaultProto. Values 0-3 belong to the kernel.
	Proto uint8
	// Ownership is the ownership mode; "" means OwnershipAuto.
	Ownership Ownership
	// Lifetime is the valid lifetime every address is bound with, in
	// whole seconds (IFA_CACHEINFO); 0 means forever. A finite lifetime is
	// a dead-man switch: the kernel removes the address once it has not
	// been renewed (Renew) for that long, so an agent that is gone leaves
	// nothing answering for its egress IPs. See Renew for the kernel's
	// timing. It must be 0 or at least one second.
	Lifetime time.Duration
	// RecordPath is the absolute path of the ownership record; empty
	// means none (then OwnershipAuto behaves as OwnershipProto). Its
	// directory must exist (OwnershipAuto uses no record, see Status.Note,
	// when it does not); the Binder also creates RecordPath+".lock".
	RecordPath string
}

// Status is how ownership is kept and whether the record is healthy, as of
// the Binder's last operation.
type Status struct {
	// Mode is the configured mode.
	Mode Ownership
	// RecordPath is the record's path, empty when there is none (or it
	// is not used, see Note).
	RecordPath string
	// MarkDropped: the kernel was seen to drop IFA_PROTO (OwnershipAuto
	// then runs on the record alone).
	MarkDropped bool
	// Note, when set, says why the configured record is not used
	// (OwnershipAuto with its directory missing).
	Note string
	// Err is nil while ownership is known and recorded; else it wraps
	// ErrRecordUnreadable, ErrRecordUnwritable or ErrRecordMissing and
	// says what to do.
	Err error
}

// Bound is an address owned by egressip, as listed by the kernel.
type Bound struct {
	Addr      netip.Addr
	Interface string
	LinkIndex int
}

func (b Bound) String() string { return b.Addr.String() + "@" + b.Interface }

// Binder binds egress IPs in one network namespace. It is safe for concurrent
// use; mutations are serialised, also with other Binders (processes) sharing
// its ownership record.
type Binder struct {
	links LinkSource
	rt    *rtnl
	h     *netlink.Handle
	cfg   Config
	proto uint8
	// useMark: IFA_PROTO is written and read (every mode but record).
	useMark bool
	rec     *recordStore // nil without a record
	note    string       // why a configured record is not used

	mu          sync.Mutex
	verified    bool // the kernel was seen to keep IFA_PROTO
	markDropped bool // the kernel was seen to drop IFA_PROTO
	noRemark    bool // marking an address in place did not work: not tried again
	status      error
	lost        []recordEntry // listed by a record that disappeared, still present
}

// New returns a Binder working in network namespace ns; pass netns.None()
// for the namespace of the calling process (the agent runs in the host
// namespace). Sockets are opened in ns at once, so the caller may close ns
// afterwards. Close releases them. It fails for a reserved Proto, an
// unknown mode, OwnershipRecord without a RecordPath, or when the sockets
// cannot be opened; an unreadable record is no error here (see Status).
func New(ns netns.NsHandle, cfg Config) (*Binder, error) {
	proto := cfg.Proto
	if proto == 0 {
		proto = DefaultProto
	}
	if proto <= 3 {
		return nil, fmt.Errorf("address protocol %d is reserved for the kernel", proto)
	}
	mode, err := ParseOwnership(string(cfg.Ownership))
	if err != nil {
		return nil, err
	}
	cfg.Ownership = mode
	if cfg.Lifetime < 0 || cfg.Lifetime > 0 && (cfg.Lifetime < time.Second || cfg.Lifetime%time.Second != 0) {
		return nil, fmt.Errorf("address lifetime %v: want 0 (forever) or whole seconds (the kernel counts lifetimes in seconds)", cfg.Lifetime)
	}
	if mode == OwnershipRecord && cfg.RecordPath == "" {
		return nil, errors.New("address ownership mode record needs an ownership record path")
	}
	var rec *recordStore
	note := ""
	if cfg.RecordPath != "" {
		dir := filepath.Dir(cfg.RecordPath)
		if _, err := os.Stat(dir); mode == OwnershipAuto && errors.Is(err, fs.ErrNotExist) {
			// Degrade to the mark alone, as before records existed,
			// rather than bind nothing; where the kernel drops the mark
			// Bind then fails with ErrOwnershipUnsupported.
			note = fmt.Sprintf("ownership record directory %s does not exist: running on the IFA_PROTO mark alone "+
				"(mount the hostPath volume there to have the record)", dir)
		} else if rec, err = newRecordStore(cfg.RecordPath, ns); err != nil {
			return nil, err
		}
	}
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("open netlink handle: %w", err)
	}
	rt, err := newRTNL(ns)
	if err != nil {
		h.Close()
		return nil, err
	}
	return &Binder{links: h, h: h, rt: rt, cfg: cfg, proto: proto, useMark: mode != OwnershipRecord, rec: rec, note: note}, nil
}

// Close releases the Binder's netlink sockets. Bound addresses stay.
func (b *Binder) Close() {
	b.rt.Close()
	b.h.Close()
}

// Proto is the IFA_PROTO value this Binder marks and recognises.
func (b *Binder) Proto() uint8 { return b.proto }

// Status reports the ownership mode and the record's health as of the last
// operation.
func (b *Binder) Status() Status {
	b.mu.Lock()
	defer b.mu.Unlock()
	st := Status{Mode: b.cfg.Ownership, MarkDropped: b.markDropped, Note: b.note, Err: b.status}
	if b.rec != nil {
		st.RecordPath = b.cfg.RecordPath
	}
	return st
}

// txn is one operation's view of the record, held under its lock.
type txn struct {
	b       *Binder
	entries []recordEntry
	unlock  func()
}

// begin locks and reads the record (when there is one). Callers hold b.mu
// and call end.
func (b *Binder) begin() (*txn, error) {
	t := &txn{b: b}
	if b.rec == nil {
		return t, nil
	}
	unlock, err := b.rec.lock()
	if err != nil {
		b.status = err
		return nil, err
	}
	entries, res, err := b.rec.load()
	if err != nil {
		unlock()
		b.status = fmt.Errorf("%w; egressip binds and unbinds nothing on this Node until it is fixed, and removes no address because of it: "+
			"check which /32 and /128 addresses on the Node are egress IPs (status.egressNode of the Egresses), then fix or delete the file", err)
		return nil, b.status
	}
	if len(res.lost) > 0 {
		b.lost = append(b.lost, res.lost...)
	}
	t.entries, t.unlock = entries, unlock
	return t, nil
}

func (t *txn) end() {
	if t.unlock != nil {
		t.unlock()
	}
}

// owned tells whether a is egressip's: it carries the mark (unless the
// mark is not used) or the record lists it.
func (t *txn) owned(a kernelAddr) bool {
	if t.b.useMark && a.Proto == t.b.proto {
		return true
	}
	return slices.ContainsFunc(t.entries, func(e recordEntry) bool { return e.matches(a) })
}

func (t *txn) save(entries []recordEntry) error {
	if t.b.rec == nil {
		return nil
	}
	if err := t.b.rec.store(entries); err != nil {
		t.b.status = err
		return err
	}
	t.entries = entries
	return nil
}

// remember records a before it is added (write-ahead).
func (t *txn) remember(a kernelAddr, iface string) error {
	if t.b.rec == nil {
		return nil
	}
	e := recordEntry{IP: a.Addr, LinkIndex: a.LinkIndex, Interface: iface, PrefixLen: a.PrefixLen}
	if slices.ContainsFunc(t.entries, func(x recordEntry) bool { return x == e }) {
		return nil
	}
	return t.save(append(slices.Clone(t.entries), e))
}

// forget drops a from the record after it was deleted.
func (t *txn) forget(a kernelAddr) error {
	if t.b.rec == nil || !slices.ContainsFunc(t.entries, func(e recordEntry) bool { return e.matches(a) }) {
		return nil
	}
	return t.save(slices.DeleteFunc(slices.Clone(t.entries), func(e recordEntry) bool { return e.matches(a) }))
}

// tidy brings the record in line with the kernel: entries whose address is
// gone are dropped (a crash between record and add, or between delete and
// forget, left them), and marked addresses not yet listed are added (an
// agent without a record bound them), so that a switch to OwnershipRecord
// adopts them. Where the kernel keeps the mark, recorded addresses without
// it get it (record to mark migration, in place). It also keeps the list
// of addresses of a vanished record that are still present.
func (t *txn) tidy(present []kernelAddr) error {
	b := t.b
	b.lost = slices.DeleteFunc(b.lost, func(e recordEntry) bool {
		return !slices.ContainsFunc(present, e.matches) || slices.ContainsFunc(t.entries, func(x recordEntry) bool {
			return x.matches(kernelAddr{Addr: e.IP, LinkIndex: e.LinkIndex, PrefixLen: e.PrefixLen})
		})
	})
	if len(b.lost) > 0 {
		ss := make([]string, 0, len(b.lost))
		for _, e := range b.lost {
			ss = append(ss, fmt.Sprintf("%s/%d on %s", e.IP, e.PrefixLen, e.Interface))
		}
		b.status = fmt.Errorf("%w: %s was removed while it listed addresses; egressip no longer knows %s as its own and leaves them alone: "+
			"delete them by hand (ip address del ADDRESS dev INTERFACE) if no one else uses them", ErrRecordMissing, b.cfg.RecordPath, strings.Join(ss, ", "))
	}
	if b.rec == nil {
		return nil
	}
	next := slices.DeleteFunc(slices.Clone(t.entries), func(e recordEntry) bool {
		return !slices.ContainsFunc(present, e.matches)
	})
	if b.useMark {
		var names map[int]string
		for _, a := range present {
			if a.Proto != b.proto || slices.ContainsFunc(next, func(e recordEntry) bool { return e.matches(a) }) {
				continue
			}
			if names == nil {
				names = b.linkNames()
			}
			next = append(next, recordEntry{IP: a.Addr, LinkIndex: a.LinkIndex, Interface: names[a.LinkIndex], PrefixLen: a.PrefixLen})
		}
	}
	if len(next) != len(t.entries) || !slices.Equal(next, t.entries) {
		if err := t.save(next); err != nil {
			return err
		}
	}
	if b.useMark && !b.markDropped && !b.noRemark {
		for _, a := range present {
			if a.Proto != b.proto && slices.ContainsFunc(t.entries, func(e recordEntry) bool { return e.matches(a) }) {
				b.mark(a)
			}
		}
	}
	return nil
}

// mark sets the mark on an owned, recorded address in place (RTM_NEWADDR
// with NLM_F_REPLACE and the same flags and lifetimes). Best effort: the
// record keeps the address owned whether or not the kernel updates the
// attribute on replace.
func (b *Binder) mark(a kernelAddr) {
	want := b.egressAddr(a.Addr, a.LinkIndex, b.proto)
	if want.PrefixLen != a.PrefixLen {
		return
	}
	if err := b.rt.replaceAddr(want); err != nil {
		b.noRemark = true
		return
	}
	if got, ok := b.find(want); ok && got.Proto == b.proto {
		b.verified = true
		return
	}
	// The kernel drops the attribute, or does not update it on replace.
	b.noRemark = true
}

func (b *Binder) find(want kernelAddr) (kernelAddr, bool) {
	present, err := b.rt.listAddrs(familyOf(want.Addr))
	if err != nil {
		return kernelAddr{}, false
	}
	for _, a := range present {
		if a.Addr == want.Addr && a.LinkIndex == want.LinkIndex {
			return a, true
		}
	}
	return kernelAddr{}, false
}

func (b *Binder) linkNames() map[int]string {
	names := map[int]string{}
	if links, err := b.links.LinkList(); err == nil {
		for _, l := range links {
			names[l.Attrs().Index] = l.Attrs().Name
		}
	}
	return names
}
func normalize(ip netip.Addr) (netip.Addr, error) {
	ip = ip.Unmap()
	if !ip.IsValid() || ip.Zone() != "" || ip.IsUnspecified() || ip.IsLoopback() ||
		ip.IsMulticast() || ip.IsLinkLocalUnicast() || ip == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return netip.Addr{}, fmt.Errorf("%w: %q", ErrInvalidIP, ip)
	}
	return ip, nil
}

func (b *Binder) hint(ip netip.Addr) Hint {
	var h Hint
	if b.cfg.HintFor != nil {
		h = b.cfg.HintFor(ip)
	}
	if h.Interface == "" {
		h.Interface = b.cfg.Interface
	}
	return h
}

// Interface reports the interface Bind would choose for ip now.
func (b *Binder) Interface(ip netip.Addr) (string, error) {
	n, err := normalize(ip)
	if err != nil {
		return "", fmt.Errorf("find interface for %s: %w", ip, err)
	}
	l, err := SelectInterface(b.links, n, b.hint(n))
	if err != nil {
		return "", err
	}
	return l.Attrs().Name, nil
}

// lifetime is Config.Lifetime in seconds (0: forever).
func (b *Binder) lifetime() uint32 {
	return uint32(b.cfg.Lifetime / time.Second)
}

// egressAddr is hostAddr with the Binder's lifetime.
func (b *Binder) egressAddr(ip netip.Addr, linkIndex int, proto uint8) kernelAddr {
	a := hostAddr(ip, linkIndex, proto)
	a.Lifetime = b.lifetime()
	return a
}

func hostAddr(ip netip.Addr, linkIndex int, proto uint8) kernelAddr {
	a := kernelAddr{Addr: ip, LinkIndex: linkIndex, Proto: proto, Flags: unix.IFA_F_NOPREFIXROUTE, PrefixLen: 32, Scope: egressScope(ip)}
	if ip.Is6() {
		a.PrefixLen = 128
		a.Flags |= unix.IFA_F_NODAD
	}
	return a
}

// markValue is the IFA_PROTO value written on new addresses: none in
// OwnershipRecord.
func (b *Binder) markValue() uint8 {
	if b.useMark {
		return b.proto
	}
	return 0
}

// Bind makes sure ip is on the interface chosen for it, owned by egressip.
// changed is false when it already was. An owned copy of ip on another
// interface (the choice changed) is removed after the new one is added. A
// foreign address equal to ip makes Bind fail with ErrForeignAddress. With
// a record, the address is recorded before it is added; Bind fails with
// ErrRecordUnreadable or ErrRecordUnwritable, adding nothing, when the
// record cannot be read or written.
func (b *Binder) Bind(ip netip.Addr) (changed bool, err error) {
	ip, err = normalize(ip)
	if err != nil {
		return false, fmt.Errorf("bind: %w", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	t, err := b.begin()
	if err != nil {
		return false, fmt.Errorf("bind %s: %w", ip, err)
	}
	defer t.end()
	return b.bindLocked(t, ip)
}

func (b *Binder) bindLocked(t *txn, ip netip.Addr) (bool, error) {
	link, err := SelectInterface(b.links, ip, b.hint(ip))
	if err != nil {
		return false, fmt.Errorf("bind %s: %w", ip, err)
	}
	idx, name := link.Attrs().Index, link.Attrs().Name

	present, err := b.rt.listAddrs(familyOf(ip))
	if err != nil {
		return false, fmt.Errorf("bind %s: %w", ip, err)
	}
	onTarget := false
	var rescope *kernelAddr
	var elsewhere []kernelAddr
	for _, a := range present {
		if a.Addr != ip {
			continue
		}
		switch {
		case !t.owned(a):
			return false, fmt.Errorf("bind %s on %s: %w (found %s/%d on link %d, proto %d)",
				ip, name, ErrForeignAddress, a.Addr, a.PrefixLen, a.LinkIndex, a.Proto)
		case a.LinkIndex == idx:
			onTarget = true
			if a.Scope != egressScope(ip) {
				rescope = &a
			}
		default:
			elsewhere = append(elsewhere, a)
		}
	}

	changed := false
	if rescope != nil {
		if err := b.rebind(*rescope, b.egressAddr(ip, idx, b.markValue())); err != nil {
			return false, fmt.Errorf("bind %s on %s: %w", ip, name, err)
		}
		changed = true
	}
	if !onTarget {
		if ip.Is4() {
			if err := b.ensurePromoteSecondaries(idx); err != nil {
				return false, fmt.Errorf("bind %s on %s: %w", ip, name, err)
			}
		}
		want := b.egressAddr(ip, idx, b.markValue())
		hook(hookBeforeRecord, ip)
		if err := t.remember(want, name); err != nil {
			return false, fmt.Errorf("bind %s on %s: nothing added: %w", ip, name, err)
		}
		hook(hookRecorded, ip)
		sent := want
		if testDropMark {
			sent.Proto = 0
		}
		if err := b.rt.addAddr(sent); err != nil {
			return false, b.addFailed(t, want, name, err)
		}
		hook(hookBound, ip)
		changed = true
		if b.useMark && !b.verified && !b.markDropped {
			if err := b.verifyMark(t, want); err != nil {
				return false, fmt.Errorf("bind %s on %s: %w", ip, name, err)
			}
		}
	}
	for _, a := range elsewhere {
		if err := b.delOwned(t, a); err != nil {
			return changed, fmt.Errorf("bind %s on %s: remove owned copy from link %d: %w", ip, name, a.LinkIndex, err)
		}
		changed = true
	}
	return changed, nil
}

// egressScope is the scope an egress IP is bound with. IPv4: host
// (RT_SCOPE_HOST), so that the kernel never picks it as the source of the
// Node's own traffic: inet_select_addr takes, for a route of scope
// universe or link, the first primary address of the device whose scope
// is at most the route's, in list order, so a /32 egress IP listed before
// the Node's own /32 (the Node's address removed and re-added, as a DHCP
// renewal does) would otherwise become the source of everything routed
// through a gateway (issue 23). The scope does not change how the address
// is reached: it still has its local route, answers ARP (arp_process
// looks for a local route, whatever the scope) and serves as an explicit
// (SNAT) source. IPv6 keeps scope universe (the address is deprecated
// instead, see addAddr): an IPv6 host scope is ::1's and the Node must
// still answer Neighbor Solicitations for it.
func egressScope(ip netip.Addr) uint8 {
	if ip.Is4() {
		return unix.RT_SCOPE_HOST
	}
	return unix.RT_SCOPE_UNIVERSE
}

// rebind replaces an owned address bound with another scope (by an agent
// from before egressScope) by want: the kernel keeps the scope of an
// existing address on NLM_F_REPLACE, so it is deleted and added again (the
// address is absent for that one round trip; conntrack entries stay).
func (b *Binder) rebind(old, want kernelAddr) error {
	if err := b.del(old); err != nil {
		return fmt.Errorf("remove address of scope %d: %w", old.Scope, err)
	}
	if err := b.rt.addAddr(want); err != nil {
		return fmt.Errorf("add it again with scope %d: %w", want.Scope, err)
	}
	return nil
}

// addFailed withdraws the record entry of an address the kernel refused
// and says what happened.
func (b *Binder) addFailed(t *txn, want kernelAddr, name string, err error) error {
	ferr := t.forget(want)
	switch {
	case errors.Is(err, unix.ENODEV):
		err = fmt.Errorf("interface %s (index %d) disappeared while binding, nothing was added; "+
			"the next pass chooses an interface again (check `ip link`, or --interface and the pool's subnetInfo): %w", name, want.LinkIndex, err)
	case errors.Is(err, unix.EEXIST):
		err = fmt.Errorf("%w: it appeared while binding and is left alone: %w", ErrForeignAddress, err)
	}
	return errors.Join(fmt.Errorf("bind %s on %s: add address: %w", want.Addr, name, err), ferr)
}

// verifyMark reads the just-added address back. If the kernel dropped the
// mark, OwnershipAuto with a record goes on with the record; otherwise the
// address is removed again (it was created by us, NLM_F_EXCL).
func (b *Binder) verifyMark(t *txn, want kernelAddr) error {
	got, ok := b.find(want)
	if !ok {
		return errors.New("address vanished right after it was added")
	}
	if got.Proto == b.proto {
		b.verified = true
		return nil
	}
	if b.cfg.Ownership == OwnershipAuto && b.rec != nil {
		b.markDropped = true
		return nil
	}
	if err := b.rt.delAddr(want); err != nil {
		return fmt.Errorf("%w; removing the unmarked address failed too: %v", ErrOwnershipUnsupported, err)
	}
	_ = t.forget(want)
	return ErrOwnershipUnsupported
}

func (b *Binder) ensurePromoteSecondaries(idx int) error {
	on, err := b.rt.promoteSecondaries(idx)
	if err != nil {
		return fmt.Errorf("read promote_secondaries: %w", err)
	}
	if on {
		return nil
	}
	if err := b.rt.setPromoteSecondaries(idx); err != nil {
		return fmt.Errorf("set promote_secondaries: %w", err)
	}
	return nil
}

func (b *Binder) del(a kernelAddr) error {
	err := b.rt.delAddr(a)
	if errors.Is(err, unix.EADDRNOTAVAIL) || errors.Is(err, unix.ENODEV) {
		return nil // already gone
	}
	return err
}

// delOwned deletes an owned address, then forgets it.
func (b *Binder) delOwned(t *txn, a kernelAddr) error {
	if err := b.del(a); err != nil {
		return err
	}
	hook(hookUnbound, a.Addr)
	return t.forget(a)
}

// Unbind removes ip if egressip owns it (on whichever interface). It is a
// no-op when ip is not present and fails with ErrNotOwned, removing nothing,
// when ip is present but not owned, and with ErrRecordUnreadable, removing
// nothing, while the record cannot be read.
func (b *Binder) Unbind(ip netip.Addr) error {
	ip, err := normalize(ip)
	if err != nil {
		return fmt.Errorf("unbind: %w", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	t, err := b.begin()
	if err != nil {
		return fmt.Errorf("unbind %s: %w", ip, err)
	}
	defer t.end()
	present, err := b.rt.listAddrs(familyOf(ip))
	if err != nil {
		return fmt.Errorf("unbind %s: %w", ip, err)
	}
	return b.unbindLocked(t, ip, present)
}

func (b *Binder) unbindLocked(t *txn, ip netip.Addr, present []kernelAddr) error {
	found, owned := false, false
	var errs []error
	for _, a := range present {
		if a.Addr != ip {
			continue
		}
		found = true
		if !t.owned(a) {
			continue
		}
		owned = true
		if err := b.delOwned(t, a); err != nil {
			errs = append(errs, fmt.Errorf("unbind %s from link %d: %w", ip, a.LinkIndex, err))
		}
	}
	if found && !owned {
		return fmt.Errorf("unbind %s: %w", ip, ErrNotOwned)
	}
	return errors.Join(errs...)
}

// Owned lists the addresses egressip owns, read from the kernel (and the
// record), sorted by address then interface. While the record is unreadable
// it returns the marked addresses alone (none in OwnershipRecord) with an
// error wrapping ErrRecordUnreadable.
func (b *Binder) Owned() ([]Bound, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	present, err := b.rt.listAddrs(unix.AF_UNSPEC)
	if err != nil {
		return nil, fmt.Errorf("list owned addresses: %w", err)
	}
	t, terr := b.begin()
	if terr != nil {
		t = &txn{b: b} // the mark alone
	}
	defer t.end()
	out, err := b.owned(t, present)
	if err == nil && terr != nil {
		err = fmt.Errorf("list owned addresses: %w", terr)
	}
	return out, err
}

func (b *Binder) owned(t *txn, present []kernelAddr) ([]Bound, error) {
	var out []Bound
	var names map[int]string
	for _, a := range present {
		if !t.owned(a) {
			continue
		}
		if names == nil {
			links, err := b.links.LinkList()
			if err != nil {
				return nil, fmt.Errorf("list owned addresses: list links: %w", err)
			}
			names = make(map[int]string, len(links))
			for _, l := range links {
				names[l.Attrs().Index] = l.Attrs().Name
			}
		}
		out = append(out, Bound{Addr: a.Addr, Interface: names[a.LinkIndex], LinkIndex: a.LinkIndex})
	}
	slices.SortFunc(out, func(x, y Bound) int {
		if c := x.Addr.Compare(y.Addr); c != 0 {
			return c
		}
		return x.LinkIndex - y.LinkIndex
	})
	return out, nil
}

// Sync makes the owned addresses equal to desired: the record is first
// brought in line with the kernel (see tidy), then owned addresses that are
// not desired are removed (release before acquire), then every desired IP
// is bound. Addresses not owned by egressip and routes are never touched.
// added lists the desired IPs that Bind changed (new, or moved to another
// interface), removed the owned IPs taken off. Errors for single IPs do not
// stop the others; they are joined. An unreadable record stops it all
// (ErrRecordUnreadable): nothing is bound or removed.
func (b *Binder) Sync(desired []netip.Addr) (added, removed []netip.Addr, err error) {
	want := make(map[netip.Addr]bool, len(desired))
	var errs []error
	for _, ip := range desired {
		n, err := normalize(ip)
		if err != nil {
			errs = append(errs, fmt.Errorf("sync: %w", err))
			continue
		}
		want[n] = true
	}

	b.mu.Lock()
	defer b.mu.Unlock()
	b.status = nil // a pass of its own: Status reports this one
	t, err := b.begin()
	if err != nil {
		return nil, nil, fmt.Errorf("sync: %w", err)
	}
	defer t.end()

	present, err := b.rt.listAddrs(unix.AF_UNSPEC)
	if err != nil {
		return nil, nil, fmt.Errorf("sync: %w", err)
	}
	if err := t.tidy(present); err != nil {
		errs = append(errs, fmt.Errorf("sync: %w", err))
	}
	stale := map[netip.Addr]bool{}
	for _, a := range present {
		if t.owned(a) && !want[a.Addr] {
			stale[a.Addr] = true
		}
	}
	for _, ip := range sortedKeys(stale) {
		if err := b.unbindLocked(t, ip, present); err != nil {
			errs = append(errs, fmt.Errorf("sync: %w", err))
			continue
		}
		removed = append(removed, ip)
	}
	for _, ip := range sortedKeys(want) {
		changed, err := b.bindLocked(t, ip)
		if err != nil {
			errs = append(errs, fmt.Errorf("sync: %w", err))
		}
		if changed {
			added = append(added, ip)
		}
	}
	return added, removed, errors.Join(errs...)
}

// Renew resets the valid lifetime of every address egressip owns to
// Config.Lifetime (RTM_NEWADDR with NLM_F_REPLACE and without
// NLM_F_CREATE, so an address that expired meanwhile is not re-added here:
// binding is Sync's job). With Lifetime 0 it makes owned addresses with a
// finite lifetime (left by an agent run with one) permanent, and leaves
// the others alone. It returns the owned addresses it renewed and an error
// joining the failures; an address that vanished between the dump and
// the replace is no error but is not listed.
//
// The replace keeps what identifies the address: IFA_PROTO is sent as the
// kernel holds it (the kernel overwrites the mark with what a replace
// carries), the scope, prefix length and flags as bound; the kernel keeps
// an existing address's scope and, for IPv6, applies the flags and the
// preferred lifetime 0 sent again. No RTM_DELADDR is sent and the address
// never leaves the interface.
//
// Timing (IPv4, net/ipv4/devinet.c check_lifetime): expiry is checked by
// a delayed work that is rescheduled for the next expiry, rounded up to
// the second and at least a second ahead (ADDRCONF_TIMER_FUZZ_MAX); each
// replace also runs it at once. An address not renewed for L seconds is
// removed L to about L+1 s after the last renewal. IPv6
// (net/ipv6/addrconf.c addrconf_verify) behaves alike.
func (b *Binder) Renew() ([]netip.Addr, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	t, err := b.begin()
	if err != nil {
		return nil, fmt.Errorf("renew: %w", err)
	}
	defer t.end()
	present, err := b.rt.listAddrs(unix.AF_UNSPEC)
	if err != nil {
		return nil, fmt.Errorf("renew: %w", err)
	}
	lt := b.lifetime()
	var renewed []netip.Addr
	var errs []error
	for _, a := range present {
		if !t.owned(a) || lt == 0 && a.Valid == infiniteLifetime {
			continue
		}
		want := hostAddr(a.Addr, a.LinkIndex, a.Proto)
		want.PrefixLen, want.Scope, want.Lifetime = a.PrefixLen, a.Scope, lt
		if err := b.rt.replaceAddr(want); err != nil {
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EADDRNOTAVAIL) || errors.Is(err, unix.ENODEV) {
				continue // expired or removed meanwhile
			}
			errs = append(errs, fmt.Errorf("renew %s on link %d: %w", a.Addr, a.LinkIndex, err))
			continue
		}
		renewed = append(renewed, a.Addr)
	}
	return renewed, errors.Join(errs...)
}

func sortedKeys(m map[netip.Addr]bool) []netip.Addr {
	out := make([]netip.Addr, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}
