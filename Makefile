# tokengate — see README.md. Two commands for a newcomer: `make run`, `make test`.

GO        ?= go
# go-control-plane compiles its vtprotobuf encoders only under this tag;
# tokengate-rls answers with them (internal/service/rls/codec.go). Exported, so
# that the go commands tests start (e2e builds cmd/tokengate-rls) have it.
export GOFLAGS := $(strip $(GOFLAGS) -tags=vtprotobuf)
WASM      := build/tokengate.wasm
GUEST_SRC := $(shell find cmd/tokengate filter bucket sharedstate internal/guest/lite rlscontract config ratelimitheader -name '*.go' -not -name '*_test.go' 2>/dev/null) go.mod go.sum

.PHONY: all build build-small dynmod test run bench fuzz lint check clean envoy image image-rls ratelimit cluster

all: build

## build: compile the proxy-wasm module (standard Go, WASI reactor).
build: $(WASM)

$(WASM): $(GUEST_SRC)
	@mkdir -p build
	@echo 'building the module into $(WASM)'
	GOOS=wasip1 GOARCH=wasm $(GO) build -buildmode=c-shared -trimpath -ldflags='-s -w' -o $(WASM) ./cmd/tokengate

## dynmod: compile the Envoy dynamic module (cgo, needs a C compiler) into build/libtokengate.so, optimised with the profile cmd/tokengate-dynmod/dynmod.pgo (-pgo).
DYNMOD     := build/libtokengate.so
DYNMOD_SRC := $(GUEST_SRC) $(shell find cmd/tokengate-dynmod filter/dynmod sharedstate/procstore -name '*.go' -o -name '*.c' -o -name '*.h' -o -name '*.pgo' 2>/dev/null | grep -v _test.go)
dynmod: $(DYNMOD)

$(DYNMOD): $(DYNMOD_SRC)
	@mkdir -p build
	@echo 'building the dynamic module into $(DYNMOD)'
	CGO_ENABLED=1 $(GO) build -buildmode=c-shared -trimpath -pgo=cmd/tokengate-dynmod/dynmod.pgo -ldflags='-s -w' -o $(DYNMOD) ./cmd/tokengate-dynmod

# Packages whose tests are plain Go (run under the race detector); the others
# run the .wasm in wazero, which the race detector slows down tenfold.
RACE_PKGS := ./bucket/... ./sharedstate/... ./config/... ./ratelimitheader/... ./rlscontract/... ./filter/ ./filter/filtertest/ ./filter/dynmod/

## build-small: the module through wasm-opt -Oz if binaryen is installed (opt-in; build never needs it).
build-small: $(GUEST_SRC)
	@mkdir -p build
	GOOS=wasip1 GOARCH=wasm $(GO) build -buildmode=c-shared -trimpath -ldflags='-s -w' -o build/tokengate-small.wasm ./cmd/tokengate
	@if command -v wasm-opt >/dev/null 2>&1; then \
	  wasm-opt -Oz --enable-bulk-memory --enable-sign-ext --enable-nontrapping-float-to-int build/tokengate-small.wasm -o build/tokengate-small.wasm; \
	else echo 'build-small: wasm-opt not found (apt-get install binaryen); the module is only stripped'; fi

## test: build the module (and the dynamic module, given a C compiler), then run every test (native, against the .wasm, and the .so in the C host of e2e/dynmod).
# The -timeout values catch a hung test, not a slow machine: on two busy
# cores e2e took 7 minutes and sharedstate under -race 5 (the old bounds),
# so the bounds are far above.
test: build ratelimit
	@if command -v $${CC:-cc} >/dev/null 2>&1; then $(MAKE) --no-print-directory dynmod; \
	  else echo 'test: no C compiler ($${CC:-cc}): the dynamic module is not built, and e2e/dynmod skips its C host tests'; fi
	$(GO) vet ./...
	$(GO) test -race -timeout 20m $(RACE_PKGS)
	env $$(test -f $(DYNMOD) && echo TOKENGATE_DYNMOD=$(CURDIR)/$(DYNMOD)) $(GO) test -timeout 30m $$($(GO) list ./... | grep -v -e '/bucket$$' -e '/sharedstate$$' -e '/procstore$$' -e '/config$$' -e '/ratelimitheader$$' -e '/rlscontract$$' -e '/filter$$' -e '/filtertest$$' -e '/filter/dynmod$$')
	cd deploy && $(GO) test -timeout 30m ./...
	$(GO) test -run '^$$' -bench . -benchtime 1x ./... > /dev/null

## ratelimit: install envoyproxy/ratelimit (the RLS peer of the tests and the bench) into build/tools, once per version (tools/ratelimit.sh pins it).
ratelimit:
	@tools/ratelimit.sh >/dev/null

## run: build and serve the filter on 127.0.0.1:10000 with envoy.yaml's configuration (or CONFIG=file.json).
LOCAL     := build/tokengate-local
LOCAL_SRC := $(shell find cmd/tokengate-local internal -name '*.go' -not -name '*_test.go' -not -path '*/testdata/*' 2>/dev/null) go.mod go.sum
CONFIG    ?=

