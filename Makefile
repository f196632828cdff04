# tokengate — see README.md. Two commands for a newcomer: `make run`, `make test`.

GO        ?= go
WASM      := build/tokengate.wasm
GUEST_SRC := $(shell find cmd/tokengate filter bucket sharedstate internal/pretty -name '*.go' -not -name '*_test.go' 2>/dev/null) go.mod go.sum

.PHONY: all build build-small test run bench fuzz lint check clean envoy image

all: build

## build: compile the proxy-wasm module (standard Go, WASI reactor).
build: $(WASM)

$(WASM): $(GUEST_SRC)
	@mkdir -p build
	GOOS=wasip1 GOARCH=wasm $(GO) build -buildmode=c-shared -trimpath -o $(WASM) ./cmd/tokengate

# Packages whose tests are plain Go (run under the race detector); the others
# run the .wasm in wazero, which the race detector slows down tenfold.
RACE_PKGS := ./bucket/... ./sharedstate/... ./filter/ ./filter/filtertest/

## build-small: stripped module, then wasm-opt -Oz if binaryen is installed (opt-in; build never needs it).
build-small: $(GUEST_SRC)
	@mkdir -p build
	GOOS=wasip1 GOARCH=wasm $(GO) build -buildmode=c-shared -trimpath -ldflags='-s -w' -o build/tokengate-small.wasm ./cmd/tokengate
	@if command -v wasm-opt >/dev/null 2>&1; then \
	  wasm-opt -Oz --enable-bulk-memory --enable-sign-ext --enable-nontrapping-float-to-int build/tokengate-small.wasm -o build/tokengate-small.wasm; \
	else echo 'build-small: wasm-opt not found (apt-get install binaryen); the module is only stripped'; fi

## test: build the module, then run every test (native and against the .wasm).
test: build
	$(GO) vet ./...
	$(GO) test -race -timeout 5m $(RACE_PKGS)
	$(GO) test -timeout 8m $$($(GO) list ./... | grep -v -e '/bucket$$' -e '/sharedstate$$' -e '/filter$$' -e '/filtertest$$')
	cd internal/pretty && $(GO) vet ./... && $(GO) test ./...
	$(GO) test -run '^$$' -bench . -benchtime 1x ./... > /dev/null

## run: build and serve the filter on 127.0.0.1:10000 with envoy.yaml's configuration.
run: build
	$(GO) run ./cmd/tokengate-local -wasm $(WASM) -envoy envoy.yaml

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
	$(GO) run ./deploy/cmd/wasm-oci -wasm $(WASM) -out $(dir $(WASM))oci -tag $(IMAGE_TAG)

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

## lint: gofmt and go vet.
lint:
	@test -z "$$(gofmt -l .)" || (gofmt -l . && echo 'gofmt: the files above need formatting' && exit 1)
	$(GO) vet ./...
	GOOS=wasip1 GOARCH=wasm $(GO) vet ./cmd/... ./filter/... ./bucket/... ./sharedstate/...

## check: lint, then fail if formatting or go mod tidy changed anything.
check: lint
	$(GO) mod tidy
	@test -z "$$(git status --porcelain go.mod go.sum)" || (git diff go.mod go.sum; echo 'go mod tidy changed go.mod/go.sum' && exit 1)

clean:
	rm -rf build
