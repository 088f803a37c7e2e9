# gpurack — `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

GO          ?= go
BIN         ?= bin
VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS     := -s -w -X github.com/gpurack/gpurack/internal/buildinfo.Version=$(VERSION)
GPURACK_CACHE   ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/gpurack
GPURACK_K8S_DIR ?= $(GPURACK_CACHE)/k8s/v1.34.2
export GPURACK_CACHE GPURACK_K8S_DIR
TOOLS       := $(GPURACK_K8S_DIR)/bin
TEST_FLAGS  ?= -count=1 -timeout 50m
DURATIONS   ?= $(BIN)/test-durations.tsv

BINARIES := imagebuilder/cmd/gpuimage pxe/cmd/gpuboot agent/cmd/gpuagent controlplane-bootstrap/cmd/controlplane-bootstrap

.PHONY: help
help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: deps
deps: ## install what the tests need: Debian packages and the pinned binaries (idempotent)
	@hack/deps.sh
	@$(MAKE) --no-print-directory k8s-bins

.PHONY: build
build: ## build the four binaries into ./bin
	@mkdir -p $(BIN)
	CGO_ENABLED=1 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/ $(addprefix ./,$(BINARIES))
	@ls -l $(BIN)

.PHONY: test
test: deps ## install what is missing, then run every test (what CI runs); durations in $(DURATIONS), the slowest printed at the end
	@# test/qemu is named first: it is the longest package by far (QEMU under TCG), so it
	@# starts at once and the other packages run beside it, one at a time (-p 2).
	@# test/runbooks comes next: its rollouts wait minutes for simulated servers' keys to
	@# go silent, a wait that, left to the end, held a slot after test/qemu had ended.
	@mkdir -p $(BIN) && rm -f $(DURATIONS) $(DURATIONS).failures && $(GO) build -o $(BIN)/testsummary ./hack/testsummary
	@# Every reason for a failure is repeated on the last lines, where a log's tail shows it.
	@set -o pipefail; rc=0; why=; \
	  echo 'go test -json $(TEST_FLAGS) ./test/qemu/ ./test/runbooks/ ./... (the pinned binaries on PATH, GPURACK_NETNS_REQUIRED=1) | testsummary stream'; \
	  PATH="$(TOOLS):$$PATH" GPURACK_NETNS_REQUIRED=1 $(GO) test -json $(TEST_FLAGS) ./test/qemu/ ./test/runbooks/ ./... | $(BIN)/testsummary stream --out $(DURATIONS) || { rc=1; why="$$why; go test ./... failed"; }; \
	  echo 'cd images/coredns && $(GO) test -json $(TEST_FLAGS) ./... | testsummary stream'; \
	  (cd images/coredns && $(GO) test -json $(TEST_FLAGS) ./...) | $(BIN)/testsummary stream --out $(DURATIONS) || { rc=1; why="$$why; go test in images/coredns failed"; }; \
	  $(BIN)/testsummary report $(DURATIONS) || { rc=1; why="$$why; testsummary report failed"; }; \
	  leaked=$$(ip netns list 2>/dev/null | grep '^gpr-' || true); \
	  if [ -n "$$leaked" ]; then echo "tests leaked network namespaces:"; echo "$$leaked"; rc=1; why="$$why; leaked network namespaces"; fi; \
	  if [ $$rc != 0 ]; then echo "make test: FAIL: $${why#; }"; fi; \
	  exit $$rc

.PHONY: lint
lint: ## go vet, staticcheck and gofmt
	$(GO) vet ./...
	@[ -x $(TOOLS)/staticcheck ] || $(MAKE) --no-print-directory k8s-bins
	$(TOOLS)/staticcheck ./...
	cd images/coredns && $(GO) vet ./... && $(abspath $(TOOLS))/staticcheck ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

.PHONY: generate
generate: ## regenerate the protobuf code in api/ (protoc + pinned plugins)
	hack/generate.sh

.PHONY: k8s-bins
k8s-bins: ## build pinned Kubernetes v1.34.2, etcd v3.6.16, grpcurl, promtool, Prometheus, Alertmanager and amtool, kube-state-metrics v2.20.0, node_exporter v1.12.1, VictoriaLogs, Kueue v0.17.0 (with its manifests), the image registry (distribution v3.1.2), staticcheck and the pause image into the cache
	@hack/k8s-bins.sh

