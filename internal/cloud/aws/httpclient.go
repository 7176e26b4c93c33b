package aws

import (
	"bytes"
	"fmt"
	"io"
	"net/http"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
)

// httpDoer is the SDK's HTTP client contract (aws.HTTPClient).
type httpDoer interface {
	Do(*http.Request) (*http.Response, error)
}

// ownBodyClient hands net/http a request body of its own: a copy in memory
// of the body the SDK built.
//
// Why: smithy-go wraps each attempt's body in a reader that it closes as
// soon as the response headers arrive, and whose WriteTo then returns
// io.EOF as an error. net/http's writeLoop, after sending ContentLength
// bytes, reads the body once more to check for extra data (transfer.go,
// writeBody); when the server answered quickly that read can come after the
// SDK's close, the write counts as failed and net/http closes the
// connection under the response body being read. The attempt then fails
// with "use of closed network connection" and is retried (aws-sdk-go-v2
// issue 2737; the SDK retries net.ErrClosed since PR 2949), so one logical
// call costs two EC2 requests. EC2 Query requests are form-encoded and
// small (tens of KiB at most), so a copy costs little.
type ownBodyClient struct {
	next httpDoer
}

// Do implements httpDoer. It returns an error, without sending, only when
// the SDK's body cannot be read.
func (c ownBodyClient) Do(req *http.Request) (*http.Response, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return c.next.Do(req)
	}
	body, err := io.ReadAll(req.Body)
	_ = req.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("read request body: %w", err)
	}
	out := req.Clone(req.Context())
	out.Body = io.NopCloser(bytes.NewReader(body))
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	out.ContentLength = int64(len(body))
	return c.next.Do(out)
}

// withOwnBody wraps client (the SDK's default buildable client when nil).
func withOwnBody(client httpDoer) httpDoer {
	if client == nil {
		client = awshttp.NewBuildableClient()
	}
	return ownBodyClient{next: client}
}
