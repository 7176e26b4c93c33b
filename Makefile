# The release: the chart's appVersion (charts/chart/Chart.yaml), also the
# default image tag.
VERSION ?= $(shell awk -F'"' '/^appVersion:/ { print $$2 }' charts/chart/Chart.yaml)
# Image repository of the one image that holds egressip-controller and
# egressip-agent. IMAGE_REPO:VERSION is the default image of config/ (the
# images: of config/manager and config/agent), dist/install.yaml and the
# chart (manager.image.repository, tag appVersion); test/packaging checks
# that they agree.
IMAGE_REPO ?= ghcr.io/egressip/egressip
# Image URL to use all building/pushing image targets
IMG ?= $(IMAGE_REPO):$(VERSION)

# Get the currently used golang install path (in GOPATH/bin, unless GOBIN is set)
ifeq (,$(shell go env GOBIN))
GOBIN=$(shell go env GOPATH)/bin
else
GOBIN=$(shell go env GOBIN)
endif

# CONTAINER_TOOL defines the container tool to be used for building images.
# Be aware that the target commands are only tested with Docker which is
# scaffolded by default. However, you might want to replace it to use other
# tools. (i.e. podman)
CONTAINER_TOOL ?= docker

# Setting SHELL to bash allows bash commands to be executed by recipes.
# Options are set to exit when a recipe line exits non-zero or a piped command fails.
SHELL = /usr/bin/env bash -o pipefail
.SHELLFLAGS = -ec

.PHONY: all
all: build

##@ General

# The help target prints out all targets with their descriptions organized
# beneath their categories. The categories are represented by '##@' and the
# target descriptions by '##'. The awk command is responsible for reading the
# entire set of makefiles included in this invocation, looking for lines of the
# file as xyz: ## something, and then pretty-format the target and help. Then,
# if there's a line with ##@ something, that gets pretty-printed as a category.
# More info on the usage of ANSI control characters for terminal formatting:
# https://en.wikipedia.org/wiki/ANSI_escape_code#SGR_parameters
# More info on the awk command:
# http://linuxcommand.org/lc3_adv_awk.php

.PHONY: help
help: ## Display this help.
	@awk 'BEGIN {FS = ":.*##"; printf "\nUsage:\n  make \033[36m<target>\033[0m\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-15s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) } ' $(MAKEFILE_LIST)

##@ Development

.PHONY: manifests
manifests: controller-gen ## Generate WebhookConfiguration, ClusterRole and CustomResourceDefinition objects, and the chart's CRD templates from them.
	"$(CONTROLLER_GEN)" rbac:roleName=manager-role crd webhook paths="./api/...;./internal/controller/...;./internal/webhook/..." output:crd:artifacts:config=config/crd/bases
	hack/chart-crds.sh

.PHONY: generate
generate: controller-gen ## Generate code containing DeepCopy, DeepCopyInto, and DeepCopyObject method implementations.
	"$(CONTROLLER_GEN)" object:headerFile="hack/boilerplate.go.txt" paths="./api/...;./internal/controller/..."

.PHONY: fmt
fmt: ## Run go fmt against code.
	go fmt ./...

.PHONY: vet
vet: ## Run go vet against code.
	go vet ./...

.PHONY: test
test: verify-generated vet lint envtest-assets envtest-assets-oldest system-tools helm kustomize ## Check generated files, vet, golangci-lint, then run every test with -race (envtest suites on a real kube-apiserver; agent suites in network namespaces, as root), then the CRD, webhook and controller suites again on the oldest supported kube-apiserver.
	KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS_DIR)" go test -race -count=1 $(GO_TEST_FLAGS) ./...
	$(MAKE) --no-print-directory test-oldest

.PHONY: system-tools
system-tools: ## Fail, naming the Debian package, when a system tool the tests and the demo call (ip) is missing.
	hack/ensure-tools.sh

## Test tiers (hack/test-tier.sh sorts packages by what their tests import).
## `make test` runs all three and more; these run one tier each.
.PHONY: test-unit
test-unit: ## Run the tests that need no root, no kube-apiserver and no network namespaces (a few minutes from a warm cache).
	pkgs="$$(hack/test-tier.sh unit)" && go test -count=1 $(GO_TEST_FLAGS) $$pkgs