run: build $(LOCAL)
	$(LOCAL) -wasm $(WASM) $(if $(CONFIG),-config $(CONFIG),-envoy envoy.yaml)

$(LOCAL): $(LOCAL_SRC)
	@mkdir -p build
	@echo 'building the local host into $(LOCAL): the first build compiles wazero and takes a minute or two on a cold cache (-v names each package as it compiles); later runs reuse it'
	$(GO) build -v -o $(LOCAL) ./cmd/tokengate-local

## cluster: a fleet sharing one limit per client IP: redis-server, tokengate-rls and three tokengate-local proxies on 127.0.0.1:10000, :10010, :10020 (tools/cluster.sh; Ctrl-C stops them). MODE=lease puts the rule in lease mode; EXAMPLE=ai-api runs examples/ai-api (tokens per minute, a monthly token quota, requests in flight).
RLS     := build/tokengate-rls
RLS_SRC := $(shell find cmd/tokengate-rls internal/service internal/guest/lite bucket sharedstate config rlscontract ratelimitheader \( -name '*.go' -o -name '*.lua' \) -not -name '*_test.go' -not -path '*/testdata/*' 2>/dev/null) go.mod go.sum

MODE ?= exact
EXAMPLE ?= cluster
cluster: build $(LOCAL) $(RLS)
	MODE=$(MODE) EXAMPLE=$(EXAMPLE) exec tools/cluster.sh

$(RLS): $(RLS_SRC)
	@mkdir -p build
	$(GO) build -v -o $(RLS) ./cmd/tokengate-rls

## envoy: run Envoy (>= 1.33, on PATH) with envoy.yaml, from the repository root.
envoy: build
	@command -v envoy >/dev/null 2>&1 || { \
	  echo 'make envoy: no envoy binary on PATH. Install Envoy >= 1.33 (https://www.envoyproxy.io/docs/envoy/latest/start/install),'; \
	  echo 'or run the official image from this directory:'; \
	  echo '  docker run --rm --network host -v "$$PWD":/tokengate -w /tokengate envoyproxy/envoy:v1.37.6 -c envoy.yaml'; \
	  exit 1; }
	envoy -c envoy.yaml

## image: write build/oci, an OCI image layout of the module in Istio's Wasm image format.
IMAGE_TAG ?= latest
image: build
	cd deploy && $(GO) run ./cmd/wasm-oci -wasm ../$(WASM) -out ../build/oci -tag $(IMAGE_TAG)

## image-rls: write build/oci-rls, an OCI image layout of tokengate-rls (static, nonroot, also at /bin/ratelimit) for PLATFORMS, built with Go alone (no Docker).
PLATFORMS ?= linux/amd64,linux/arm64
image-rls:
	cd deploy && $(GO) run ./cmd/rls-image -out $(CURDIR)/build/oci-rls -tag $(IMAGE_TAG) -platforms $(PLATFORMS) -version $(IMAGE_TAG) \
	  $(if $(wildcard /etc/ssl/certs/ca-certificates.crt),-ca-bundle /etc/ssl/certs/ca-certificates.crt)

## bench: every benchmark of BENCHMARKS.md, printed as one table (installs wrk and redis-server with apt if missing).
bench: build
	bench/run.sh

## fuzz: run every fuzz target for FUZZTIME each.
FUZZTIME ?= 30s
fuzz:
	@for pkg in $$($(GO) list ./...); do \
	  for t in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	    echo "== $$pkg $$t"; $(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 5s $$pkg || exit 1; \
	  done; \
	done

## lint: gofmt, go vet and staticcheck, on the product module, the guest build and the deploy module.
STATICCHECK_VERSION := v0.8.2
STATICCHECK         := build/bin/staticcheck-$(STATICCHECK_VERSION)
GUEST_PKGS          := ./cmd/tokengate ./filter/... ./config/... ./ratelimitheader/... ./rlscontract/... ./bucket/... ./sharedstate/...

$(STATICCHECK):
	@mkdir -p build/bin
	GOBIN=$(abspath build/bin) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	mv build/bin/staticcheck $@

lint: $(STATICCHECK)
	@test -z "$$(gofmt -l .)" || (gofmt -l . && echo 'gofmt: the files above need formatting' && exit 1)
	$(GO) vet ./...
	GOOS=wasip1 GOARCH=wasm $(GO) vet $(GUEST_PKGS)
	cd deploy && $(GO) vet ./...
	$(STATICCHECK) ./...
	@# staticcheck does not see //go:wasmexport as a use, so U1000 is off for the guest build.
	GOOS=wasip1 GOARCH=wasm $(STATICCHECK) -checks inherit,-U1000 $(GUEST_PKGS)
	cd deploy && $(abspath $(STATICCHECK)) ./...

## check: lint, then fail if formatting or go mod tidy changed anything.
check: lint
	$(GO) mod tidy
	cd deploy && $(GO) mod tidy
	@test -z "$$(git status --porcelain go.mod go.sum deploy/go.mod deploy/go.sum)" || (git diff go.mod go.sum deploy/go.mod deploy/go.sum; echo 'go mod tidy changed go.mod/go.sum' && exit 1)

clean:
	rm -rf build
