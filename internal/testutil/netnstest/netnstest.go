// Package netnstest creates and removes throw-away network namespaces for
// the root-only tests and harnesses of egressip: the agent's package tests
// (a "node" and a "peer" namespace joined by a veth pair), cmd/agent's
// tests, test/datapath's cluster of namespaces and test/e2e's harness.
//
// It holds what those share: a random name prefix per run (so concurrent
// runs never collide), creating a namespace with lo up and IPv6 DAD off,
// veth pairs between namespaces, running a function or starting a command
// inside a namespace, and deleting a namespace, or every namespace of a
// prefix with the processes left in them. The functions that take a
// testing.TB fail the test on error and register the removal with
// t.Cleanup; the others return errors, for harnesses that also run outside
// a test (`make demo`). Nothing it creates is connected to the host's
// network unless a caller does so.
package netnstest

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// RequireRoot skips the test when not running as root (CI runs as root).
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces, veth links and raw sockets")
	}
}

// NS is a named network namespace (under /run/netns) and an open handle
// to it. Handle may be netns.None() (-1) for an NS driven only through
// ip(8); the zero value 0 is not "none" (it is file descriptor 0).
type NS struct {
	Name   string
	Path   string
	Handle netns.NsHandle
}

// randomHex returns 2n random hexadecimal digits.
func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return hex.EncodeToString(b)
}

// Prefix returns tag-<8 random hex digits>-, the name prefix of one run's
// namespaces: runs of the same tests at the same time never collide, and
// DeletePrefix removes what one run left behind. Namespace names are
// limited only by the file system, but interface names derived from them
// are not: keep tags short.
func Prefix(tag string) string {
	return tag + "-" + randomHex(4) + "-"
}

// Create adds namespace name (`ip netns add`), opens it, sets lo up and
// turns IPv6 duplicate address detection off (so test addresses are usable
// at once). On any error it deletes what it created and returns the error.
func Create(name string) (*NS, error) {
	if err := Add(name); err != nil {
		return nil, err
	}
	n, err := Open(name)
	if err != nil {
		_ = Remove(name)
		return nil, err
	}
	if err := n.setup(); err != nil {
		_ = n.Delete()
		return nil, err
	}
	return n, nil
}

func (n *NS) setup() error {
	if _, err := n.IP("link", "set", "lo", "up"); err != nil {
		return err
	}
	for _, key := range []string{"net/ipv6/conf/all/accept_dad", "net/ipv6/conf/default/accept_dad"} {
		if err := n.WriteSysctl(key, "0"); err != nil {
			return err
		}
	}
	return nil
}

// Add adds namespace name (`ip netns add`) and nothing else: lo stays
// down and sysctls keep the kernel's defaults (Create does more).
func Add(name string) error {
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns add %s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Remove deletes namespace name (`ip netns del`), which removes its
// interfaces, veth pairs included; processes still in it keep it alive
// until they exit (DeletePrefix kills them).
func Remove(name string) error {
	if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns del %s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Open opens the existing namespace name; the caller closes it (Close) or
// deletes it (Delete).
func Open(name string) (*NS, error) {
	path := filepath.Join("/run/netns", name)
	h, err := netns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("open namespace %s: %w", name, err)
	}
	return &NS{Name: name, Path: path, Handle: h}, nil
}

// Close closes the handle; the namespace stays.
func (n *NS) Close() error {
	if !n.Handle.IsOpen() {
		return nil
	}
	err := n.Handle.Close()
	n.Handle = netns.None()
	return err
}

// Delete closes the handle and deletes the namespace (Remove).
func (n *NS) Delete() error {
	_ = n.Close()
	return Remove(n.Name)
}

// NewNS creates namespace egt-<random>-<role> (Create) and deletes it in
// t.Cleanup; it skips the test without root and fails it on error.
func NewNS(t testing.TB, role string) *NS {
	t.Helper()
	RequireRoot(t)
	n, err := Create(Prefix("egt") + role)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Delete(); err != nil {
			t.Error(err)
		}
	})
	return n
}

