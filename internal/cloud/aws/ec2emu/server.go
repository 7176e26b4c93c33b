// Package ec2emu is an in-process emulator of the slice of the Amazon EC2
// Query API that egressip's AWS provider uses, served over loopback HTTP so
// that tests drive the real aws-sdk-go-v2 EC2 client (SigV4 signing,
// retries, XML decoding) against it.
//
// Protocol: requests are form-encoded POSTs (GET queries work too) with
// Action=... and Version=2016-11-15, signed with AWS Signature Version 4;
// responses are XML in the namespace http://ec2.amazonaws.com/doc/2016-11-15/
// and errors are <Response><Errors><Error><Code/><Message/></Error></Errors>
// <RequestID/></Response> with HTTP 400 for client errors, 401 for
// signature failures and 503 for throttling, as described in the EC2 API
// Reference ("Query requests", "Error codes").
//
// Actions: DescribeInstances, DescribeNetworkInterfaces,
// DescribeInstanceTypes, DescribeSubnets, AssignPrivateIpAddresses,
// UnassignPrivateIpAddresses, CreateNetworkInterface,
// AttachNetworkInterface, DetachNetworkInterface, DeleteNetworkInterface
// and ModifyNetworkInterfaceAttribute (DeleteOnTermination). Everything
// else is InvalidAction. Deny makes an action fail with
// UnauthorizedOperation, as a missing IAM permission does.
//
// The Ipamd actor (ipamd.go) plays the AWS VPC CNI's IP address
// management daemon on one instance: it adopts secondary addresses it
// finds on the interfaces it manages and, in warm-IP mode, releases the
// free ones above its target.
//
// Model: subnets with a CIDR and free-address accounting (five reserved
// addresses each), instances of configurable types (ENI count and
// addresses per ENI), interfaces with a device index, and secondary
// addresses attached by the API or, through UseSlots, by "another party".
// Describe* calls see assignments only after Config.ConsistencyDelay;
// mutations and their checks always use the true state, which tests read
// with Interface, Interfaces, Owner and FreeAddresses. Config.Latency
// delays each call, Config.Rate/Burst throttle all calls with one token
// bucket (or per action with Config.ActionThrottle; RequestLimitExceeded,
// HTTP 503), FailNext injects errors, and Counts reports calls by action
// and result code.
package ec2emu

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/xml"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"golang.org/x/time/rate"
)

// Namespace is the XML namespace of EC2 API version 2016-11-15.
const Namespace = "http://ec2.amazonaws.com/doc/2016-11-15/"

// APIVersion is the only Version parameter the emulator accepts.
const APIVersion = "2016-11-15"

// Credentials the emulator accepts unless Config says otherwise.
const (
	AccessKeyID     = "AKIDEC2EMULATOR"
	SecretAccessKey = "ec2emu-secret-access-key"
)

// Success is the result code Counts uses for calls that succeeded.
const Success = "Success"

// Config sets up a Server. The zero value is a usable, instant,
// unthrottled, consistent EC2 in us-east-1 with DefaultInstanceTypes.
type Config struct {
	// Region is the region requests must be signed for; default us-east-1.
	Region string
	// AccessKeyID and SecretAccessKey are the only credentials accepted;
	// default the package constants.
	AccessKeyID, SecretAccessKey string
	// SkipSignatureCheck accepts any request with an AWS4-HMAC-SHA256
	// Authorization header without recomputing its signature.
	SkipSignatureCheck bool
	// InstanceTypes are the known types and their limits; nil means
	// DefaultInstanceTypes.
	InstanceTypes map[string]InstanceType
	// ConsistencyDelay is how long Describe* calls keep showing the state
	// before an Assign or Unassign (EC2's eventual consistency).
	ConsistencyDelay time.Duration
	// Now is the clock the consistency delay is measured on; nil means
	// time.Now. Tests pass a fake clock to see the lag deterministically
	// (latency, throttling and signature expiry use real time).
	Now func() time.Time
	// Latency is added to every call that is not throttled, by action name;
	// the key "*" applies to actions not listed.
	Latency map[string]time.Duration
	// Rate is the steady number of calls per second the token bucket
	// admits, over all actions; zero disables throttling.
	Rate float64
	// Burst is the bucket's size (calls admitted at once); default 1 when
	// Rate is set.
	Burst int
	// ActionThrottle gives the listed actions buckets of their own instead
	// of the shared one (EC2 meters mutating and Describe actions
	// separately); a zero Rate exempts the action.
	ActionThrottle map[string]Throttle
	// MaxPageSize caps the items of one page of a paginated Describe call
	// below the request's MaxResults (and pages calls without MaxResults);
	// zero means MaxResults alone decides.
	MaxPageSize int
	// TrailingEmptyPage makes a page that is full and reaches the end of
	// the list still return a NextToken, whose page is empty, as EC2 may.
	TrailingEmptyPage bool
}