.PHONY: test-envtest
test-envtest: envtest-assets helm kustomize ## Run the suites that use a real kube-apiserver (envtest), without root.
	pkgs="$$(hack/test-tier.sh envtest)" && KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS_DIR)" go test -race -count=1 $(GO_TEST_FLAGS) $$pkgs

.PHONY: test-netns
test-netns: envtest-assets system-tools ## Run the suites that use network namespaces and netlink (root), the agent and end-to-end suites among them.
	@if [ "$$(id -u)" != 0 ]; then echo "test-netns needs root (network namespaces, netlink)" >&2; exit 1; fi
	pkgs="$$(hack/test-tier.sh netns)" && KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS_DIR)" go test -race -count=1 $(GO_TEST_FLAGS) $$pkgs

.PHONY: test-e2e
test-e2e: ## Run only the end-to-end suite (root): real controller and agents in network namespaces; logs with E2E_VERBOSE=1.
	go test -count=1 -v -timeout 20m ./test/e2e/

.PHONY: verify-generated
verify-generated: controller-gen kustomize ## Fail when `make generate manifests build-installer` would change files, or gofmt would.
	hack/verify-generated.sh

.PHONY: lint
lint: golangci-lint ## Run golangci-lint linter
	"$(GOLANGCI_LINT)" run

.PHONY: lint-fix
lint-fix: golangci-lint ## Run golangci-lint linter and perform fixes
	"$(GOLANGCI_LINT)" run --fix

.PHONY: funclen
funclen: ## List the 10 longest non-test functions (golangci-lint's funlen holds each to 150 lines).
	go run ./hack/funclen -n 10 .

.PHONY: lint-config
lint-config: golangci-lint ## Verify golangci-lint linter configuration
	"$(GOLANGCI_LINT)" config verify

##@ Build

.PHONY: build
build: manifests generate fmt vet ## Build egressip-controller and egressip-agent into bin/.
	go build -o bin/egressip-controller ./cmd/controller
	go build -o bin/egressip-agent ./cmd/agent

.PHONY: build-bins
build-bins: ## Build egressip-controller, egressip-agent and the demo into bin/ (no code generation).
	go build -o bin/egressip-controller ./cmd/controller
	go build -o bin/egressip-agent ./cmd/agent
	go build -o bin/egressip-demo ./test/e2e/demo

.PHONY: demo
demo: build-bins envtest-assets kubectl system-tools ## Run egressip end to end on this machine (root): control plane, controller, agents and Pods in network namespaces, an external server showing the Pods' source addresses. DEMO_ARGS="--keep" keeps it up.
	bin/egressip-demo $(DEMO_ARGS)

.PHONY: run
run: manifests generate fmt vet ## Run the controller from your host against ~/.kube/config.
	go run ./cmd/controller

# If you wish to build the manager image targeting other platforms you can use the --platform flag.
# (i.e. docker build --platform linux/arm64). However, you must enable docker buildKit for it.
# More info: https://docs.docker.com/develop/develop-images/build_enhancements/
# Override BASE_IMAGE to build from another registry, e.g.
# make docker-build IMG=<img> BASE_IMAGE=docker.io/library/golang:1.26
.PHONY: docker-build
docker-build: ## Build docker image with the manager.
	$(CONTAINER_TOOL) build $(if $(BASE_IMAGE),--build-arg BASE_IMAGE=$(BASE_IMAGE)) -t ${IMG} .

.PHONY: docker-push
docker-push: ## Push docker image with the manager.
	$(CONTAINER_TOOL) push ${IMG}