// IP runs `ip -n <ns> args...` and returns its combined output.
func (n *NS) IP(args ...string) (string, error) {
	out, err := exec.Command("ip", append([]string{"-n", n.Name}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ip -n %s %s: %w: %s", n.Name, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// MustIP is IP that fails the test on error.
func (n *NS) MustIP(t testing.TB, args ...string) string {
	t.Helper()
	out, err := n.IP(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Do runs fn on an OS thread switched into the namespace and returns fn's
// error, or the error of switching. The thread is locked and discarded
// afterwards (the goroutine exits still locked, and the Go runtime then
// ends the thread), so no other goroutine ever runs in the wrong namespace:
// setns(2) changes only the calling thread. Sockets opened by fn stay in
// the namespace and may be used from any goroutine later.
func (n *NS) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// Deliberately no UnlockOSThread: the runtime ends this thread.
		if err := netns.Set(n.Handle); err != nil {
			errc <- fmt.Errorf("setns %s: %w", n.Name, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// DoIn opens namespace name, runs fn in it (Do) and closes it again.
func DoIn(name string, fn func() error) error {
	n, err := Open(name)
	if err != nil {
		return err
	}
	defer func() { _ = n.Close() }()
	return n.Do(fn)
}

// Start starts cmd from a thread switched into the namespace (Do), so the
// process runs in it; unlike `ip netns exec` it gets no private mount
// namespace, so the namespaces it adds are visible to everyone. cmd must
// not set SysProcAttr.Pdeathsig: the kernel would send it when the
// starting thread ends, which is at once.
func (n *NS) Start(cmd *exec.Cmd) error {
	if cmd.SysProcAttr != nil && cmd.SysProcAttr.Pdeathsig != 0 {
		return errors.New("netnstest: Start with Pdeathsig: the starting thread ends at once")
	}
	return n.Do(cmd.Start)
}

// WriteSysctl writes /proc/sys/<key> inside the namespace.
func (n *NS) WriteSysctl(key, value string) error {
	if err := n.Do(func() error {
		return os.WriteFile(filepath.Join("/proc/sys", key), []byte(value), 0o644)
	}); err != nil {
		return fmt.Errorf("sysctl %s=%s in %s: %w", key, value, n.Name, err)
	}
	return nil
}

// Sysctl is WriteSysctl that fails the test on error.
func (n *NS) Sysctl(t testing.TB, key, value string) {
	t.Helper()
	if err := n.WriteSysctl(key, value); err != nil {
		t.Fatal(err)
	}
}

// ReadSysctl reads /proc/sys/<key> inside the namespace.
func (n *NS) ReadSysctl(t testing.TB, key string) string {
	t.Helper()
	var v []byte
	if err := n.Do(func() (err error) {
		v, err = os.ReadFile(filepath.Join("/proc/sys", key))
		return err
	}); err != nil {
		t.Fatalf("read sysctl %s in %s: %v", key, n.Name, err)
	}
	return strings.TrimSpace(string(v))
}

// OpenNetlink returns a netlink handle in the namespace; the caller closes
// it.
func (n *NS) OpenNetlink() (*netlink.Handle, error) {
	h, err := netlink.NewHandleAt(n.Handle)
	if err != nil {
		return nil, fmt.Errorf("netlink handle in %s: %w", n.Name, err)
	}
	return h, nil
}

// Netlink is OpenNetlink that fails the test on error and closes the
// handle in t.Cleanup.
func (n *NS) Netlink(t testing.TB) *netlink.Handle {
	t.Helper()
	h, err := n.OpenNetlink()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

// LinkInterface returns the net.Interface (index, MAC) of link name in the
// namespace.
func (n *NS) LinkInterface(name string) (*net.Interface, error) {
	var ifi *net.Interface
	if err := n.Do(func() (err error) {
		ifi, err = net.InterfaceByName(name)
		return err
	}); err != nil {
		return nil, fmt.Errorf("interface %s in %s: %w", name, n.Name, err)
	}
	return ifi, nil
}

// Interface is LinkInterface that fails the test on error.
func (n *NS) Interface(t testing.TB, name string) *net.Interface {
	t.Helper()
	ifi, err := n.LinkInterface(name)
	if err != nil {
		t.Fatal(err)
	}
	return ifi
}

// Veth creates a veth pair: aIf in namespace a and bIf in namespace b,
// where "" is the caller's own namespace. Both ends are left down and
// without addresses (callers attach them to a bridge or address them
// first). Deleting either namespace removes the pair.
func Veth(a, aIf, b, bIf string) error {
	args := []string{"link", "add", aIf, "type", "veth", "peer", "name", bIf}
	if b != "" {
		args = append(args, "netns", b)
	}
	if a != "" {
		args = append([]string{"-n", a}, args...)
	}
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Pair is a node namespace and a peer namespace joined by a veth pair.
type Pair struct {
	Node, Peer     *NS
	NodeIf, PeerIf string
}

// NewPair creates the two namespaces (NewNS) and the veth pair NodeIf <->
// PeerIf, both up and without addresses.
func NewPair(t testing.TB) *Pair {
	t.Helper()
	p := &Pair{Node: NewNS(t, "node"), Peer: NewNS(t, "peer"), NodeIf: "node0", PeerIf: "peer0"}
	if err := Veth(p.Node.Name, p.NodeIf, p.Peer.Name, p.PeerIf); err != nil {
		t.Fatal(err)
	}
	p.Node.MustIP(t, "link", "set", p.NodeIf, "up")
	p.Peer.MustIP(t, "link", "set", p.PeerIf, "up")
	return p
}

// DeletePrefix kills every process inside, then deletes, every network
// namespace whose name starts with prefix (left over from an interrupted
// run, or at the end of one). Killing by namespace also catches processes
// that left the run's process group. The calling process is never killed.
// It returns the errors of the deletions.
func DeletePrefix(prefix string) error {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return fmt.Errorf("ip netns list: %w", err)
	}
	var errs []error
	for line := range strings.SplitSeq(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], prefix) {
			continue
		}
		if pids, err := exec.Command("ip", "netns", "pids", f[0]).Output(); err == nil {
			for p := range strings.FieldsSeq(string(pids)) {
				if pid, err := strconv.Atoi(p); err == nil && pid != os.Getpid() {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		errs = append(errs, Remove(f[0]))
	}
	return errors.Join(errs...)
}
