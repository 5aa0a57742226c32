# kpng: the two commands a new user runs are `make demo` and `make test`.

GO ?= go
# The Go toolchain every build and test uses, also named by go.mod's
# toolchain line (a machine whose go env says GOTOOLCHAIN=local would
# otherwise ignore that line and build with its own Go). The go command
# fetches it from the module proxy once (about 76 MB). Override on the
# command line only: make GOTOOLCHAIN=...
export GOTOOLCHAIN = go1.27.3
GOTEST_FLAGS ?= -race -count=1 -timeout 45m
STATICCHECK_VERSION ?= v0.8.2
GOVULNCHECK_VERSION ?= v1.9.0
# The golang.org/x/vulndb module whose reports vulncheck checks against:
# move it forward (go list -m -versions golang.org/x/vulndb) to learn of
# new vulnerabilities.
VULNDB_VERSION ?= v0.0.0-20261105234957-e22db6528018

PROTOC_VERSION ?= 3.21.12
PROTOC_GEN_GO_VERSION ?= v1.36.12
PROTOC_GEN_GO_GRPC_VERSION ?= v1.6.2
TOOLS_BIN := $(CURDIR)/bin

.PHONY: demo serve test unit controlplane cluster cluster-down cluster-test e2e e2e-report lint cross fuzz bench reliability soak scale-controller apiserver-watchers build generate check-generate image-binaries image-sizes image vulncheck

## demo: start a local kube-apiserver + etcd, apply the blog's Service and
## endpoints, and print what kpng-json sees.
demo: controlplane
	$(GO) run ./hack/cmd/kpng-demo

## serve: the demo's API server with the blog's Service and endpoints, kept
## running for a program of yours (it prints the KUBECONFIG to export) until
## Ctrl-C, then removed. Built, then run (not go run, which reports an
## interrupted child as a failure).
serve: controlplane
	$(GO) build -o $(TOOLS_BIN)/kpng-demo ./hack/cmd/kpng-demo
	$(TOOLS_BIN)/kpng-demo --serve

## test: every test, unit and integration (real API server), with -race;
## then, without it, the tests of what the Go scheduler's order gives
## (the race detector shuffles that order on purpose; names separated by |).
SCHEDULER_TESTS ?= TestAChangeToManyStreamsHoldsFewWriteBuffers
test: controlplane
	KPNG_CONTROLPLANE_DIR="$$(bash hack/build-controlplane.sh | tail -n 1)" \
		$(GO) test $(GOTEST_FLAGS) ./...
	$(GO) test -count=1 -run '^($(SCHEDULER_TESTS))$$' ./api/server

## unit: the unit tests (-short): no control plane is built or started and
## no network namespace is made; the tests that need them skip.
unit:
	$(GO) test -race -count=1 -short ./...

## controlplane: build (once, then cached) kube-apiserver and etcd.
controlplane:
	bash hack/build-controlplane.sh >/dev/null

## cluster: a two-node Kubernetes cluster on this machine (root; see
## docs/cluster.md): the control plane, and per node a network namespace
## with containerd and kubelet, every image built here; then PROXIER
## deployed: kpng-nft (default), kpng-iptables or kpng-userspace
## (deploy/'s DaemonSets, kpng the only proxier), kube-proxy-nftables or
## kube-proxy-iptables, or seeds (kube-proxy, and kpng beside it for its
## labelled services; then `hack/cluster/proxier.sh deploy controller` adds
## kpng's controller and its node backends).
## kubectl: hack/cluster/kubectl.sh.
PROXIER ?= kpng-nft
cluster:
	bash hack/cluster/up.sh
	bash hack/cluster/proxier.sh deploy $(PROXIER)

## cluster-down: remove the cluster and everything it made.
cluster-down:
	bash hack/cluster/down.sh

## cluster-test: the cluster's smoke test: up, kpng as its proxier (nft,
## then iptables), then the seeds' mode, pods reaching services across the
## nodes; then down, checking that nothing is left.
cluster-test:
	bash hack/cluster/test.sh