# PLATFORMS defines the target platforms for the manager image be built to provide support to multiple
# architectures. (i.e. make docker-buildx IMG=myregistry/mypoperator:0.0.1). To use this option you need to:
# - be able to use docker buildx. More info: https://docs.docker.com/build/buildx/
# - have enabled BuildKit. More info: https://docs.docker.com/develop/develop-images/build_enhancements/
# - be able to push the image to your registry (i.e. if you do not set a valid value via IMG=<myregistry/image:<tag>> then the export will fail)
# To adequately provide solutions that are compatible with multiple platforms, you should consider using this option.
PLATFORMS ?= linux/arm64,linux/amd64,linux/s390x,linux/ppc64le
.PHONY: docker-buildx
docker-buildx: ## Build and push docker image for the manager for cross-platform support
	# copy existing Dockerfile and insert --platform=${BUILDPLATFORM} into Dockerfile.cross, and preserve the original Dockerfile
	sed -e '1 s/\(^FROM\)/FROM --platform=\$$\{BUILDPLATFORM\}/; t' -e ' 1,// s//FROM --platform=\$$\{BUILDPLATFORM\}/' Dockerfile > Dockerfile.cross
	- $(CONTAINER_TOOL) buildx create --name egressip-builder
	$(CONTAINER_TOOL) buildx use egressip-builder
	- $(CONTAINER_TOOL) buildx build --push --platform=$(PLATFORMS) $(if $(BASE_IMAGE),--build-arg BASE_IMAGE=$(BASE_IMAGE)) --tag ${IMG} -f Dockerfile.cross .
	- $(CONTAINER_TOOL) buildx rm egressip-builder
	rm Dockerfile.cross

## build-installer sets IMG in a temporary copy of config/ (hack/kustomize-build.sh):
## with the default IMG it changes no tracked file on a clean checkout.
.PHONY: build-installer
build-installer: manifests generate kustomize ## Generate dist/install.yaml (CRDs and deployment) for image IMG (default IMAGE_REPO:VERSION).
	mkdir -p dist
	hack/kustomize-build.sh "$(KUSTOMIZE)" "$(IMG)" > dist/install.yaml.tmp
	mv dist/install.yaml.tmp dist/install.yaml

## The chart is generated from dist/install.yaml by kubebuilder's helm/v2-alpha
## plugin. Chart.yaml, values.yaml, values.schema.json, _helpers.tpl and
## NOTES.txt are ours and kept by the plugin. The plugin renders the agent
## DaemonSet as a static template (templates/extras/agent.yaml); we replace it
## with templates/agent/daemonset.yaml, which reads the agent's settings from
## values.yaml. test/packaging checks that both installs agree.
.PHONY: print-IMG
print-IMG: ## Print the image build-installer and docker-build use (default IMAGE_REPO:VERSION).
	@echo "$(IMG)"

.PHONY: helm-chart
helm-chart: build-installer kubebuilder ## Regenerate charts/chart from dist/install.yaml (kubebuilder helm/v2-alpha).
	"$(KUBEBUILDER)" edit --plugins=helm/v2-alpha --output-dir=charts
	rm -f charts/chart/templates/extras/agent.yaml charts/chart/templates/extras/agent-metrics.yaml
	@# Without cert-manager the chart makes the webhook certificate itself
	@# (hand-written templates/webhook-certs/): mount the Secret whenever the
	@# webhook is on, and give the webhook configuration its caBundle.
	sed -i 's/if and \.Values\.certManager\.enabled \.Values\.webhook\.enabled }}/if .Values.webhook.enabled }}/' $(HELM_MANAGER_TPL)
	sed -i 's/^  clientConfig:$$/  clientConfig:\n    {{- with include "egressip.webhookCABundle" $$ }}\n    caBundle: {{ . }}\n    {{- end }}/' $(HELM_WEBHOOK_TPL)
	@test "$$(grep -c 'if .Values.webhook.enabled }}' $(HELM_MANAGER_TPL))" -ge 4 && ! grep -q 'certManager' $(HELM_MANAGER_TPL) \
		|| { echo "$(HELM_MANAGER_TPL): the webhook certificate conditions changed, update the helm-chart target"; exit 1; }
	@test "$$(grep -c 'egressip.webhookCABundle' $(HELM_WEBHOOK_TPL))" = "$$(grep -c '^  clientConfig:$$' $(HELM_WEBHOOK_TPL))" \
		|| { echo "$(HELM_WEBHOOK_TPL): caBundle not inserted under every clientConfig, update the helm-chart target"; exit 1; }
	@# Hand-written templates the plugin must leave in place.
	@for f in agent/daemonset.yaml namespace/namespace.yaml checks.yaml _checks.tpl; do test -f charts/chart/templates/$$f \
		|| { echo "charts/chart/templates/$$f is gone after the plugin: restore it (git checkout)"; exit 1; }; done
	@# The default image is IMAGE_REPO with tag appVersion in all three installs.
	@grep -qx '    repository: $(IMAGE_REPO)' charts/chart/values.yaml \
		|| { echo "charts/chart/values.yaml: manager.image.repository is not $(IMAGE_REPO) (IMAGE_REPO), update it"; exit 1; }
	@# The plugin also scaffolds a kind-based GitHub workflow; keep it only if the project tracks one.
	git ls-files --error-unmatch .github/workflows/test-chart.yml >/dev/null 2>&1 || rm -f .github/workflows/test-chart.yml
	rmdir .github/workflows .github 2>/dev/null || true

