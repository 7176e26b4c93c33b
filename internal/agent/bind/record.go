package bind

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The ownership record is the fallback for kernels that do not keep
// IFA_PROTO (before Linux 5.18), and the bridge between the two modes: a
// small JSON file on the Node listing every address egressip added, written
// ahead of each add and after each delete. See docs/agent.md, "Ownership".

// recordVersion is the format version of the ownership record.
const recordVersion = 1

// bootIDPath holds a random UUID the kernel draws at every boot
// (Documentation/admin-guide/sysctl/kernel.rst, "random"). A record written
// in another boot describes addresses that are gone with that boot.
const bootIDPath = "/proc/sys/kernel/random/boot_id"

var (
	// ErrRecordUnreadable is returned, and nothing is bound or unbound,
	// while the ownership record cannot be read or parsed. Addresses are
	// never removed because of it.
	ErrRecordUnreadable = errors.New("ownership record unreadable")
	// ErrRecordUnwritable is returned by Bind and Unbind when the ownership
	// record cannot be written; the address is then left as it was.
	ErrRecordUnwritable = errors.New("ownership record cannot be written")
)

// recordEntry is one address egressip added (or is about to add). An
// address on the Node is egressip's by the record when IP, link index and
// prefix length all match.
type recordEntry struct {
	IP        netip.Addr `json:"ip"`
	LinkIndex int        `json:"linkIndex"`
	Interface string     `json:"interface"`
	PrefixLen int        `json:"prefixLen"`
}

func (e recordEntry) matches(a kernelAddr) bool {
	return e.IP == a.Addr && e.LinkIndex == a.LinkIndex && e.PrefixLen == a.PrefixLen
}

// recordFile is the on-disk form.
type recordFile struct {
	// Version is recordVersion.
	Version int `json:"version"`
	// BootID is the kernel's boot_id when the record was written.
	BootID string `json:"bootID"`
	// NetNS identifies the network namespace the addresses live in
	// (device and inode of its nsfs file).
	NetNS string `json:"netns"`
	// Addresses are the owned addresses, sorted.
	Addresses []recordEntry `json:"addresses"`
}

// recordStore reads and writes the record at path. Every Binder operation
// holds an exclusive flock(2) on path+".lock" from reading the record to its
// last write, so two agents of one Node (a surge rolling update) sharing
// the record never interleave.
type recordStore struct {
	path   string
	bootID string
	netns  string

	// last are the entries last read or written by this store; when the
	// file is missing afterwards, they are what was lost.
	last []recordEntry
}

func newRecordStore(path string, ns netns.NsHandle) (*recordStore, error) {
	if path == "" || !filepath.IsAbs(path) {
		return nil, fmt.Errorf("ownership record path %q is not absolute", path)
	}
	boot, err := os.ReadFile(bootIDPath)
	if err != nil {
		return nil, fmt.Errorf("read boot id: %w", err)
	}
	id, err := netnsID(ns)
	if err != nil {
		return nil, err
	}
	return &recordStore{path: path, bootID: strings.TrimSpace(string(boot)), netns: id}, nil
}

// netnsID is the device:inode of the namespace's nsfs file.
func netnsID(ns netns.NsHandle) (string, error) {
	h := ns
	if !ns.IsOpen() {
		cur, err := netns.Get()
		if err != nil {
			return "", fmt.Errorf("identify network namespace: %w", err)
		}
		defer func() { _ = cur.Close() }()
		h = cur
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(h), &st); err != nil {
		return "", fmt.Errorf("identify network namespace: %w", err)
	}
	return fmt.Sprintf("%d:%d", st.Dev, st.Ino), nil
}

// lock takes the cross-process lock; the returned func releases it.
func (s *recordStore) lock() (func(), error) {
	f, err := os.OpenFile(s.path+".lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w (is the record's directory, a hostPath volume, mounted read-write?)", ErrRecordUnreadable, s.path, err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("%w: lock %s: %w", ErrRecordUnreadable, f.Name(), err)
	}
	return func() { _ = f.Close() }, nil // closing releases the flock
}

