# kpng: the two commands a new user runs are `make demo` and `make test`.

GO ?= go
GOTEST_FLAGS ?= -race -count=1 -timeout 45m
STATICCHECK_VERSION ?= v0.8.2

.PHONY: demo test unit controlplane lint bench build

## demo: start a local kube-apiserver + etcd, apply the blog's Service and
## endpoints, and print what kpng-json sees.
demo: controlplane
	$(GO) run ./internal/cmd/kpng-demo

## test: every test, unit and integration (real API server), with -race.
test: controlplane
	KPNG_CONTROLPLANE_DIR="$$(bash hack/build-controlplane.sh | tail -n 1)" \
		$(GO) test $(GOTEST_FLAGS) ./...

## unit: the tests that need no control plane.
unit:
	$(GO) test -race -count=1 -short ./...

## controlplane: build (once, then cached) kube-apiserver and etcd.
controlplane:
	bash hack/build-controlplane.sh >/dev/null

## lint: gofmt, go vet and staticcheck.
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...

## bench: the benchmarks recorded in docs/benchmarks.md.
bench: controlplane
	KPNG_CONTROLPLANE_DIR="$$(bash hack/build-controlplane.sh | tail -n 1)" \
		$(GO) test -run '^$$' -bench . -benchmem -timeout 60m ./...

build:
	$(GO) build ./...