HELM_MANAGER_TPL := charts/chart/templates/manager/manager.yaml
HELM_WEBHOOK_TPL := charts/chart/templates/webhook/validating-webhook-configuration.yaml

.PHONY: helm-lint
helm-lint: helm ## helm lint and helm template the chart (with and without cert-manager).
	"$(HELM_BIN)" lint --strict charts/chart
	"$(HELM_BIN)" lint --strict charts/chart --set certManager.enabled=false
	"$(HELM_BIN)" template egressip charts/chart --namespace egressip-system > /dev/null
	"$(HELM_BIN)" template egressip charts/chart --namespace egressip-system --set certManager.enabled=false > /dev/null

##@ Deployment

ifndef ignore-not-found
  ignore-not-found = false
endif

.PHONY: install
install: manifests kustomize ## Install CRDs into the K8s cluster specified in ~/.kube/config.
	@out="$$( "$(KUSTOMIZE)" build config/crd 2>/dev/null || true )"; \
	if [ -n "$$out" ]; then echo "$$out" | "$(KUBECTL)" apply -f -; else echo "No CRDs to install; skipping."; fi

.PHONY: uninstall
uninstall: manifests kustomize ## Uninstall CRDs from the K8s cluster specified in ~/.kube/config. Call with ignore-not-found=true to ignore resource not found errors during deletion.
	@out="$$( "$(KUSTOMIZE)" build config/crd 2>/dev/null || true )"; \
	if [ -n "$$out" ]; then echo "$$out" | "$(KUBECTL)" delete --ignore-not-found=$(ignore-not-found) -f -; else echo "No CRDs to delete; skipping."; fi

.PHONY: deploy
deploy: manifests kustomize ## Deploy controller to the K8s cluster specified in ~/.kube/config.
	hack/kustomize-build.sh "$(KUSTOMIZE)" "$(IMG)" | "$(KUBECTL)" apply --server-side -f -

.PHONY: undeploy
undeploy: kustomize ## Undeploy controller from the K8s cluster specified in ~/.kube/config. Call with ignore-not-found=true to ignore resource not found errors during deletion.
	"$(KUSTOMIZE)" build config/default | "$(KUBECTL)" delete --ignore-not-found=$(ignore-not-found) -f -

##@ Dependencies

## Location to install dependencies to
LOCALBIN ?= $(shell pwd)/bin
$(LOCALBIN):
	mkdir -p "$(LOCALBIN)"

## Tool Binaries
KUBECTL ?= kubectl
KIND ?= kind
KUSTOMIZE ?= $(LOCALBIN)/kustomize
HELM_BIN ?= $(LOCALBIN)/helm
KUBEBUILDER ?= $(LOCALBIN)/kubebuilder
CONTROLLER_GEN ?= $(LOCALBIN)/controller-gen

## Tool Versions
KUSTOMIZE_VERSION ?= v5.8.1
HELM_VERSION ?= v3.22.0
KUBEBUILDER_VERSION ?= v4.16.0
CONTROLLER_TOOLS_VERSION ?= v0.23.0