// Throttle is one token bucket: Rate calls per second, Burst at once.
type Throttle struct {
	Rate  float64
	Burst int
}

// Server is a running emulator. All methods are safe for concurrent use.
type Server struct {
	srv *httptest.Server

	mu            sync.Mutex
	cfg           Config
	limiter       *rate.Limiter
	perAction     map[string]*rate.Limiter // nil entry: exempt
	seq           uint64
	subnets       map[string]*subnetState
	subnetOrder   []string
	instances     map[string]*instanceState
	instanceOrder []string
	enis          map[string]*eniState
	eniOrder      []string
	counts        map[string]map[string]int
	faults        map[string][]string
	// groups are the security groups that exist.
	groups map[string]bool
	// denied are actions the caller's IAM policy lacks.
	denied map[string]bool
	// mutations logs every change an API call made, in order.
	mutations  []Mutation
	eips       map[string]*eipState // Elastic IP allocations (eip.go)
	nextPublic int
}

// New starts a Server on a loopback port.
func New(cfg Config) *Server {
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	if cfg.AccessKeyID == "" {
		cfg.AccessKeyID, cfg.SecretAccessKey = AccessKeyID, SecretAccessKey
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.InstanceTypes == nil {
		cfg.InstanceTypes = DefaultInstanceTypes()
	}
	s := &Server{
		cfg:       cfg,
		subnets:   map[string]*subnetState{},
		instances: map[string]*instanceState{},
		enis:      map[string]*eniState{},
		counts:    map[string]map[string]int{},
		faults:    map[string][]string{},
		groups:    map[string]bool{DefaultSecurityGroup: true},
		denied:    map[string]bool{},
	}
	s.setThrottle(cfg.Rate, cfg.Burst)
	s.perAction = map[string]*rate.Limiter{}
	for a, t := range cfg.ActionThrottle {
		s.perAction[a] = newLimiter(t.Rate, t.Burst)
	}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serveHTTP))
	return s
}

// URL is the endpoint to give the SDK as BaseEndpoint.
func (s *Server) URL() string { return s.srv.URL }

// AWSConfig returns an SDK configuration for this server: its region and
// credentials and BaseEndpoint = URL. Callers add a Retryer or APIOptions.
func (s *Server) AWSConfig() aws.Config {
	return aws.Config{
		Region:       s.cfg.Region,
		Credentials:  credentials.NewStaticCredentialsProvider(s.cfg.AccessKeyID, s.cfg.SecretAccessKey, ""),
		BaseEndpoint: aws.String(s.URL()),
	}
}

// Region is the region requests must be signed for.
func (s *Server) Region() string { return s.cfg.Region }

// Close stops the server and waits for calls in flight.
func (s *Server) Close() {
	s.srv.CloseClientConnections()
	s.srv.Close()
}

// SetThrottle replaces the token bucket: perSecond calls per second, burst
// at once; perSecond 0 disables throttling.
func (s *Server) SetThrottle(perSecond float64, burst int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.setThrottle(perSecond, burst)
}

func (s *Server) setThrottle(r float64, burst int) {
	s.cfg.Rate, s.cfg.Burst = r, burst
	s.limiter = newLimiter(r, burst)
}

func newLimiter(r float64, burst int) *rate.Limiter {
	if r <= 0 {
		return nil
	}
	return rate.NewLimiter(rate.Limit(r), max(burst, 1))
}

