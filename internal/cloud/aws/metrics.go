package aws

import (
	"context"
	"errors"
	"time"

	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/middleware"
	"github.com/prometheus/client_golang/prometheus"
)

// Result codes of egressip_controller_cloud_api_calls_total besides the EC2
// error codes.
const (
	// CodeSuccess labels attempts EC2 answered with success.
	CodeSuccess = "Success"
	// CodeNoResponse labels attempts that got no EC2 answer: a connection
	// error, a timeout, or a canceled context.
	CodeNoResponse = "NoResponse"
)

// Metrics are the EC2 call metrics. They are counted per attempt, not per
// operation: each HTTP request the SDK's retryer sends (the first one and
// every retry) is one call with its own result code and duration, so the
// counters match what EC2 itself sees and bills against the account's
// request-rate limit.
type Metrics struct {
	// calls is egressip_controller_cloud_api_calls_total{action,code}.
	calls *prometheus.CounterVec
	// duration is egressip_controller_cloud_api_call_duration_seconds{action}.
	duration *prometheus.HistogramVec
}

// NewMetrics creates the metrics and registers them on reg. Registering on a
// registry that already holds them (a second Provider) reuses the existing
// collectors.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	calls := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "egressip_controller_cloud_api_calls_total",
		Help: "Cloud API call attempts (each SDK retry counts) by action and result code: Success, the EC2 error code, or NoResponse.",
	}, []string{"action", "code"})
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "egressip_controller_cloud_api_call_duration_seconds",
		Help:    "Duration of one cloud API call attempt (one HTTP round trip, signing to decoded response) in seconds, by action.",
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 12), // 5 ms .. ~10 s
	}, []string{"action"})
	var err error
	if calls, err = register(reg, calls); err != nil {
		return nil, err
	}
	if duration, err = register(reg, duration); err != nil {
		return nil, err
	}
	return &Metrics{calls: calls, duration: duration}, nil
}

func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if err := reg.Register(c); err != nil {
		if are, ok := errors.AsType[prometheus.AlreadyRegisteredError](err); ok {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing, nil
			}
		}
		return c, err
	}
	return c, nil
}

// errorCode is the label an attempt's error gets.
func errorCode(err error) string {
	if err == nil {
		return CodeSuccess
	}
	var ae smithy.APIError
	if errors.As(err, &ae) && ae.ErrorCode() != "" {
		return ae.ErrorCode()
	}
	return CodeNoResponse
}

// middleware observes each attempt. It sits first in the Deserialize step,
// which runs once per attempt inside the retry loop of the Finalize step,
// and sees the error after the operation's deserializer decoded it.
func (m *Metrics) middleware(stack *middleware.Stack) error {
	return stack.Deserialize.Add(middleware.DeserializeMiddlewareFunc("egressipCloudMetrics",
		func(ctx context.Context, in middleware.DeserializeInput, next middleware.DeserializeHandler) (middleware.DeserializeOutput, middleware.Metadata, error) {
			start := time.Now()
			out, md, err := next.HandleDeserialize(ctx, in)
			action := awsmiddleware.GetOperationName(ctx)
			m.calls.WithLabelValues(action, errorCode(err)).Inc()
			m.duration.WithLabelValues(action).Observe(time.Since(start).Seconds())
			return out, md, err
		}), middleware.Before)
}
