# buildkite-operator: build, generate, lint, test, demo.
#
# Every target installs what it needs when it is missing: Debian packages through
# apt-get, Go tools and the Kubernetes binaries built from the Go module proxy into
# .cache/ (ignored by git), keyed by version so that they are built once.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := build

KUBE_VERSION   ?= v1.35.4
ETCD_VERSION   ?= v3.6.6
AGENT_VERSION  ?= v3.138.1
CONTROLLER_TOOLS_VERSION ?= v0.20.0
STATICCHECK_VERSION ?= v0.8.2
HELM_VERSION ?= v3.20.2
KWOK_VERSION ?= v0.8.0
# The local node's container runtime (tests/tools/containerd pins the same version).
CONTAINERD_VERSION ?= v2.4.2

CACHE     ?= $(CURDIR)/.cache
BIN       := $(CURDIR)/bin
# Steps that fetch from the Go module proxy run through it, up to three times.
RETRY     := $(CURDIR)/tests/tools/retry.sh
TOOLS     := $(CACHE)/tools
KUBE_BIN  := $(CACHE)/kube-$(KUBE_VERSION)
ETCD_BIN  := $(CACHE)/etcd-$(ETCD_VERSION)
CONTAINERD_BIN := $(CACHE)/containerd-$(CONTAINERD_VERSION)
# The real agent, built once without cgo: it runs on the host for the tests, in the operator's
# image, and in job images that may lack glibc (one build instead of two saves CI ~4 minutes).
AGENT_BIN := $(CACHE)/buildkite-agent-$(AGENT_VERSION)-static
# envtest wants kube-apiserver, etcd and kubectl in one folder.
ENVTEST_ASSETS := $(CACHE)/envtest-$(KUBE_VERSION)-$(ETCD_VERSION)

CONTROLLER_GEN := $(TOOLS)/controller-gen-$(CONTROLLER_TOOLS_VERSION)
STATICCHECK    := $(TOOLS)/staticcheck-$(STATICCHECK_VERSION)
HELM           := $(TOOLS)/helm-$(HELM_VERSION)
KWOK           := $(TOOLS)/kwok-$(KWOK_VERSION)
export KWOK
CHART          := charts/buildkite-operator
export HELM

# -s -w: no symbol table or DWARF, which nothing here reads; each link takes about half as
# long (kube-scheduler: 8.6 -> 4.8 s), which a cold CI run pays for a dozen binaries.
KUBE_LDFLAGS := -s -w -X k8s.io/component-base/version.gitVersion=$(KUBE_VERSION) \
	-X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=35

export KUBEBUILDER_ASSETS := $(ENVTEST_ASSETS)
export BUILDKITE_AGENT_BINARY := $(AGENT_BIN)/buildkite-agent

# The operator image: its version (the agentd version and the image label) and reference.
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)
IMAGE    ?= ghcr.io/buildkite-operator/buildkite-operator:$(VERSION)
IMAGE_TAR ?= $(CACHE)/images/operator.tar

.PHONY: build release-binaries generate lint test test-unit test-unit-deps e2e-deps e2e-tests test-deps demo envtest-assets agent-binary image image-push helm kwok bench bench-retention chart install-manifest fuzz cluster-binaries clean \
	node-deps cluster-up cluster-down cluster-status images compose-images test-e2e soak help release

## build: the agentd and agentd-supervise binaries into bin/
build:
	go build -o $(BIN)/agentd ./cmd/agentd
	go build -o $(BIN)/agentd-supervise ./cmd/agentd-supervise

## release-binaries: agentd and agentd-supervise as the image ships them (static, stripped),
## into bin/linux/
release-binaries:
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=$(VERSION)" -o $(BIN)/linux/agentd ./cmd/agentd
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o $(BIN)/linux/agentd-supervise ./cmd/agentd-supervise

## generate: deepcopy and CRDs from the API types (never edit their output by hand)
generate: $(CONTROLLER_GEN)
	$(CONTROLLER_GEN) object paths=./pkg/apis/...
	$(CONTROLLER_GEN) crd paths=./pkg/apis/... output:crd:artifacts:config=crds
	$(CONTROLLER_GEN) rbac:roleName=buildkite-operator paths="./pkg/...;./cmd/agentd/..." output:rbac:artifacts:config=charts/buildkite-operator/files/rbac