// SetActionThrottle gives one action its own token bucket (see
// Config.ActionThrottle).
func (s *Server) SetActionThrottle(action string, t Throttle) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.perAction[action] = newLimiter(t.Rate, t.Burst)
}

// SetLatency sets the delay of one action ("*": every unlisted action).
func (s *Server) SetLatency(action string, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := make(map[string]time.Duration, len(s.cfg.Latency)+1)
	maps.Copy(m, s.cfg.Latency)
	m[action] = d
	s.cfg.Latency = m
}

// SetConsistencyDelay changes how long Describe* calls lag mutations.
func (s *Server) SetConsistencyDelay(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cfg.ConsistencyDelay = d
}

// FailNext makes the next n calls of action fail with the given EC2 error
// code (HTTP 503 for RequestLimitExceeded, Unavailable and InternalError
// is 500, else 400) before any other processing; they are counted under
// that code.
func (s *Server) FailNext(action, code string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		s.faults[action] = append(s.faults[action], code)
	}
}

// Counts returns the number of calls received so far, by action and result
// code (Success or the EC2 error code), throttled calls included.
func (s *Server) Counts() map[string]map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]map[string]int, len(s.counts))
	for a, m := range s.counts {
		out[a] = maps.Clone(m)
	}
	return out
}

// Calls returns the number of calls of one action ("" for all actions),
// whatever their result.
func (s *Server) Calls(action string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for a, m := range s.counts {
		if action == "" || a == action {
			for _, c := range m {
				n += c
			}
		}
	}
	return n
}

// ResetCounts forgets the calls counted so far.
func (s *Server) ResetCounts() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts = map[string]map[string]int{}
}

func (s *Server) count(action, code string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.counts[action] == nil {
		s.counts[action] = map[string]int{}
	}
	s.counts[action][code]++
}

// apiError is an EC2 error response.
type apiError struct {
	code, msg string
}

func (e *apiError) Error() string { return e.code + ": " + e.msg }

func errorf(code, format string, args ...any) *apiError {
	return &apiError{code: code, msg: fmt.Sprintf(format, args...)}
}

func (e *apiError) status() int {
	switch e.code {
	case "RequestLimitExceeded", "Unavailable":
		return http.StatusServiceUnavailable
	case "InternalError":
		return http.StatusInternalServerError
	case "AuthFailure", "SignatureDoesNotMatch":
		return http.StatusUnauthorized
	case "UnauthorizedOperation":
		return http.StatusForbidden
	}
	return http.StatusBadRequest
}

type errorResponse struct {
	XMLName   xml.Name `xml:"Response"`
	Code      string   `xml:"Errors>Error>Code"`
	Message   string   `xml:"Errors>Error>Message"`
	RequestID string   `xml:"RequestID"`
}

func (s *Server) requestID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	return fmt.Sprintf("e2e0e2e0-0000-4000-8000-%012x", s.seq)
}

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	reqID := s.requestID()
	form, action, aerr := s.authenticate(r, body)
	if aerr == nil {
		aerr = s.admit(r.Context(), action)
	}
	var resp any
	if aerr == nil {
		resp, aerr = s.dispatch(action, form)
	}
	if aerr != nil {
		s.count(action, aerr.code)
		writeXML(w, aerr.status(), errorResponse{Code: aerr.code, Message: aerr.msg, RequestID: reqID})
		return
	}
	s.count(action, Success)
	setRequestID(resp, reqID)
	writeXML(w, http.StatusOK, resp)
}

func writeXML(w http.ResponseWriter, status int, v any) {
	out, err := xml.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(xml.Header))
	_, _ = w.Write(out)
}

