package datapath

import (
	"testing"

	"golang.org/x/sys/unix"
)

func TestIPEncapRoundTrip(t *testing.T) {
	for _, e := range []ipEncap{
		{ID: 1, Dst: ap("192.0.2.100"), TTL: 64, Flags: tunnelCsum},
		{ID: 1 << 40, Dst: ap("2001:db8::100"), TTL: 1},
	} {
		b, err := e.Encode()
		if err != nil {
			t.Fatal(err)
		}
		var got ipEncap
		if err := got.Decode(b); err != nil {
			t.Fatal(err)
		}
		if !got.Equal(&e) {
			t.Errorf("round trip of %v gave %v", &e, &got)
		}
		want := unix.LWTUNNEL_ENCAP_IP
		if e.Dst.Is6() {
			want = unix.LWTUNNEL_ENCAP_IP6
		}
		if e.Type() != want {
			t.Errorf("%v: type %d, want %d", &e, e.Type(), want)
		}
	}
	if _, err := (&ipEncap{}).Encode(); err == nil {
		t.Error("encap without destination encoded")
	}
}