## lint: gofmt, go mod tidy, go vet and staticcheck
lint: $(STATICCHECK)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	@go mod tidy -diff || { echo "go.mod or go.sum is not tidy: run 'go mod tidy' and commit the result"; exit 1; }
	go vet ./...
	$(STATICCHECK) ./...

## test: everything CI runs (the README's test command), as root: the unit tests and the
## end-to-end tests on a local node. A cold run builds its tools two at a time (the kube
## binaries one after another, beside etcd, the agent, helm and the rest), then builds what
## the node needs (kubelet, controller manager, kwok, images) while lint and the unit tests
## run, and runs the end-to-end tests as soon as that is built, beside the unit tests: both
## spend much of their time waiting (on their API servers, on pods), and one after the
## other they took a cold run to 48 minutes.
test:
	$(MAKE) --no-print-directory -j2 test-unit-deps
	$(MAKE) --no-print-directory -j2 test-unit test-e2e

test-unit-deps: envtest-assets agent-binary test-deps helm $(KUBE_BIN)/kube-scheduler $(CONTROLLER_GEN) $(STATICCHECK)

## test-unit: generated files, lint and every package's tests on envtest; no root needed
## (the end-to-end packages and the bench's kwok run skip: test-e2e runs them)
test-unit: test-unit-deps
	$(MAKE) --no-print-directory generate
	@if [ -n "$$(git status --porcelain -- crds pkg/apis charts/buildkite-operator/files/rbac)" ]; then \
		echo "make generate changed committed files: run 'make generate' and commit the result"; \
		git status --porcelain -- crds pkg/apis charts/buildkite-operator/files/rbac; git diff --stat -- crds pkg/apis charts/buildkite-operator/files/rbac; exit 1; fi
	$(MAKE) --no-print-directory lint
	# -s -w: each of the 56 test binaries links 1-2 s faster without a symbol table and
	# DWARF (stack traces keep their names and lines: they come from the pclntab).
	go test -count=1 -timeout 30m -ldflags "-s -w" ./...
	# The agent's tools module (its version kept in step with go.mod, and the zzglob stand-in)
	# is a module of its own, which ./... leaves out.
	cd tests/tools/agent && go test -count=1 ./... && cd zzglob && go test -count=1 ./...

