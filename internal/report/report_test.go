package report

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestPollCarriesReleases: the releases a Client sends arrive, in order, at
// the PollHandler of the agent, in one GET; a poll without releases is a
// plain GET of Path, as agents that predate Poll expect.
func TestPollCarriesReleases(t *testing.T) {
	var got []Poll
	var queries []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		queries = append(queries, r.URL.RawQuery)
		PollHandler(func(p Poll) Report { got = append(got, p); return Report{Node: "n1"} }).ServeHTTP(w, r)
	}))
	defer srv.Close()
	host, port, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
	p, _ := strconv.Atoi(port)
	c := NewClient(p, 2*time.Second)
	rs := []Release{
		{IP: netip.MustParseAddr("192.0.2.5"), UID: "0c0e2f4a-1", ResourceVersion: "1234", Egress: "e1"},
		{IP: netip.MustParseAddr("2001:db8::5"), UID: "0c0e2f4a-2", ResourceVersion: "99", Egress: "e.two"},
	}
	as := []Acquire{{IP: netip.MustParseAddr("198.51.100.7"), UID: "0c0e2f4a-3", ResourceVersion: "77", Egress: "e3"}}
	for _, poll := range []Poll{{}, {Releases: rs}, {Releases: rs[:1], Acquires: as}} {
		r, err := c.Get(context.Background(), netip.MustParseAddr(host), poll)
		if err != nil || r.Node != "n1" {
			t.Fatalf("Get(%v) = %+v, %v", poll, r, err)
		}
	}
	if queries[0] != "" {
		t.Errorf("a poll without releases sent query %q", queries[0])
	}
	if len(got) != 3 || len(got[0].Releases) != 0 || !slices.Equal(got[1].Releases, rs) || len(got[1].Acquires) != 0 {
		t.Fatalf("handler saw %+v, want none then %+v", got, rs)
	}
	if !slices.Equal(got[2].Releases, rs[:1]) || !slices.Equal(got[2].Acquires, as) {
		t.Fatalf("handler saw %+v, want releases %+v and acquires %+v", got[2], rs[:1], as)
	}
}

func TestParsePollRefusesMalformed(t *testing.T) {
	many := url.Values{}
	for i := range MaxReleases + 1 {
		many.Add(ReleaseParam, "192.0.2.1,u"+strconv.Itoa(i)+",1,e")
	}
	for _, q := range []url.Values{
		{ReleaseParam: {"192.0.2.1,uid,1"}},
		{ReleaseParam: {"not-an-ip,uid,1,e"}},
		{ReleaseParam: {"192.0.2.1,,1,e"}},
		{ReleaseParam: {"192.0.2.1,uid,,e"}},
		{AcquireParam: {"192.0.2.1,uid,1,"}},
		{AcquireParam: {"192.0.2.1,uid,1"}},
		many,
	} {
		if p, err := ParsePoll(q); err == nil {
			t.Errorf("ParsePoll(%.80v) = %+v, want an error", q, p)
		}
	}
	rec := httptest.NewRecorder()
	PollHandler(func(Poll) Report { t.Fatal("served a malformed poll"); return Report{} }).
		ServeHTTP(rec, httptest.NewRequest(http.MethodGet, Path+"?"+ReleaseParam+"=x", nil))
	if rec.Code != http.StatusBadRequest {
		t.Errorf("malformed poll: HTTP %d, want 400", rec.Code)
	}
}