.PHONY: probe-image
probe-image: ## pack the test probe (test/probe, static Go) into $(BIN)/images/probe.tar with hack/imagearchive, reproducibly
	hack/probe-image.sh $(BIN)/images/probe.tar

.PHONY: debug-image
debug-image: ## pack the break-glass debug image (images/debug, static Go, runs as root) into $(BIN)/images/debug.tar, reproducibly
	hack/debug-image.sh $(BIN)/images/debug.tar

.PHONY: coredns-image
coredns-image: ## build CoreDNS from pinned source (images/coredns) into $(BIN)/images/coredns.tar with hack/imagearchive, reproducibly
	hack/coredns-image.sh $(BIN)/images/coredns.tar

.PHONY: workload-images
workload-images: ## build the sample workload images (profiles/workloads: notebook, train, serve) into $(BIN)/workloads/NAME.oci.tar with gpuimage container build (root; the torch images take many minutes each)
	@mkdir -p $(BIN)/workloads
	CGO_ENABLED=1 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/gpuimage ./imagebuilder/cmd/gpuimage
	@for p in notebook train serve; do \
		$(BIN)/gpuimage container build profiles/workloads/$$p.yaml --out $(BIN)/workloads/$$p.oci.tar || exit 1; \
	done

.PHONY: fuzz
fuzz: ## run every fuzz target for FUZZTIME each (default 30s)
	@hack/fuzz.sh $(or $(FUZZTIME),30s)

.PHONY: demo
demo: deps build ## the main demo: power on a simulated rack of 20 x 8 GPUs against the real control plane and gpuboot (NODES=N)
	@hack/rack-demo.sh

.PHONY: demo-workloads
demo-workloads: deps build ## make demo with Kueue: two tenants' users queue GPU Jobs on the simulated rack (borrowing, a Job larger than any node waiting)
	@DEMO_WORKLOADS=1 hack/rack-demo.sh

.PHONY: demo-tour
demo-tour: deps build ## a tour of the parts: profiles, lint errors, checklists, control plane, a signed image (DEMO_FAST=1 skips it)
	@hack/demo.sh

.PHONY: demo-clean
demo-clean: ## stop and remove what make demo left running, and make demo-qemu's output (idempotent)
	@hack/rack-demo.sh clean
	@rm -rf "$${DEMO_QEMU_DIR:-$${TMPDIR:-/tmp}/gpurack-rack-demo-qemu}"

.PHONY: demo-qemu
demo-qemu: deps ## make demo with slot 1 a real QEMU machine that PXE-boots the tiny image (about 7 min under TCG on 2 cores; NODES=N; output in $$TMPDIR/gpurack-rack-demo-qemu)
	@PATH="$(TOOLS):$$PATH" GPURACK_NETNS_REQUIRED=1 DEMO_DIR="$${DEMO_QEMU_DIR:-$${TMPDIR:-/tmp}/gpurack-rack-demo-qemu}" $(GO) test -tags demoqemu -count=1 -timeout 50m -v -run '^TestRackDemoQEMU$$' ./test/qemu/

.PHONY: e2e
e2e: deps ## the end-to-end boots alone: tiny image in QEMU, PXE through SeaBIOS iPXE and OVMF, the rack (a machine powered on through PXE and a simulated GPU node, joined and checked), a TPM machine re-enrolling and a forged one refused, the pod network with host-gw (logs kept in bin/e2e)
	PATH="$(TOOLS):$$PATH" GPURACK_NETNS_REQUIRED=1 GPURACK_E2E_TPM=1 GPURACK_E2E_HOSTGW=1 GPURACK_E2E_LOGS="$(abspath $(BIN))/e2e" $(GO) test $(TEST_FLAGS) -v -run 'TestTinyImage|TestBIOSiPXEProxyBoot|TestOVMFNativePXEBoot|TestRack|TestTwoNodeHostGW|TestTPMIdentityInQEMU' ./imagebuilder/cmd/gpuimage/ ./test/qemu/

.PHONY: e2e-slow
e2e-slow: deps ## build the NVIDIA images with their kernel modules (about 20 min cold; outside make test)
	PATH="$(TOOLS):$$PATH" GPURACK_E2E_SLOW=1 $(GO) test $(TEST_FLAGS) -v -run 'TestNvidiaImages' ./imagebuilder/cmd/gpuimage/