## test-deps: the Debian tools the plugin's tests run (bats suite, shellcheck, docker-compose config)
TEST_DEBS := bats bats-assert bats-support shellcheck docker-compose
# tests/images builds the job image from the host's static busybox.
TEST_DEBS += busybox-static
# The job image gets the host's ssh client; the private-repository tests (pkg/podbuilder,
# tests/images, tests/gitrepo) make keys with ssh-keygen and serve a repository from sshd.
TEST_DEBS += openssh-client openssh-server
# tests/compose runs docker-compose.yml on a Docker engine of its own (dockerd from docker.io,
# started by the test with its state under .cache/docker; it skips, saying why, without it).
TEST_DEBS += docker.io
test-deps:
	@missing=$$(for p in $(TEST_DEBS); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$missing; fi

## helm: the helm CLI, built from the Go module proxy into .cache/tools (about 9 minutes, once)
helm: $(HELM)

$(HELM):
	mkdir -p $(TOOLS)
	cd tests/tools/helm && $(RETRY) go build -trimpath -ldflags "-s -w" -o $@.tmp helm.sh/helm/v3/cmd/helm && mv $@.tmp $@

## kwok: the Kubernetes simulator of nodes, for the scale bench, built into .cache/tools
kwok: $(KWOK)

$(KWOK):
	mkdir -p $(TOOLS)
	cd tests/tools/kwok && $(RETRY) go build -trimpath -ldflags "-s -w" -o $@.tmp sigs.k8s.io/kwok/cmd/kwok && mv $@.tmp $@

## bench: every figure of issue 27, and issue 28's warm pickup, from one command: first dispatch → accepted, polling and
## streaming side by side (envtest and the fake Buildkite with its 10 s ping interval, 8 slots,
## 20 jobs 2-6 s apart; BENCH_DISPATCH=full|check|off), then jobs per second, phase latencies
## against a bare-pod floor, API requests per job and agentd's RSS, for BENCH_SIZES jobs in
## flight on BENCH_BACKEND (kwok: a real API server with simulated nodes; node: the local node,
## as root), then BENCH_NODE_SIZES on the local node (root; skipped, saying why, otherwise),
## the supervisor's log streaming CPU against the gzip floor, the retention run
## (BENCH_RETENTION_JOBS=0 skips it), with BENCH_BASELINE=<commit> the throughput comparison with
## that commit, and the targets table. Printed and written to
## .cache/bench.json. BENCH_RUNS runs each (min / median / max); BENCH_RATE=0.5x adds the open
## loop. docs/performance.md has the figures.
BENCH_SIZES   ?= 10,100,1000
BENCH_BACKEND ?= kwok
BENCH_RUNS    ?= 3
BENCH_RATE    ?=
BENCH_DISPATCH ?= full
BENCH_NODE_SIZES ?= 1,10
BENCH_RETENTION_JOBS  ?= 10000
BENCH_RETENTION_RATE  ?= 5
BENCH_RETENTION_SLOTS ?= 50
# BENCH_BASELINE=<commit> (a tag or hash): the throughput target's comparison, this checkout's
# agentd against that commit's (built from `git archive` into .cache/baseline-<commit>), in
# turn, BENCH_RUNS runs each on kwok at 100 in flight; none when empty.
BENCH_BASELINE ?=
BASELINE_AGENTD = $(CACHE)/baseline-$(BENCH_BASELINE)/agentd
$(CACHE)/baseline-%/agentd:
	rm -rf $(CACHE)/baseline-$*/src && mkdir -p $(CACHE)/baseline-$*/src
	git archive $* | tar -x -C $(CACHE)/baseline-$*/src
	cd $(CACHE)/baseline-$*/src && pkg=./cmd/agentd && { [ -d cmd/agentd ] || pkg=./agentd; } && \
		CGO_ENABLED=0 $(RETRY) go build -trimpath -ldflags "-s -w" -o $@.tmp $$pkg && mv $@.tmp $@
# The node's prerequisites only as root: otherwise the bench skips the node rows and says why.
BENCH_NODE_DEPS = $(if $(and $(BENCH_NODE_SIZES),$(filter 0,$(shell id -u))),node-deps cluster-binaries images)
bench: envtest-assets kwok release-binaries $(KUBE_BIN)/kube-scheduler $(KUBE_BIN)/kube-controller-manager $(if $(filter node,$(BENCH_BACKEND)),node-deps cluster-binaries images) $(BENCH_NODE_DEPS) $(if $(BENCH_BASELINE),$(BASELINE_AGENTD))
	go run ./tests/bench/cmd/bench -backend $(BENCH_BACKEND) -sizes '$(BENCH_SIZES)' -runs $(BENCH_RUNS) -dispatch $(BENCH_DISPATCH) $(if $(BENCH_RATE),-rate $(BENCH_RATE)) \
		$(if $(BENCH_BASELINE),-baseline-agentd $(BASELINE_AGENTD)) \
		-node-sizes '$(BENCH_NODE_SIZES)' -supervisor $(BIN)/linux/agentd-supervise -supervisor-runs $(BENCH_RUNS) \
		-then-retention -retention-jobs $(BENCH_RETENTION_JOBS) -retention-rate $(BENCH_RETENTION_RATE) -retention-slots $(BENCH_RETENTION_SLOTS) \
		-agentd $(BIN)/linux/agentd -json $(CACHE)/bench.json

## bench-retention: BENCH_RETENTION_JOBS jobs at BENCH_RETENTION_RATE a second through BENCH_RETENTION_SLOTS
## slots on kwok, with the default retention: agentd's memory and the BuildJobs kept, over time
bench-retention: envtest-assets kwok release-binaries $(KUBE_BIN)/kube-scheduler $(KUBE_BIN)/kube-controller-manager
	go run ./tests/bench/cmd/bench -sizes $(BENCH_RETENTION_SLOTS) -retention-jobs $(BENCH_RETENTION_JOBS) -retention-rate $(BENCH_RETENTION_RATE) -agentd $(BIN)/linux/agentd -json $(CACHE)/bench-retention.json

## chart: helm lint, and deploy/install.yaml rendered again from the chart
chart: helm
	$(HELM) lint --strict $(CHART)
	$(MAKE) --no-print-directory install-manifest

## install-manifest: deploy/install.yaml, the plain-manifest install, rendered from the chart
## without its Helm hooks: kubectl ignores hook annotations and would run the pre-delete drain
## Job at install (docs/install.md says how to drain by hand before deleting the manifest)
install-manifest: helm
	{ echo "# The plain-manifest install of buildkite-operator, rendered from charts/buildkite-operator"; \
	  echo "# by 'make install-manifest' (helm template --no-hooks, default values, namespace buildkite)."; \
	  echo "# Never edit it by hand; docs/install.md says how to use it, and how to uninstall it."; \
	  $(HELM) template buildkite-operator $(CHART) --namespace buildkite --include-crds --no-hooks 2>/dev/null; } > deploy/install.yaml

## fuzz: every fuzz target for FUZZTIME (1m) each; a finding is written to the package's
## testdata/fuzz and fails the target (commit it with the fix: it becomes a regression case)
FUZZTIME ?= 1m
FUZZ_TARGETS := ./plugin:FuzzFromJob ./plugin:FuzzStripOperatorPlugin ./pkg/spawner:FuzzBuildJobFor \
	./pkg/redact:FuzzRedactStream ./pkg/redact:FuzzValues ./pkg/logstream:FuzzStream \
	./pkg/supervisor:FuzzConfigFromEnv ./pkg/jobprogress:FuzzDecode ./pkg/podbuilder:FuzzBuildWithoutAllows
fuzz:
	@for t in $(FUZZ_TARGETS); do pkg=$${t%%:*}; fn=$${t##*:}; echo "== $$fn ($$pkg)"; \
		go test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; done

## image: the operator image (static agentd and agentd-supervise, non-root) as a tarball,
## IMAGE_TAR, for `docker load` or `ctr images import`; no Docker engine needed. Job pods get
## buildkite-agent from Buildkite's agent image (the chart's agentImage), not from this one.
image: release-binaries
	go run ./image/cmd/build-image -agentd $(BIN)/linux/agentd -supervisor $(BIN)/linux/agentd-supervise \
		-version $(VERSION) -revision "$(REVISION)" -tag $(IMAGE) -out $(IMAGE_TAR)

## image-push: build the operator image and push it to IMAGE (credentials from ~/.docker/config.json)
image-push: release-binaries
	go run ./image/cmd/build-image -agentd $(BIN)/linux/agentd -supervisor $(BIN)/linux/agentd-supervise \
		-version $(VERSION) -revision "$(REVISION)" -tag $(IMAGE) -push

## release: release VERSION (x.y.z, no v; docs/releasing.md): static agentd and agentd-supervise for
## linux/amd64 and linux/arm64 into bin/release/, the operator image index as an OCI layout and the
## chart pinned to it by digest into .cache/release/VERSION/; with REGISTRY=host[:port]/path it
## pushes the index (tag VERSION) and the chart (REGISTRY/charts) there, PLAIN_HTTP=1 for a
## registry without TLS (credentials: docker's config for the image, helm registry login for the chart)
release: helm
	go run ./image/cmd/release -version "$(VERSION)" -revision "$(REVISION)" \
		$(if $(REGISTRY),-registry $(REGISTRY)) $(if $(PLAIN_HTTP),-plain-http)

envtest-assets: $(ENVTEST_ASSETS)/kube-apiserver $(ENVTEST_ASSETS)/etcd $(ENVTEST_ASSETS)/kubectl
agent-binary: $(AGENT_BIN)/buildkite-agent
cluster-binaries: envtest-assets $(KUBE_BIN)/kubelet $(KUBE_BIN)/kube-scheduler $(KUBE_BIN)/kube-controller-manager $(KUBE_BIN)/kube-proxy \
	$(CONTAINERD_BIN)/containerd $(CONTAINERD_BIN)/ctr $(CONTAINERD_BIN)/containerd-shim-runc-v2

# One kube binary at a time (in this order): they share most of their packages, which two
# builds at once would each compile.
$(KUBE_BIN)/kubectl: | $(KUBE_BIN)/kube-apiserver
$(KUBE_BIN)/kube-scheduler: | $(KUBE_BIN)/kubectl
$(KUBE_BIN)/kubelet: | $(KUBE_BIN)/kube-scheduler
$(KUBE_BIN)/kube-controller-manager: | $(KUBE_BIN)/kubelet
$(KUBE_BIN)/kube-proxy: | $(KUBE_BIN)/kube-controller-manager

$(KUBE_BIN)/%:
	cd tests/tools/kube && $(RETRY) go build -trimpath -ldflags "$(KUBE_LDFLAGS)" -o $@.tmp k8s.io/kubernetes/cmd/$* && mv $@.tmp $@

$(ETCD_BIN)/etcd:
	cd tests/tools/etcd && $(RETRY) go build -trimpath -ldflags "-s -w" -o $@.tmp go.etcd.io/etcd/server/v3 && mv $@.tmp $@

$(ENVTEST_ASSETS)/kube-apiserver $(ENVTEST_ASSETS)/kubectl: $(ENVTEST_ASSETS)/%: $(KUBE_BIN)/%
	mkdir -p $(@D) && ln -sf $< $@

$(ENVTEST_ASSETS)/etcd: $(ETCD_BIN)/etcd
	mkdir -p $(@D) && ln -sf $< $@

# The real agent, for checking the fake Buildkite against it and for job images. It builds
# through the tools module tests/tools/agent, whose go.mod pins the same AGENT_VERSION (a test
# there fails when they, or the main go.mod, differ) and replaces drjosh.dev/zzglob, which the
# module proxy refuses, with the project's own implementation.
$(AGENT_BIN)/buildkite-agent:
	mkdir -p $(AGENT_BIN)
	cd tests/tools/agent && $(RETRY) env CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o $@.tmp github.com/buildkite/agent/v3 && mv $@.tmp $@

# The local node's containerd, its runc shim and ctr, built without cgo from the Go module
# proxy through tests/tools/containerd: image volumes need containerd 2.1 or later, and Debian
# has 1.6. The build tags are those of containerd's own Makefile (urfave_cli_no_docs; no_grpc for
# the shim) and leave out what the node never uses: the btrfs, devmapper and zfs snapshotters
# (it runs overlayfs) and tracing. ctr after containerd and the shim last, for the same reason
# as the kube binaries: they share most of their packages. Cold: 1 min 52 s on 2 idle cores.
CONTAINERD_TAGS := urfave_cli_no_docs no_btrfs no_devmapper no_zfs no_tracing
CONTAINERD_LDFLAGS := -s -w -X github.com/containerd/containerd/v2/version.Version=$(CONTAINERD_VERSION)
$(CONTAINERD_BIN)/ctr: | $(CONTAINERD_BIN)/containerd
$(CONTAINERD_BIN)/containerd-shim-runc-v2: | $(CONTAINERD_BIN)/ctr

$(CONTAINERD_BIN)/%:
	mkdir -p $(CONTAINERD_BIN)
	cd tests/tools/containerd && $(RETRY) env CGO_ENABLED=0 go build -trimpath \
		-tags "$(CONTAINERD_TAGS)$(if $(filter containerd-shim-runc-v2,$*), no_grpc)" -ldflags "$(CONTAINERD_LDFLAGS)" \
		-o $@.tmp github.com/containerd/containerd/v2/cmd/$* && mv $@.tmp $@

# The single local node (tests/cluster): Debian packages for runc and networking (containerd
# is built above; runc stays Debian's: one from Go modules would need cgo and libseccomp), the
# Kubernetes binaries, and the images imported into containerd.
NODE_DEBS := runc containernetworking-plugins busybox-static iptables conntrack socat openssl
# The job image's ssh client, and the sshd from which TestPrivateRepositoryOverSSH serves a repository.
NODE_DEBS += openssh-client openssh-server
LOCALNODE := go run ./tests/cluster/cmd/localnode -bin-dir $(KUBE_BIN) -etcd $(ETCD_BIN)/etcd -containerd-dir $(CONTAINERD_BIN)

## node-deps: the Debian packages the local node needs (apt-get, only those missing)
node-deps:
	@missing=$$(for p in $(NODE_DEBS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then echo "installing:" $$missing; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; fi

## images: the pause, job, operator and agent image tarballs into .cache/images (the agent
## image is a local stand-in, from the agent binary, under the chart's default agentImage)
images: node-deps agent-binary
	go run ./tests/images/cmd/buildimages -out $(CACHE)/images -agent $(AGENT_BIN)/buildkite-agent

## compose-images: the images docker-compose.yml runs (the plugin's tests and lint, the fake
## Buildkite, a local buildkite-agent), built from this machine's files without Docker, as
## tarballs in .cache/compose-images; then `docker load -i` each (see docker-compose.yml)
compose-images: test-deps agent-binary
	go run ./tests/compose/cmd/compose-images -out $(CACHE)/compose-images -agent $(AGENT_BIN)/buildkite-agent

## cluster-up: a single-node Kubernetes on this machine (root); kubeconfig in .cache/localnode
cluster-up: node-deps cluster-binaries images
	$(LOCALNODE) -images $(CACHE)/images up

## cluster-down: stop the local node and put back what it changed on the host
cluster-down:
	$(LOCALNODE) down

## cluster-status: which node processes run and whether the node is Ready
cluster-status:
	$(LOCALNODE) status

e2e-deps: build node-deps cluster-binaries agent-binary helm kwok images

## test-e2e: tests on a real local node (root; builds what it needs first), the short chaos
## soak, and the bench at a small size on kwok
test-e2e: e2e-deps
	$(MAKE) --no-print-directory e2e-tests

e2e-tests:
	E2E=1 go test -count=1 -timeout 20m ./tests/cluster/...
	E2E=1 go test -count=1 -timeout 10m -run TestKwokSmall ./tests/bench/
	E2E=1 go test -count=1 -timeout 30m -v ./tests/e2e/...
	E2E=1 E2E_AGENTD=$(BIN)/agentd go test -count=1 -timeout 30m -v -run TestChaosSoak ./tests/soak/

## soak: the chaos soak on the local node (root): SOAK_JOBS jobs through the operator while
## it is killed with SIGKILL every 5-20 s, job pods are deleted, and Buildkite and the API
## server fail; prints jobs lost, doubled, stuck and with incomplete logs (all must be 0)
## and writes .cache/soak.json; SOAK_ARGS passes more flags. docs/soak.md has the figures.
SOAK_JOBS ?= 300
soak: build node-deps cluster-binaries agent-binary helm images
	go run ./tests/soak/cmd/soak -jobs $(SOAK_JOBS) -agentd $(BIN)/agentd -json $(CACHE)/soak.json $(SOAK_ARGS)

## help: this list of targets
help:
	@sed -n 's/^## //p' $(MAKEFILE_LIST)

$(CONTROLLER_GEN):
	mkdir -p $(TOOLS)
	$(RETRY) env GOBIN=$(TOOLS)/gobin-cg go install -ldflags "-s -w" sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_TOOLS_VERSION)
	mv $(TOOLS)/gobin-cg/controller-gen $@

$(STATICCHECK):
	mkdir -p $(TOOLS)
	$(RETRY) env GOBIN=$(TOOLS)/gobin-sc go install -ldflags "-s -w" honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	mv $(TOOLS)/gobin-sc/staticcheck $@

clean:
	rm -rf $(BIN)

## demo: a sample build on real pods (local node, fake Buildkite, agentd operator); Ctrl-C stops it.
## USE_CURRENT_CONTEXT=1 uses the cluster of the current kube context instead of the local node;
## DEMO_ARGS passes more flags (go run ./tests/demo -h lists them).
demo: build $(if $(USE_CURRENT_CONTEXT),,node-deps cluster-binaries helm images)
	@# A built binary rather than go run, which reports a Ctrl-C as a failure (exit status 1).
	go build -o $(BIN)/demo ./tests/demo
	$(BIN)/demo --agentd $(BIN)/agentd --images $(CACHE)/images $(if $(USE_CURRENT_CONTEXT),--use-current-context) $(DEMO_ARGS)