## e2e: Kubernetes' own network e2e tests (test/e2e/network, v1.36.3)
## through each of PROXIER (one or more of kpng-nft, kpng-iptables,
## kpng-userspace, kube-proxy-nftables, kube-proxy-iptables) in turn on one
## two-node cluster, CoreDNS beside it; FOCUS narrows the tests, SKIP
## leaves some out (regular expressions). Reports in _output/e2e/PROXIER;
## see docs/e2e.md.
FOCUS ?=
SKIP ?=
e2e:
	FOCUS='$(FOCUS)' E2E_SKIP='$(SKIP)' bash hack/e2e/run.sh $(PROXIER)

## e2e-report: the table of the last make e2e runs (docs/e2e.md), and for
## each kpng proxier the tests kube-proxy passed in the same mode that it
## did not.
e2e-report:
	bash hack/e2e/report.sh

## lint: gofmt, go vet and staticcheck, then the cross builds.
lint: cross
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...

## vulncheck: govulncheck $(GOVULNCHECK_VERSION) on every package, against
## a database built (once, then cached under ${KPNG_CACHE_DIR:-$HOME/.cache/kpng})
## from golang.org/x/vulndb@$(VULNDB_VERSION), as the online database
## cannot be reached from CI; fails when the code reaches a known
## vulnerability (of the Go toolchain or of a module).
vulncheck:
	bash hack/vulncheck.sh $(GOVULNCHECK_VERSION) $(VULNDB_VERSION) ./...

## cross: build and vet for the other systems a proxier runs on: Windows
## (the userspace backend, kpng, kpng-userspace) and arm64; and vet the
## planning code of the nft and iptables backends (no kernel needed) on
## Windows and macOS, so that it stays buildable everywhere.
CROSS_TARGETS ?= windows/amd64 windows/arm64 linux/arm64
PLANNING_PACKAGES ?= ./backends/nft/ ./backends/iptables/ ./backends/nodeflags/ ./backends/periodic/
cross:
	@for t in $(CROSS_TARGETS); do \
		echo "cross: $$t"; \
		GOOS=$${t%/*} GOARCH=$${t#*/} $(GO) build ./... || exit 1; \
		GOOS=$${t%/*} GOARCH=$${t#*/} $(GO) vet ./backends/userspace/ ./cmd/... ./examples/userspace/ ./client/... ./localsink/... || exit 1; \
	done
	@for os in windows darwin; do \
		echo "cross: the planning code on $$os"; \
		GOOS=$$os $(GO) vet $(PLANNING_PACKAGES) || exit 1; \
	done

## fuzz: run each fuzz target (the decoders of outside input) for
## FUZZTIME (a duration, or a count such as 3000x: CI uses a count, as a
## short duration can end a run with "context deadline exceeded"); their
## seed corpora also run in make test. A crasher is written to the
## package's testdata/fuzz: fix it and commit it as a regression case.
FUZZTIME ?= 30s
FUZZ_TARGETS ?= \
	./localsink/statefile:FuzzParse \
	./localsink/statefile:FuzzArrayItems \
	./api/kpngv1:FuzzModel \
	./api/kpngv1:FuzzInflate \
	./client/watcher:FuzzConvert \
	./model:FuzzParse \
	./backends/userspace:FuzzPlan \
	./backends/nft:FuzzBuild \
	./examples/callout/internal/callout:FuzzSplit
fuzz:
	@for t in $(FUZZ_TARGETS); do \
		echo "fuzz: $${t#*:} in $${t%:*} for $(FUZZTIME)"; \
		$(GO) test -short -run '^$$' -fuzz "^$${t#*:}$$" -fuzztime $(FUZZTIME) "$${t%:*}" || exit 1; \
	done

## reliability: the benchmark-tier runs recorded in docs/reliability.md
## (root, about 20 minutes): 10,000 rounds of churn against the kernel
## for two seeds and against the tracker, 100 kills of an nft proxier in
## the middle of its transactions.
reliability:
	KPNG_CHURN_ROUNDS=10000 $(GO) test -count=1 -timeout 60m -run '^(TestKernelConvergence|TestTrackerConvergence)$$' ./backends/nft/
	KPNG_CHURN_ROUNDS=10000 KPNG_CHURN_SEED=12 $(GO) test -count=1 -timeout 60m -run '^TestKernelConvergence$$' ./backends/nft/
	KPNG_KILLS=100 $(GO) test -count=1 -timeout 30m -run '^TestKernelKilledWhileProgramming$$' ./backends/nft/

