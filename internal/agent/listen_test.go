package agent

import (
	"net"
	"strings"
	"testing"
)

// TestOpenListenersClosesOnFailure: when the health port cannot be opened
// (another socket holds it without SO_REUSEPORT), openListeners fails
// naming it and closes the report listener it had opened, so the report
// port is free again for the next try (it used to stay bound until the
// process exited).
func TestOpenListenersClosesOnFailure(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = taken.Close() }()
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	reportAddr := free.Addr().String()
	_ = free.Close()
	ls, err := openListeners(t.Context(), RunOptions{ReportBindAddress: reportAddr, HealthProbeBindAddress: taken.Addr().String()})
	if err == nil {
		ls.close()
		t.Fatalf("openListeners with the health port taken: no error")
	}
	if !strings.Contains(err.Error(), "health probes") {
		t.Errorf("error %q does not name the health listener", err)
	}
	if portTaken(reportAddr) {
		t.Fatalf("the report port %s is still bound after the failure", reportAddr)
	}
}
