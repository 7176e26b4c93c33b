package nodeaddr

import (
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func node(name string, addrs ...corev1.NodeAddress) corev1.Node {
	return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Addresses: addrs}}
}

func TestBuild(t *testing.T) {
	nodes := []corev1.Node{
		node("b", corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "192.0.2.1"},
			corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "::ffff:198.51.100.1"},
			corev1.NodeAddress{Type: corev1.NodeHostName, Address: "192.0.2.99"},
			corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "not-an-ip"},
			corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "192.0.2.50"}),
		node("a", corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "192.0.2.1"},
			corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "2001:db8::1"}),
	}
	skip := func(n string, ip netip.Addr) bool { return n == "b" && ip == netip.MustParseAddr("192.0.2.50") }
	got := Build(nodes, skip)
	want := Index{
		netip.MustParseAddr("192.0.2.1"):    {Node: "a", Type: corev1.NodeExternalIP}, // first by name
		netip.MustParseAddr("2001:db8::1"):  {Node: "a", Type: corev1.NodeInternalIP},
		netip.MustParseAddr("198.51.100.1"): {Node: "b", Type: corev1.NodeExternalIP}, // unmapped
	}
	if len(got) != len(want) {
		t.Fatalf("Build = %v, want %v", got, want)
	}
	for ip, o := range want {
		if got[ip] != o {
			t.Errorf("Build[%s] = %+v, want %+v", ip, got[ip], o)
		}
	}
	if s := got[netip.MustParseAddr("192.0.2.1")].String(); s != "the ExternalIP of Node a" {
		t.Errorf("Owner.String = %q", s)
	}
	if s := got.Sorted(); len(s) != 3 || s[0] != netip.MustParseAddr("192.0.2.1") || s[2] != netip.MustParseAddr("2001:db8::1") {
		t.Errorf("Sorted = %v", s)
	}
}
