/*
Copyright 2026 The egressip Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	awsconfig "github.com/aws/aws-sdk-go-v2/config"

	// Import all Kubernetes client auth plugins (e.g. Azure, GCP, OIDC, etc.)
	// to ensure that exec-entrypoint and run can make use of them.
	_ "k8s.io/client-go/plugin/pkg/client/auth"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	egressipv1alpha1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/agentcert"
	egaws "github.com/egressip/egressip/internal/cloud/aws"
	"github.com/egressip/egressip/internal/controller"
	egwebhook "github.com/egressip/egressip/internal/webhook"
	// +kubebuilder:scaffold:imports
)

var (
	scheme   = runtime.NewScheme()
	setupLog = ctrl.Log.WithName("setup")
)

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))

	utilruntime.Must(egressipv1alpha1.AddToScheme(scheme))
	// +kubebuilder:scaffold:scheme
}

// controllerFlags is the controller's command line, as bindFlags
// registers it; main checks it and wires the manager from it.
type controllerFlags struct {
	metricsAddr                                      string
	metricsCertPath, metricsCertName, metricsCertKey string
	webhookCertPath, webhookCertName, webhookCertKey string
	webhookPort                                      int
	enableLeaderElection                             bool
	probeAddr                                        string
	secureMetrics                                    bool
	enableHTTP2                                      bool
	// ctrlOpts holds the pass, liveness and cloud options (package
	// controller); main adds AgentTLS and the cloud provider.
	ctrlOpts         controller.Options
	leaderElectionNS string
	enableWebhooks   bool
	apiQPS           float64
	apiBurst         int
	agentTLS         controller.AgentTLSOptions
	agentSA          string
	// le holds the leader-election timings (--leader-elect-*).
	le            controller.LeaderElectionConfig
	cloudProvider string
	// zap holds the logging flags (--zap-log-level, ...).
	zap zap.Options
}

// bindFlags registers every flag of the controller on fs, with its
// default, and returns where the parsed values land.
func bindFlags(fs *flag.FlagSet) *controllerFlags {
	f := &controllerFlags{le: controller.DefaultLeaderElection()}
	fs.StringVar(&f.metricsAddr, "metrics-bind-address", "0", "The address the metrics endpoint binds to. "+
		"Use :8443 for HTTPS or :8080 for HTTP, or leave as 0 to disable the metrics service.")
	fs.StringVar(&f.probeAddr, "health-probe-bind-address", ":8081", "The address the probe endpoint binds to.")
	fs.BoolVar(&f.enableLeaderElection, "leader-elect", false,
		"Enable leader election for controller manager. "+
			"Enabling this will ensure there is only one active controller manager.")
	fs.BoolVar(&f.secureMetrics, "metrics-secure", true,
		"If set, the metrics endpoint is served securely via HTTPS. Use --metrics-secure=false to use HTTP instead.")
	fs.StringVar(&f.webhookCertPath, "webhook-cert-path", "", "The directory that contains the webhook certificate.")
	fs.StringVar(&f.webhookCertName, "webhook-cert-name", "tls.crt", "The name of the webhook certificate file.")
	fs.StringVar(&f.webhookCertKey, "webhook-cert-key", "tls.key", "The name of the webhook key file.")
	fs.IntVar(&f.webhookPort, "webhook-port", 9443, "Port the webhook server listens on. "+
		"Defaults to 9443. Set -1 to disable the webhook server.")
	fs.StringVar(&f.metricsCertPath, "metrics-cert-path", "",
		"The directory that contains the metrics server certificate.")
	fs.StringVar(&f.metricsCertName, "metrics-cert-name", "tls.crt", "The name of the metrics server certificate file.")
	fs.StringVar(&f.metricsCertKey, "metrics-cert-key", "tls.key", "The name of the metrics server key file.")
	fs.Float64Var(&f.apiQPS, "kube-api-qps", controller.DefaultKubeAPIQPS,
		"Requests per second the controller may send to the API server, per resource type "+
			"(a large pass's deferrable status writes are spread at this rate; docs/install.md).")
	fs.IntVar(&f.apiBurst, "kube-api-burst", controller.DefaultKubeAPIBurst,
		"Burst of requests above --kube-api-qps, per resource type: the writes of a failover "+
			"of one Node (two per Egress) should fit in it.")
	fs.BoolVar(&f.enableWebhooks, "enable-webhooks", true,
		"Serve the validating webhook (pool overlaps, egressIP outside its pool, pool updates that drop allocated IPs).")
	fs.IntVar(&f.ctrlOpts.Pass.DefaultCapacity, "max-egress-ips-per-node", 255,
		"Egress IPs a Node may hold when it has no valid egressip.io/max-egress-ips annotation; "+
			"also the largest value that annotation may take.")
	fs.Float64Var(&f.ctrlOpts.Pass.BalanceFactor, "balance-factor", 1.25,
		"Bounded-load factor c of the scheduler: no Node receives new IPs beyond ceil(c x average) of its pool "+
			"while another eligible Node has room.")
	fs.DurationVar(&f.ctrlOpts.Liveness.Interval, "agent-poll-interval", controller.DefaultPollInterval,
		"Interval between two rounds of polls of the agents' reports (a fixed rate); the agents' "+
			"--controller-poll-interval must be the same.")
	fs.DurationVar(&f.ctrlOpts.Liveness.Timeout, "agent-poll-timeout", controller.DefaultPollTimeout,
		"Timeout of one agent poll; less than --agent-poll-interval.")
	fs.DurationVar(&f.ctrlOpts.Liveness.DeadAfter, "agent-dead-after", controller.DefaultDeadAfter,
		"An agent that has not answered for this long (and failed --agent-failure-threshold polls in a row) "+
			"is dead and its IPs move; the agents' --controller-dead-after must be the same.")
	fs.DurationVar(&f.ctrlOpts.Pass.ReleaseTimeout, "release-timeout", controller.DefaultReleaseTimeout,
		"How long a planned move waits for the old Node to release an IP (its agent is told to in every poll) "+
			"before that Node counts as not releasing it and the IP moves as from a dead Node; "+
			"at least twice --agent-poll-interval.")
	fs.DurationVar(&f.ctrlOpts.Pass.AcquireTimeout, "acquire-timeout", controller.DefaultAcquireTimeout,
		"How long the move of an Egress off a dead Node is held back while the new Node binds the IP on the poll's "+
			"instruction, so that the move and Ready are one status write; after it the move is written anyway. "+
			"0 turns the hold off.")
	fs.IntVar(&f.ctrlOpts.Liveness.FailureThreshold, "agent-failure-threshold", controller.DefaultFailureThreshold,
		"Failed polls in a row before an agent can be declared dead.")
	fs.IntVar(&f.ctrlOpts.Liveness.Port, "agent-report-port", 9445,
		"TCP port of the agents' report endpoint on every Node's InternalIP.")
	fs.StringVar(&f.agentTLS.Namespace, "agent-ca-namespace", os.Getenv("POD_NAMESPACE"),
		"Namespace of the agent CA: the Secret "+agentcert.CASecretName+" (created once, read by every replica) "+
			"and the ConfigMap "+
			agentcert.CAConfigMapName+" the agents read. Defaults to $POD_NAMESPACE.")
	fs.StringVar(&f.agentSA, "agent-service-account", "egressip-agent",
		"Service account of the agents, in the namespace of --agent-ca-namespace, or as <namespace>:<name>: "+
			"the only requester whose certificate requests (signer "+agentcert.SignerName+") are signed.")
	fs.DurationVar(&f.agentTLS.Lifetime, "agent-cert-lifetime", controller.DefaultAgentCertLifetime,
		"Longest lifetime of an agent certificate (agents renew at 70 to 90 % of it), also that of the controller's "+
			"client certificates (renewed at two thirds).")
	fs.StringVar(&f.leaderElectionNS, "leader-election-namespace", "",
		"Namespace of the leader-election Lease; required when running outside a cluster.")
	fs.DurationVar(&f.le.LeaseDuration, "leader-elect-lease-duration", f.le.LeaseDuration,
		"How long a standby waits after it last saw the leader renew the Lease before it takes over "+
			"(whole seconds; more than --leader-elect-renew-deadline + --leader-elect-retry-period). See docs/failover.md.")
	fs.DurationVar(&f.le.RenewDeadline, "leader-elect-renew-deadline", f.le.RenewDeadline,
		"How long the leader keeps retrying to renew the Lease before it stops leading and exits.")
	fs.DurationVar(&f.le.RetryPeriod, "leader-elect-retry-period", f.le.RetryPeriod,
		"Interval between two renewals by the leader, and between two tries of a standby (plus up to 1.2x jitter).")
	fs.BoolVar(&f.le.ReleaseOnCancel, "leader-elect-release-on-cancel", f.le.ReleaseOnCancel,
		"Give the Lease up when stopped (SIGTERM), so that a standby takes over at once rather than "+
			"after the lease duration; safe because the process exits as soon as its manager has stopped.")
	fs.BoolVar(&f.enableHTTP2, "enable-http2", false,
		"If set, HTTP/2 will be enabled for the metrics and webhook servers")
	fs.StringVar(&f.cloudProvider, "cloud-provider", "",
		"Cloud API for cloud-backed ExternalIPPools (spec.cloud): "+
			"\"aws\" (region and credentials from the standard AWS configuration chain: "+
			"AWS_REGION, ~/.aws/config, IRSA or the instance profile), or empty to disable them.")
	fs.DurationVar(&f.ctrlOpts.Cloud.RefreshInterval, "cloud-refresh-interval", time.Minute,
		"How often the Nodes' network interfaces are re-read from the cloud.")
	fs.StringVar(&f.ctrlOpts.Cloud.ClusterName, "cloud-cluster-name", "egressip",
		"Value of the egressip.io/cluster tag on the network interfaces the controller creates; "+
			"give each cluster sharing a cloud account its own, so that no controller touches another's.")
	f.zap.BindFlags(fs)
	return f
}

func main() {
	f := bindFlags(flag.CommandLine)
	flag.Parse()

	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&f.zap)))
	ctrlOpts, le, agentTLS := f.ctrlOpts, f.le, f.agentTLS
	if err := errors.Join(controller.CheckFlags(ctrlOpts), le.Check()); err != nil {
		setupLog.Error(err, "Invalid flags")
		os.Exit(2)
	}
	if agentTLS.Namespace == "" {
		setupLog.Error(errors.New("set --agent-ca-namespace or $POD_NAMESPACE"), "No namespace for the agent CA")
		os.Exit(1)
	}
	if agentTLS.Lifetime < 10*time.Minute {
		setupLog.Error(fmt.Errorf("--agent-cert-lifetime %s: want at least 10m", agentTLS.Lifetime),
			"Invalid --agent-cert-lifetime")
		os.Exit(1)
	}
	agentTLS.AgentUser = serviceAccountUser(agentTLS.Namespace, f.agentSA)
	ctrlOpts.AgentTLS = &agentTLS

	webhookServer, metricsServerOptions := serverOptions(f)
	restConfig := ctrl.GetConfigOrDie()
	restConfig.QPS, restConfig.Burst = float32(f.apiQPS), f.apiBurst
	mgrOpts := ctrl.Options{
		Scheme:                  scheme,
		Cache:                   controller.CacheOptions(),
		Metrics:                 metricsServerOptions,
		WebhookServer:           webhookServer,
		HealthProbeBindAddress:  f.probeAddr,
		LeaderElection:          f.enableLeaderElection,
		LeaderElectionID:        "egressip-controller.egressip.io",
		LeaderElectionNamespace: f.leaderElectionNS,
	}
	// Releasing the Lease on cancel is safe because main returns (or exits)
	// as soon as mgr.Start returns: controller-runtime releases it only
	// after the leader-elected runnables stopped (or the graceful-shutdown
	// timeout passed), and nothing of this process acts after that.
	le.Apply(&mgrOpts)
	mgr, err := ctrl.NewManager(restConfig, mgrOpts)
	if err != nil {
		setupLog.Error(err, "Failed to start manager")
		os.Exit(1)
	}

	if f.enableWebhooks {
		if err := egwebhook.Setup(mgr); err != nil {
			setupLog.Error(err, "Failed to set up the validating webhook")
			os.Exit(1)
		}
	}
	switch f.cloudProvider {
	case "":
	case "aws":
		cfg, err := awsconfig.LoadDefaultConfig(context.Background())
		if err != nil {
			setupLog.Error(err, "Failed to load the AWS configuration")
			os.Exit(1)
		}
		p, err := egaws.New(cfg, egaws.Options{Registerer: metrics.Registry})
		if err != nil {
			setupLog.Error(err, "Failed to set up the EC2 client")
			os.Exit(1)
		}
		ctrlOpts.Cloud.Provider = p
	default:
		setupLog.Error(fmt.Errorf("unknown cloud provider %q (want aws or empty)", f.cloudProvider),
			"Invalid --cloud-provider")
		os.Exit(1)
	}
	if err := controller.Setup(mgr, ctrlOpts); err != nil {
		setupLog.Error(err, "Failed to set up the scheduling pass")
		os.Exit(1)
	}
	// +kubebuilder:scaffold:builder

	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		setupLog.Error(err, "Failed to set up health check")
		os.Exit(1)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		setupLog.Error(err, "Failed to set up ready check")
		os.Exit(1)
	}

	setupLog.Info("Starting manager")
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		setupLog.Error(err, "Failed to run manager")
		os.Exit(1)
	}
}

// serverOptions returns the webhook server and the metrics server's
// options the flags ask for: HTTP/2 off unless --enable-http2, the
// certificates from the given directories (else self-signed ones), and
// authentication and authorization of metrics readers with
// --metrics-secure.
func serverOptions(f *controllerFlags) (webhook.Server, metricsserver.Options) {
	var tlsOpts []func(*tls.Config)
	// if the enable-http2 flag is false (the default), http/2 should be disabled
	// due to its vulnerabilities. More specifically, disabling http/2 will
	// prevent from being vulnerable to the HTTP/2 Stream Cancellation and
	// Rapid Reset CVEs. For more information see:
	// - https://github.com/advisories/GHSA-qppj-fm5r-hxr3
	// - https://github.com/advisories/GHSA-4374-p667-p6c8
	disableHTTP2 := func(c *tls.Config) {
		setupLog.Info("Disabling HTTP/2")
		c.NextProtos = []string{"http/1.1"}
	}

	if !f.enableHTTP2 {
		tlsOpts = append(tlsOpts, disableHTTP2)
	}

	// Initial webhook TLS options
	webhookTLSOpts := tlsOpts
	webhookServerOptions := webhook.Options{
		TLSOpts: webhookTLSOpts,
		Port:    f.webhookPort,
	}

	if len(f.webhookCertPath) > 0 {
		setupLog.Info("Initializing webhook certificate watcher using provided certificates",
			"webhook-cert-path", f.webhookCertPath, "webhook-cert-name", f.webhookCertName, "webhook-cert-key", f.webhookCertKey)

		webhookServerOptions.CertDir = f.webhookCertPath
		webhookServerOptions.CertName = f.webhookCertName
		webhookServerOptions.KeyName = f.webhookCertKey
	}

	webhookServer := webhook.NewServer(webhookServerOptions)

	// Metrics endpoint is enabled in 'config/default/kustomization.yaml'. The Metrics options configure the server.
	// More info:
	// - https://pkg.go.dev/sigs.k8s.io/controller-runtime@v0.25.0/pkg/metrics/server
	// - https://book.kubebuilder.io/reference/metrics.html
	metricsServerOptions := metricsserver.Options{
		BindAddress:   f.metricsAddr,
		SecureServing: f.secureMetrics,
		TLSOpts:       tlsOpts,
	}

	if f.secureMetrics {
		// FilterProvider is used to protect the metrics endpoint with authn/authz.
		// These configurations ensure that only authorized users and service accounts
		// can access the metrics endpoint. The RBAC are configured in 'config/rbac/kustomization.yaml'. More info:
		// https://pkg.go.dev/sigs.k8s.io/controller-runtime@v0.25.0/pkg/metrics/filters#WithAuthenticationAndAuthorization
		metricsServerOptions.FilterProvider = filters.WithAuthenticationAndAuthorization
	}

	// If the certificate is not specified, controller-runtime will automatically
	// generate self-signed certificates for the metrics server. While convenient for development and testing,
	// this setup is not recommended for production.
	//
	// TODO(user): If you enable certManager, uncomment the following lines:
	// - [METRICS-WITH-CERTS] at config/default/kustomization.yaml to generate and use certificates
	// managed by cert-manager for the metrics server.
	// - [PROMETHEUS-WITH-CERTS] at config/prometheus/kustomization.yaml for TLS certification.
	if len(f.metricsCertPath) > 0 {
		setupLog.Info("Initializing metrics certificate watcher using provided certificates",
			"metrics-cert-path", f.metricsCertPath, "metrics-cert-name", f.metricsCertName, "metrics-cert-key", f.metricsCertKey)

		metricsServerOptions.CertDir = f.metricsCertPath
		metricsServerOptions.CertName = f.metricsCertName
		metricsServerOptions.KeyName = f.metricsCertKey
	}

	return webhookServer, metricsServerOptions
}

// serviceAccountUser is the user name of service account sa ("name", in
// namespace ns, or "namespace:name"), as the API server records it.
func serviceAccountUser(ns, sa string) string {
	if n, name, ok := strings.Cut(sa, ":"); ok {
		ns, sa = n, name
	}
	return "system:serviceaccount:" + ns + ":" + sa
}