.PHONY: e2e-workloads
e2e-workloads: deps workload-images ## a tenant user's day with the sample images (notebook, train, serve) on a 20 GiB QEMU node: push, PyTorch training resumed from its checkpoint, 2 serve replicas, notebook through port-forward (about 21 min after the 7-min image builds; outside make test)
	PATH="$(TOOLS):$$PATH" GPURACK_NETNS_REQUIRED=1 GPURACK_E2E_WORKLOADS=1 GPURACK_WORKLOAD_IMAGES="$(abspath $(BIN))/workloads" $(GO) test -count=1 -timeout 80m -v -run '^TestUserDayImages$$' ./test/qemu/

.PHONY: bench
bench: bench-go bench-pxe bench-image bench-node bench-storage bench-gpu bench-rack bench-etcd bench-inventory bench-doc ## every benchmark; writes docs/benchmarks.md, one section per target

.PHONY: bench-doc
bench-doc: ## reassemble docs/benchmarks.md from the sections in docs/bench/ (each bench-* target does this too)
	test/bench/benchdoc.sh

.PHONY: bench-image
bench-image: ## cold and warm gpuimage build of tiny, artifact sizes, squashfs against mksquashfs
	imagebuilder/hack/bench.sh profiles/tiny.yaml

.PHONY: bench-image-nvidia
bench-image-nvidia: ## the same for debian13-nvidia550: module build chroot and compile included (about 20 min)
	imagebuilder/hack/bench.sh profiles/debian13-nvidia550.yaml

.PHONY: bench-node
bench-node: deps ## the QEMU node: Node Ready, pod start, the Service's first packet against the endpoint, NetworkPolicy first packet and policy change (about 15 min a run; RUNS=3)
	PATH="$(TOOLS):$$PATH" test/bench/node.sh

.PHONY: bench-storage
bench-storage: deps ## the QEMU node: a gpurack-local volume against its data disk mounted directly, a gpurack-shared volume against its NFS export mounted directly (O_DIRECT write and read), claim to volume (about 30 min; RUNS=1)
	PATH="$(TOOLS):$$PATH" test/bench/storage.sh

.PHONY: bench-etcd
bench-etcd: deps ## etcd's write latency (p50, p99, Puts/s) with 3 members against 1, fsync on, alternating (about 1 min; ETCD_RUNS=3)
	PATH="$(TOOLS):$$PATH" test/bench/etcd.sh

.PHONY: bench-inventory
bench-inventory: deps ## gpuboot's Register into bbolt against the cluster store (Machine objects in a real apiserver), alternating (about 2 min; INVENTORY_RUNS=3)
	PATH="$(TOOLS):$$PATH" test/bench/inventory.sh

.PHONY: bench-gpu
bench-gpu: deps ## a withdrawn GPU in the apiserver (kubelet status 1 s against 10 s) and Allocate p99, on a real kubelet (about 3 min)
	PATH="$(TOOLS):$$PATH" GO=$(GO) test/bench/gpu.sh

.PHONY: bench-rack
bench-rack: deps build ## the simulated rack (make demo) at 20 and 100 nodes: power-on to commissioned, gpuboot CPU and memory (RACKS="20 100")
	PATH="$(TOOLS):$$PATH" test/bench/rack.sh

.PHONY: bench-go
bench-go: ## Go benchmarks; writes the "go" section of docs/benchmarks.md
	PATH="$(TOOLS):$$PATH" GO=$(GO) test/bench/go.sh

.PHONY: bench-pxe
bench-pxe: ## gpuboot serve against nginx, tftpd-hpa and dnsmasq (perfdhcp); writes the PXE section of docs/benchmarks.md
	@for p in nginx tftpd-hpa dnsmasq-base kea-admin ipxe; do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$p; done
	test/bench/pxe.sh

.PHONY: gpu-check-bundle
gpu-check-bundle: ## build, gzipped into bin/gpu-check/, what hack/gpu-check.sh runs on a machine with an NVIDIA GPU (no Go needed there)
	hack/gpu-check-bundle.sh

.PHONY: clean
clean: ## remove ./bin (the cache outside the repository stays)
	rm -rf $(BIN)