## golangci-lint with the logcheck plugin (Kubernetes' structured-logging
## checks), built from hack/golangci-lint, whose go.mod pins both versions;
## the file name carries them, so a new pin builds a new binary. Named
## golangci-lint-logcheck-*, never golangci-lint: a plain golangci-lint in
## bin/ is left alone.
GOLANGCI_LINT_MOD_DIR := $(shell pwd)/hack/golangci-lint
GOLANGCI_LINT_VERSION := $(shell awk '$$1 == "github.com/golangci/golangci-lint/v2" { print $$2; exit }' hack/golangci-lint/go.mod)
LOGTOOLS_VERSION := $(shell awk '$$1 == "sigs.k8s.io/logtools" { print $$2; exit }' hack/golangci-lint/go.mod)
GOLANGCI_LINT = $(LOCALBIN)/golangci-lint-logcheck-$(GOLANGCI_LINT_VERSION)-logtools-$(LOGTOOLS_VERSION)
.PHONY: kustomize
kustomize: $(KUSTOMIZE) ## Download kustomize locally if necessary.
$(KUSTOMIZE): $(LOCALBIN)
	$(call go-install-tool,$(KUSTOMIZE),sigs.k8s.io/kustomize/kustomize/v5,$(KUSTOMIZE_VERSION))

.PHONY: helm
helm: $(HELM_BIN) ## Download helm locally if necessary (built from the Go module proxy).
$(HELM_BIN): $(LOCALBIN)
	$(call go-install-tool,$(HELM_BIN),helm.sh/helm/v3/cmd/helm,$(HELM_VERSION))

.PHONY: kubebuilder
kubebuilder: $(KUBEBUILDER) ## Download the kubebuilder CLI locally if necessary (for its helm/v2-alpha plugin).
$(KUBEBUILDER): $(LOCALBIN)
	$(call go-install-tool,$(KUBEBUILDER),sigs.k8s.io/kubebuilder/v4,$(KUBEBUILDER_VERSION))

.PHONY: controller-gen
controller-gen: $(CONTROLLER_GEN) ## Download controller-gen locally if necessary.
$(CONTROLLER_GEN): $(LOCALBIN)
	$(call go-install-tool,$(CONTROLLER_GEN),sigs.k8s.io/controller-tools/cmd/controller-gen,$(CONTROLLER_TOOLS_VERSION))

## envtest control plane, built from source: no download site for envtest
## binaries is reachable from our machines. The versions are pinned in one
## place, hack/envtest/go.mod (k8s.io/kubernetes and go.etcd.io/etcd/server/v3).
ENVTEST_MOD_DIR := $(shell pwd)/hack/envtest
ENVTEST_K8S_VERSION := $(shell awk '$$1 == "k8s.io/kubernetes" { print $$2; exit }' hack/envtest/go.mod)
ENVTEST_ETCD_VERSION := $(shell awk '$$1 == "go.etcd.io/etcd/server/v3" { print $$2; exit }' hack/envtest/go.mod)
ENVTEST_K8S_MINOR := $(word 2,$(subst ., ,$(ENVTEST_K8S_VERSION)))
## KUBEBUILDER_ASSETS, when set, names a directory with kube-apiserver and etcd to use instead.
ifdef KUBEBUILDER_ASSETS
ENVTEST_ASSETS_DIR := $(KUBEBUILDER_ASSETS)
else
ENVTEST_ASSETS_DIR := $(LOCALBIN)/k8s/$(ENVTEST_K8S_VERSION:v%=%)-etcd$(ENVTEST_ETCD_VERSION:v%=%)
endif
ENVTEST_APISERVER_LDFLAGS := -s -w \
	-X k8s.io/component-base/version.gitVersion=$(ENVTEST_K8S_VERSION) \
	-X k8s.io/component-base/version.gitMajor=1 \
	-X k8s.io/component-base/version.gitMinor=$(ENVTEST_K8S_MINOR) \
	-X k8s.io/component-base/version.gitTreeState=clean \
	-X k8s.io/client-go/pkg/version.gitVersion=$(ENVTEST_K8S_VERSION)

.PHONY: kubectl
kubectl: $(ENVTEST_ASSETS_DIR)/kubectl ## Build kubectl (same Kubernetes version) into bin/k8s/, for make demo.

$(ENVTEST_ASSETS_DIR)/kubectl:
	@echo "Building kubectl $(ENVTEST_K8S_VERSION) from source into $(@D)..."
	@mkdir -p "$(@D)"
	cd "$(ENVTEST_MOD_DIR)" && CGO_ENABLED=0 go build -trimpath -ldflags "$(ENVTEST_APISERVER_LDFLAGS)" -o "$@.tmp" k8s.io/kubernetes/cmd/kubectl
	mv "$@.tmp" "$@"