// authenticate parses the form and checks the SigV4 signature.
func (s *Server) authenticate(r *http.Request, body []byte) (form formValues, action string, _ *apiError) {
	r.Body = io.NopCloser(strings.NewReader(string(body)))
	if err := r.ParseForm(); err != nil {
		return nil, "", errorf("InvalidParameterValue", "cannot parse the request: %v", err)
	}
	form = formValues(r.Form)
	action = form.get("Action")
	if action == "" {
		return form, "", errorf("MissingAction", "The request must contain the parameter Action.")
	}
	if v := form.get("Version"); v != APIVersion {
		return form, action, errorf("InvalidParameterValue", "Version %q is not supported; this emulator speaks %s.", v, APIVersion)
	}
	auth := r.Header.Get("Authorization")
	if !strings.HasPrefix(auth, "AWS4-HMAC-SHA256 ") {
		return form, action, errorf("AuthFailure", "AWS was not able to validate the provided access credentials (no SigV4 Authorization header).")
	}
	s.mu.Lock()
	cfg := s.cfg
	s.mu.Unlock()
	if cfg.SkipSignatureCheck {
		return form, action, nil
	}
	if err := verifySignature(r, body, auth, cfg); err != nil {
		return form, action, err
	}
	return form, action, nil
}

// verifySignature re-signs the request's signed headers with the SDK's own
// SigV4 signer and compares the result with what the client sent.
func verifySignature(r *http.Request, body []byte, auth string, cfg Config) *apiError {
	fields := map[string]string{}
	for part := range strings.SplitSeq(strings.TrimPrefix(auth, "AWS4-HMAC-SHA256 "), ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		fields[k] = v
	}
	scope := strings.Split(fields["Credential"], "/")
	if len(scope) != 5 || scope[0] != cfg.AccessKeyID {
		return errorf("AuthFailure", "AWS was not able to validate the provided access credentials.")
	}
	if scope[2] != cfg.Region || scope[3] != "ec2" {
		return errorf("AuthFailure", "Credential should be scoped to a valid region (%s) and service ec2, not %s/%s.", cfg.Region, scope[2], scope[3])
	}
	when, err := time.Parse("20060102T150405Z", r.Header.Get("X-Amz-Date"))
	if err != nil {
		return errorf("AuthFailure", "missing or malformed X-Amz-Date")
	}
	if d := time.Since(when); d > 5*time.Minute || d < -5*time.Minute {
		return errorf("RequestExpired", "Request has expired.")
	}
	clone, err := http.NewRequest(r.Method, "http://"+r.Host+r.URL.RequestURI(), strings.NewReader(string(body)))
	if err != nil {
		return errorf("AuthFailure", "cannot rebuild the request: %v", err)
	}
	clone.ContentLength = int64(len(body))
	for h := range strings.SplitSeq(fields["SignedHeaders"], ";") {
		if h == "host" || h == "content-length" {
			continue
		}
		clone.Header[http.CanonicalHeaderKey(h)] = r.Header.Values(h)
	}
	sum := sha256.Sum256(body)
	creds := aws.Credentials{AccessKeyID: cfg.AccessKeyID, SecretAccessKey: cfg.SecretAccessKey}
	if err := v4.NewSigner().SignHTTP(context.Background(), creds, clone, hex.EncodeToString(sum[:]), "ec2", cfg.Region, when); err != nil {
		return errorf("AuthFailure", "cannot sign: %v", err)
	}
	if clone.Header.Get("Authorization") != auth {
		return errorf("AuthFailure", "The request signature we calculated does not match the signature you provided.")
	}
	return nil
}

// admit applies injected faults, the token bucket and the latency.
func (s *Server) admit(ctx context.Context, action string) *apiError {
	s.mu.Lock()
	if f := s.faults[action]; len(f) > 0 {
		s.faults[action] = f[1:]
		s.mu.Unlock()
		return errorf(f[0], "injected %s", f[0])
	}
	if s.denied[action] {
		s.mu.Unlock()
		return errorf("UnauthorizedOperation", "You are not authorized to perform this operation. User: arn:aws:sts::123456789012:assumed-role/egressip-controller/emu is not authorized to perform: ec2:%s because no identity-based policy allows the ec2:%s action", action, action)
	}
	lim, own := s.perAction[action]
	if !own {
		lim = s.limiter
	}
	if lim != nil && !lim.Allow() {
		s.mu.Unlock()
		return errorf("RequestLimitExceeded", "Request limit exceeded.")
	}
	d, ok := s.cfg.Latency[action]
	if !ok {
		d = s.cfg.Latency["*"]
	}
	s.mu.Unlock()
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return errorf("RequestCanceled", "the client went away")
		}
	}
	return nil
}