// loadResult is what load found besides the entries.
type loadResult struct {
	// note, when set, says why the file's entries were not used although
	// it exists (written in another boot).
	note string
	// lost are the entries of a record that was read or written with
	// entries before and is missing now.
	lost []recordEntry
}

// load reads the record. A missing file is an empty record. A record from
// another boot is an empty record (note says so). A file that cannot be
// read or parsed, or that belongs to another network namespace in this
// boot, is ErrRecordUnreadable.
func (s *recordStore) load() ([]recordEntry, loadResult, error) {
	var res loadResult
	raw, err := os.ReadFile(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		res.lost, s.last = s.last, nil
		return nil, res, nil
	}
	if err != nil {
		return nil, res, fmt.Errorf("%w: %s: %w", ErrRecordUnreadable, s.path, err)
	}
	// Unknown fields are ignored, so an agent rolled back during a surge
	// update reads the record of a newer one; incompatible changes bump
	// the version instead.
	var f recordFile
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, res, fmt.Errorf("%w: %s is corrupt: %w", ErrRecordUnreadable, s.path, err)
	}
	if f.Version != recordVersion {
		return nil, res, fmt.Errorf("%w: %s has version %d, this agent reads version %d", ErrRecordUnreadable, s.path, f.Version, recordVersion)
	}
	if f.BootID != s.bootID {
		res.note = fmt.Sprintf("ownership record %s was written before the last reboot (boot %s); its %d entries are void", s.path, f.BootID, len(f.Addresses))
		return nil, res, nil
	}
	if f.NetNS != s.netns {
		return nil, res, fmt.Errorf("%w: %s belongs to network namespace %s, not this one (%s): give each agent its own record path",
			ErrRecordUnreadable, s.path, f.NetNS, s.netns)
	}
	for _, e := range f.Addresses {
		if !e.IP.IsValid() || e.LinkIndex <= 0 || e.PrefixLen <= 0 || e.PrefixLen > e.IP.BitLen() {
			return nil, res, fmt.Errorf("%w: %s is corrupt: bad entry %+v", ErrRecordUnreadable, s.path, e)
		}
	}
	s.last = f.Addresses
	return f.Addresses, res, nil
}

// store replaces the record atomically and durably: write a temporary file
// in the same directory, fsync it, rename it over the record, fsync the
// directory (rename(2) is atomic; the directory fsync makes the new name
// survive a power loss).
func (s *recordStore) store(entries []recordEntry) error {
	entries = slices.Clone(entries)
	slices.SortFunc(entries, func(x, y recordEntry) int {
		if c := x.IP.Compare(y.IP); c != 0 {
			return c
		}
		return x.LinkIndex - y.LinkIndex
	})
	if entries == nil {
		entries = []recordEntry{}
	}
	raw, err := json.MarshalIndent(recordFile{Version: recordVersion, BootID: s.bootID, NetNS: s.netns, Addresses: entries}, "", "  ")
	if err != nil {
		return fmt.Errorf("%w: %w", ErrRecordUnwritable, err)
	}
	dir := filepath.Dir(s.path)
	fail := func(err error) error {
		return fmt.Errorf("%w: %s: %w (is the record's directory, a hostPath volume, mounted read-write and not full?)", ErrRecordUnwritable, s.path, err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(s.path)+".tmp-*")
	if err != nil {
		return fail(err)
	}
	tmpName := tmp.Name()
	defer func() { _ = os.Remove(tmpName) }() // a no-op after the rename
	if _, err := tmp.Write(append(raw, '\n')); err != nil {
		_ = tmp.Close()
		return fail(err)
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return fail(err)
	}
	if err := tmp.Close(); err != nil {
		return fail(err)
	}
	hook(hookRecordRename, netip.Addr{})
	if err := os.Rename(tmpName, s.path); err != nil {
		return fail(err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fail(err)
	}
	defer func() { _ = d.Close() }()
	if err := d.Sync(); err != nil {
		return fail(err)
	}
	s.last = entries
	return nil
}