.PHONY: envtest-assets
envtest-assets: $(ENVTEST_ASSETS_DIR)/kube-apiserver $(ENVTEST_ASSETS_DIR)/etcd ## Build kube-apiserver and etcd for envtest into bin/k8s/ (10-15 minutes the first time, then reused).

$(ENVTEST_ASSETS_DIR)/kube-apiserver:
	@echo "Building kube-apiserver $(ENVTEST_K8S_VERSION) from source into $(@D) (first time: 10-15 minutes)..."
	@mkdir -p "$(@D)"
	cd "$(ENVTEST_MOD_DIR)" && CGO_ENABLED=0 go build -trimpath -ldflags "$(ENVTEST_APISERVER_LDFLAGS)" -o "$@.tmp" k8s.io/kubernetes/cmd/kube-apiserver
	mv "$@.tmp" "$@"

$(ENVTEST_ASSETS_DIR)/etcd:
	@echo "Building etcd $(ENVTEST_ETCD_VERSION) from source into $(@D)..."
	@mkdir -p "$(@D)"
	cd "$(ENVTEST_MOD_DIR)" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$@.tmp" go.etcd.io/etcd/server/v3
	mv "$@.tmp" "$@"

## The oldest supported Kubernetes release (docs/install.md: why this one).
## `make test` runs the CRD validation, webhook and controller envtest suites
## against it a second time. Pinned in hack/envtest-oldest/go.mod; etcd is the
## one built above (the etcd v3 API kube-apiserver uses is stable across them).
ENVTEST_OLDEST_MOD_DIR := $(shell pwd)/hack/envtest-oldest
ENVTEST_OLDEST_K8S_VERSION := $(shell awk '$$1 == "require" && $$2 == "k8s.io/kubernetes" { print $$3; exit }' hack/envtest-oldest/go.mod)
ENVTEST_OLDEST_K8S_MINOR := $(word 2,$(subst ., ,$(ENVTEST_OLDEST_K8S_VERSION)))
ENVTEST_OLDEST_ASSETS_DIR := $(LOCALBIN)/k8s/$(ENVTEST_OLDEST_K8S_VERSION:v%=%)-etcd$(ENVTEST_ETCD_VERSION:v%=%)
## The packages whose envtest suites concern the CRDs, the webhook and the
## controller; the agent suites (netlink) are not repeated.
ENVTEST_OLDEST_PKGS ?= ./api/... ./internal/controller/... ./internal/webhook/...
ENVTEST_OLDEST_APISERVER_LDFLAGS := -s -w \
	-X k8s.io/component-base/version.gitVersion=$(ENVTEST_OLDEST_K8S_VERSION) \
	-X k8s.io/component-base/version.gitMajor=1 \
	-X k8s.io/component-base/version.gitMinor=$(ENVTEST_OLDEST_K8S_MINOR) \
	-X k8s.io/component-base/version.gitTreeState=clean \
	-X k8s.io/client-go/pkg/version.gitVersion=$(ENVTEST_OLDEST_K8S_VERSION)

.PHONY: envtest-assets-oldest
envtest-assets-oldest: $(ENVTEST_OLDEST_ASSETS_DIR)/kube-apiserver $(ENVTEST_OLDEST_ASSETS_DIR)/etcd ## Build the oldest supported kube-apiserver for envtest into bin/k8s/ (about 15 minutes the first time, then reused).

$(ENVTEST_OLDEST_ASSETS_DIR)/kube-apiserver:
	@echo "Building kube-apiserver $(ENVTEST_OLDEST_K8S_VERSION) from source into $(@D) (first time: about 15 minutes)..."
	@mkdir -p "$(@D)"
	cd "$(ENVTEST_OLDEST_MOD_DIR)" && CGO_ENABLED=0 go build -trimpath -ldflags "$(ENVTEST_OLDEST_APISERVER_LDFLAGS)" -o "$@.tmp" k8s.io/kubernetes/cmd/kube-apiserver
	mv "$@.tmp" "$@"