## soak: the soak recorded in docs/reliability.md (root, about 70
## minutes): `kpng kube … to-local to-nft` under an hour of API churn at
## 10,000 services, its memory, goroutines, open files and latencies
## sampled, its table compared with a fresh one at the end; results in
## soak-out/. SOAK_FLAGS are kpng-soak's (e.g. --duration=3m --window=1m
## --services=1000 for a smoke run).
SOAK_FLAGS ?=
soak: controlplane
	bash hack/soak.sh $(SOAK_FLAGS)

## scale-controller: `kpng kube … to-api` serving NODES node backends
## (lightweight streams, one a node) the state of SERVICES services × 10
## endpoints on the test control plane, then CHANGES EndpointSlice
## changes: the time until all hold their first state, each change's
## latency to the last backend, the controller's RSS and the bytes per
## change and node, on one closing line (docs/benchmarks.md); with
## PROFILE_DIR, the controller's profiles there. The changes come back to
## back, or CHANGE_GAP apart (e.g. 3s); TCP=1 serves the backends on TCP
## loopback instead of a unix socket; TLS=1 on TCP loopback with TLS and
## client certificates, as deploy/ runs the controller; CONTROLLER_ENV
## sets the controller's environment (e.g. GOMEMLIMIT=800MiB); PLAIN=1
## has the backends not ask for deflated first states (client/remote
## asks); PEERS=1 has them follow the controller's replicas too (a Peers
## stream each, as deploy/'s node backends). Runs at nice 10.
NODES ?= 100
SERVICES ?= 10000
CHANGES ?= 100
CHANGE_GAP ?= 0
PROFILE_DIR ?=
TCP ?=
TLS ?=
CONTROLLER_ENV ?=
PLAIN ?=
PEERS ?=
scale-controller: controlplane
	NODES=$(NODES) SERVICES=$(SERVICES) CHANGES=$(CHANGES) CHANGE_GAP=$(CHANGE_GAP) PROFILE_DIR=$(PROFILE_DIR) TCP=$(TCP) TLS=$(TLS) CONTROLLER_ENV="$(CONTROLLER_ENV)" PLAIN=$(PLAIN) PEERS=$(PEERS) bash hack/scale-controller.sh

## apiserver-watchers: what the API server pays for the watchers of
## Services and EndpointSlices: CONTROLLERS `kpng kube … to-api`
## controllers, then WATCHERS raw watchers as kube-proxy's (comma-separated
## counts, one configuration each), over SERVICES services × 10 endpoints
## (1000 here), CHANGES EndpointSlice changes each: the API server's CPU
## time and the bytes the watchers received for the initial state and per
## change, its RSS, one closing line a configuration (docs/benchmarks.md).
## Runs at nice 10.
WATCHERS ?= 10,100,500
CONTROLLERS ?= 1,3
apiserver-watchers: SERVICES = 1000
apiserver-watchers: controlplane
	WATCHERS=$(WATCHERS) CONTROLLERS=$(CONTROLLERS) SERVICES=$(SERVICES) CHANGES=$(CHANGES) bash hack/apiserver-watchers.sh

## bench: the benchmarks recorded in docs/benchmarks.md.
bench: controlplane
	KPNG_CONTROLPLANE_DIR="$$(bash hack/build-controlplane.sh | tail -n 1)" \
		$(GO) test -run '^$$' -bench . -benchmem -timeout 60m ./...

build:
	$(GO) build ./...

