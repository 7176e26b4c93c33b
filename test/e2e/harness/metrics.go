package harness

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// ScrapeMetric fetches the Prometheus text exposition served at url
// (parsed by prometheus/common's expfmt) and returns the sum of the
// samples of the counter, gauge or untyped metric name whose labels include
// every pair of want (nil: every sample), and whether url serves name at
// all (a vector with no child yet is not served). It fails when url does
// not answer within timeout or serves something expfmt cannot parse.
func ScrapeMetric(ctx context.Context, url, name string, want map[string]string, timeout time.Duration) (sum float64, served bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, false, err
	}
	resp, err := (&http.Client{Timeout: timeout}).Do(req)
	if err != nil {
		return 0, false, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0, false, fmt.Errorf("parse %s: %w", url, err)
	}
	f, ok := fams[name]
	if !ok {
		return 0, false, nil
	}
	return sumSamples(f, want), true, nil
}

// sumSamples adds up the values of f's samples whose labels include every
// pair of want.
func sumSamples(f *dto.MetricFamily, want map[string]string) float64 {
	sum := 0.0
	for _, m := range f.GetMetric() {
		match := 0
		for _, l := range m.GetLabel() {
			if v, ok := want[l.GetName()]; ok && v == l.GetValue() {
				match++
			}
		}
		if match != len(want) {
			continue
		}
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Untyped != nil:
			sum += m.GetUntyped().GetValue()
		}
	}
	return sum
}

// AgentMetric scrapes Node n's agent metrics and returns the sum of the
// samples of metric name whose labels include every pair of want. It fails
// when the agent does not serve name (yet).
func (c *Cluster) AgentMetric(ctx context.Context, n *Node, name string, want map[string]string) (float64, error) {
	u := fmt.Sprintf("http://%s/metrics", net.JoinHostPort(n.IPv4.String(), strconv.Itoa(AgentMetricsPort)))
	v, served, err := ScrapeMetric(ctx, u, name, want, 2*time.Second)
	if err == nil && !served {
		err = fmt.Errorf("%s does not serve %s", u, name)
	}
	return v, err
}

// ControllerMetric returns the sum of the samples of metric whose labels
// include every label in labels (name="value" pairs), as the controller
// serves it on ControllerMetricsAddr; 0 when there is no such sample. A
// pair that is not name="value" is an error.
func (c *Cluster) ControllerMetric(ctx context.Context, metric string, labels ...string) (float64, error) {
	want := make(map[string]string, len(labels))
	for _, l := range labels {
		k, q, ok := strings.Cut(l, "=")
		v, err := strconv.Unquote(q)
		if !ok || err != nil {
			return 0, fmt.Errorf("label %q is not name=\"value\"", l)
		}
		want[k] = v
	}
	v, _, err := ScrapeMetric(ctx, "http://"+ControllerMetricsAddr+"/metrics", metric, want, 5*time.Second)
	return v, err
}

// ControllerMetricSum returns the sum of every sample of metric (all its
// label values) the controller serves on ControllerMetricsAddr; 0 when it
// has none.
func (c *Cluster) ControllerMetricSum(ctx context.Context, metric string) (float64, error) {
	return c.ControllerMetric(ctx, metric)
}