$(ENVTEST_OLDEST_ASSETS_DIR)/etcd: $(ENVTEST_ASSETS_DIR)/etcd
	@mkdir -p "$(@D)"
	cp "$<" "$@.tmp"
	mv "$@.tmp" "$@"

.PHONY: test-oldest
test-oldest: envtest-assets-oldest ## Run the CRD, webhook and controller envtest suites against the oldest supported kube-apiserver.
	KUBEBUILDER_ASSETS="$(ENVTEST_OLDEST_ASSETS_DIR)" go test -race -count=1 $(GO_TEST_FLAGS) $(ENVTEST_OLDEST_PKGS)

.PHONY: golangci-lint
golangci-lint: $(GOLANGCI_LINT) ## Build golangci-lint with the logcheck plugin into bin/ if necessary (from the Go module proxy; a few minutes the first time).
$(GOLANGCI_LINT): | $(LOCALBIN)
	@echo "Building golangci-lint $(GOLANGCI_LINT_VERSION) with logcheck $(LOGTOOLS_VERSION) into $(LOCALBIN)..."
	cd "$(GOLANGCI_LINT_MOD_DIR)" && go build -trimpath -o "$@.tmp" .
	mv "$@.tmp" "$@"
	ln -sf "$$(basename "$@")" "$(LOCALBIN)/golangci-lint-logcheck"

# go-install-tool will 'go install' any package with custom target and name of binary, if it doesn't exist
# $1 - target path with name of binary
# $2 - package url which can be installed
# $3 - specific version of package
define go-install-tool
@[ -f "$(1)-$(3)" ] && [ "$$(readlink -- "$(1)" 2>/dev/null)" = "$(1)-$(3)" ] || { \
set -e; \
package=$(2)@$(3) ;\
echo "Downloading $${package}" ;\
rm -f "$(1)" ;\
GOBIN="$(LOCALBIN)" go install $${package} ;\
mv "$(LOCALBIN)/$$(basename "$(1)")" "$(1)-$(3)" ;\
} ;\
ln -sf "$$(realpath "$(1)-$(3)")" "$(1)"
endef

define gomodver
$(shell go list -m -f '{{if .Replace}}{{.Replace.Version}}{{else}}{{.Version}}{{end}}' $(1) 2>/dev/null)
endef

##@ Helm Deployment

## Helm binary to use for deploying the chart
HELM ?= $(HELM_BIN)
## Namespace to deploy the Helm release
HELM_NAMESPACE ?= egressip-system
## Name of the Helm release
HELM_RELEASE ?= egressip
## Path to the Helm chart directory
HELM_CHART_DIR ?= charts/chart
## Additional arguments to pass to helm commands
HELM_EXTRA_ARGS ?=

.PHONY: helm-deploy
## The chart creates the namespace, labelled for Pod Security "privileged"
## (namespace.create); Helm's --create-namespace would create it unlabelled.
helm-deploy: ## Deploy manager to the K8s cluster via Helm. Specify an image with IMG.
	IMG="$(IMG)"; $(HELM) upgrade --install $(HELM_RELEASE) $(HELM_CHART_DIR) \
		--namespace $(HELM_NAMESPACE) \
		--set namespace.create=true \
		--set manager.image.repository=$${IMG%:*} \
		--set manager.image.tag=$${IMG##*:} \
		--wait \
		--timeout 5m \
		$(HELM_EXTRA_ARGS)

.PHONY: helm-uninstall
helm-uninstall: ## Uninstall the Helm release from the K8s cluster.
	$(HELM) uninstall $(HELM_RELEASE) --namespace $(HELM_NAMESPACE)

.PHONY: helm-status
helm-status: ## Show Helm release status.
	$(HELM) status $(HELM_RELEASE) --namespace $(HELM_NAMESPACE)

.PHONY: helm-history
helm-history: ## Show Helm release history.
	$(HELM) history $(HELM_RELEASE) --namespace $(HELM_NAMESPACE)

.PHONY: helm-rollback
helm-rollback: ## Rollback to previous Helm release.
	$(HELM) rollback $(HELM_RELEASE) --namespace $(HELM_NAMESPACE)