## image-binaries: the programs of the image, built as its Dockerfile builds
## them (it runs this target, so that the two cannot differ; the deploy
## package's test runs it too): static (CGO_ENABLED=0), -trimpath, stripped
## (-s -w), with -tags grpcnotrace (gRPC without golang.org/x/net/trace,
## whose html/template stops the linker from dropping unused methods: 13 MB
## a program), for linux/IMAGE_GOARCH, into IMAGE_BIN_DIR.
IMAGE_BIN_DIR ?= $(CURDIR)/bin/image
IMAGE_GOARCH ?= $(shell $(GO) env GOARCH)
IMAGE_BUILD_FLAGS ?= -trimpath -tags=grpcnotrace
IMAGE_LDFLAGS ?= -s -w
IMAGE_PROGRAMS ?= kpng=./cmd/kpng kpng-json=./examples/json kpng-callout=./examples/callout \
	kpng-userspace=./examples/userspace kpng-allip=./examples/allip
image-binaries:
	@mkdir -p $(IMAGE_BIN_DIR)
	@for p in $(IMAGE_PROGRAMS); do \
		echo "image-binaries: $${p%%=*} (linux/$(IMAGE_GOARCH))"; \
		CGO_ENABLED=0 GOOS=linux GOARCH=$(IMAGE_GOARCH) \
			$(GO) build $(IMAGE_BUILD_FLAGS) -ldflags='$(IMAGE_LDFLAGS)' -o $(IMAGE_BIN_DIR)/$${p%%=*} $${p#*=} || exit 1; \
	done

## image-sizes: the size of each program of the image, stripped as in the
## image, unstripped, and built with no flag (but CGO_ENABLED=0): see the
## table in docs/operating.md.
image-sizes:
	@d=$$(mktemp -d); trap 'rm -rf "$$d"' EXIT; \
	$(MAKE) -s image-binaries IMAGE_BIN_DIR=$$d/stripped >/dev/null && \
	$(MAKE) -s image-binaries IMAGE_BIN_DIR=$$d/unstripped IMAGE_LDFLAGS= >/dev/null && \
	$(MAKE) -s image-binaries IMAGE_BIN_DIR=$$d/plain IMAGE_BUILD_FLAGS= IMAGE_LDFLAGS= >/dev/null && \
	printf '%-16s %10s %12s %10s\n' program image unstripped 'no flags' && \
	for p in $(IMAGE_PROGRAMS); do \
		n=$${p%%=*}; \
		printf '%-16s %7.1f MB %9.1f MB %7.1f MB\n' $$n \
			$$(stat -c %s $$d/stripped/$$n $$d/unstripped/$$n $$d/plain/$$n | awk '{printf "%s ", $$1/1e6}'); \
	done

## image: build the images with docker (or IMAGE_TOOL=podman): IMAGE_NFT
## (kpng alone, for the nft DaemonSets), IMAGE_IPTABLES (kpng and Debian's
## iptables, for the iptables DaemonSets) and IMAGE (every program, with
## iptables and jq, for the examples).
IMAGE ?= kpng:latest
IMAGE_NFT ?= kpng-nft:latest
IMAGE_IPTABLES ?= kpng-iptables:latest
IMAGE_TOOL ?= docker
image:
	$(IMAGE_TOOL) build --target nft -t $(IMAGE_NFT) .
	$(IMAGE_TOOL) build --target iptables -t $(IMAGE_IPTABLES) .
	$(IMAGE_TOOL) build -t $(IMAGE) .

## generate: regenerate api/kpngv1 from kpng.proto (needs protoc $(PROTOC_VERSION):
## apt-get install protobuf-compiler on Debian 12).
generate:
	@protoc --version | grep -q ' $(PROTOC_VERSION)$$' || { echo "need protoc $(PROTOC_VERSION), have: $$(protoc --version)"; exit 1; }
	GOBIN=$(TOOLS_BIN) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	GOBIN=$(TOOLS_BIN) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
	PATH="$(TOOLS_BIN):$$PATH" $(GO) generate ./api/...

## check-generate: fail when the committed generated code is not what
## kpng.proto generates.
check-generate: generate
	@git diff --exit-code -- api/ || { echo "api/: generated code is stale, run make generate and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- api/)" || { echo "api/: untracked generated files"; git status --porcelain -- api/; exit 1; }
