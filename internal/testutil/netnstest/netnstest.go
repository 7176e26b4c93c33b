// Package netnstest creates throw-away network namespaces for the agent's
// root-only tests: a "node" and a "peer" namespace joined by a veth pair.
// Everything it creates is named egt-<random>-..., deleted in t.Cleanup and
// never connected to the host's network.
package netnstest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
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

// NS is a named network namespace owned by a test.
type NS struct {
	Name   string
	Path   string
	Handle netns.NsHandle
}

func randomID() string {
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// NewNS creates namespace egt-<random>-<role> with lo up and IPv6 DAD off
// (so test addresses are usable at once); it is deleted in t.Cleanup.
func NewNS(t testing.TB, role string) *NS {
	t.Helper()
	RequireRoot(t)
	name := "egt-" + randomID() + "-" + role
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	n := &NS{Name: name, Path: filepath.Join("/run/netns", name), Handle: netns.None()}
	t.Cleanup(func() {
		if n.Handle.IsOpen() {
			_ = n.Handle.Close()
		}
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	h, err := netns.GetFromPath(n.Path)
	if err != nil {
		t.Fatalf("open %s: %v", n.Path, err)
	}
	n.Handle = h
	n.MustIP(t, "link", "set", "lo", "up")
	n.Sysctl(t, "net/ipv6/conf/all/accept_dad", "0")
	n.Sysctl(t, "net/ipv6/conf/default/accept_dad", "0")
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

// Do runs fn on an OS thread switched into the namespace. The thread is
// locked and discarded afterwards (the goroutine exits still locked), so no
// other goroutine ever runs in the wrong namespace. Sockets opened by fn
// stay in the namespace and may be used from any goroutine later.
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

// Sysctl writes /proc/sys/<key> inside the namespace.
func (n *NS) Sysctl(t testing.TB, key, value string) {
	t.Helper()
	if err := n.Do(func() error {
		return os.WriteFile(filepath.Join("/proc/sys", key), []byte(value), 0o644)
	}); err != nil {
		t.Fatalf("sysctl %s=%s in %s: %v", key, value, n.Name, err)
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

// Netlink returns a netlink handle in the namespace, closed in t.Cleanup.
func (n *NS) Netlink(t testing.TB) *netlink.Handle {
	t.Helper()
	h, err := netlink.NewHandleAt(n.Handle)
	if err != nil {
		t.Fatalf("netlink handle in %s: %v", n.Name, err)
	}
	t.Cleanup(h.Close)
	return h
}

// Interface returns the net.Interface (index, MAC) of a link in the namespace.
func (n *NS) Interface(t testing.TB, name string) *net.Interface {
	t.Helper()
	var ifi *net.Interface
	if err := n.Do(func() (err error) {
		ifi, err = net.InterfaceByName(name)
		return err
	}); err != nil {
		t.Fatalf("interface %s in %s: %v", name, n.Name, err)
	}
	return ifi
}

// Pair is a node namespace and a peer namespace joined by a veth pair.
type Pair struct {
	Node, Peer     *NS
	NodeIf, PeerIf string
}

// NewPair creates the two namespaces and the veth pair NodeIf <-> PeerIf,
// both up and without addresses.
func NewPair(t testing.TB) *Pair {
	t.Helper()
	p := &Pair{Node: NewNS(t, "node"), Peer: NewNS(t, "peer"), NodeIf: "node0", PeerIf: "peer0"}
	p.Node.MustIP(t, "link", "add", p.NodeIf, "type", "veth", "peer", "name", p.PeerIf, "netns", p.Peer.Name)
	p.Node.MustIP(t, "link", "set", p.NodeIf, "up")
	p.Peer.MustIP(t, "link", "set", p.PeerIf, "up")
	return p
}
