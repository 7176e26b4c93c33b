package aws

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// closingReader is a request body like smithy-go's: once closed, Read and
// WriteTo return io.EOF.
type closingReader struct {
	r      *strings.Reader
	closed bool
}

func (c *closingReader) Read(p []byte) (int, error) {
	if c.closed {
		return 0, io.EOF
	}
	return c.r.Read(p)
}

func (c *closingReader) WriteTo(w io.Writer) (int64, error) {
	if c.closed {
		return 0, io.EOF
	}
	return c.r.WriteTo(w)
}

func (c *closingReader) Close() error { c.closed = true; return nil }

type doerFunc func(*http.Request) (*http.Response, error)

func (f doerFunc) Do(r *http.Request) (*http.Response, error) { return f(r) }

// TestOwnBodyClientBodySurvivesCallerClose: the body the transport reads is
// independent of the SDK's, so the SDK closing its own (as it does when
// response headers arrive) cannot cut the transport's read short.
func TestOwnBodyClientBodySurvivesCallerClose(t *testing.T) {
	const form = "Action=DescribeInstances&Version=2016-11-15&Filter.1.Name=instance-id"
	sdkBody := &closingReader{r: strings.NewReader(form)}
	req, err := http.NewRequest(http.MethodPost, "http://ec2.invalid/", sdkBody)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = int64(len(form))
	var sent string
	c := withOwnBody(doerFunc(func(r *http.Request) (*http.Response, error) {
		_ = sdkBody.Close() // what smithy-go does once headers are in
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return nil, err
		}
		sent = string(b)
		if r.ContentLength != int64(len(form)) {
			t.Errorf("ContentLength %d, want %d", r.ContentLength, len(form))
		}
		again, err := r.GetBody()
		if err != nil {
			return nil, err
		}
		if b, _ := io.ReadAll(again); string(b) != form {
			t.Errorf("GetBody gave %q, want the form", b)
		}
		return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody}, nil
	}))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if sent != form {
		t.Fatalf("transport read %q, want %q", sent, form)
	}
	if !sdkBody.closed {
		t.Fatal("the SDK's body was not closed")
	}
}
