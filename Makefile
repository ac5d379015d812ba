# epd-operator — the two commands a newcomer needs are `make demo` and `make test`; `make help` lists the rest.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
.DEFAULT_GOAL := help

.PHONY: help install vllm-env k8s k8s-node node-images cluster cluster-down lint test test-unit test-loopback test-integration test-helm test-e2e test-node test-tools demo generate bench bench-tools bench-quick bench-e2e bench-autoscale bench-autoscale-keda bench-faults bench-gateway mutation module-sources images image-deps node-store-clean clean

help: ## this list: every target and what it does
	@awk 'BEGIN {FS = ":.*## "} /^[a-z][a-z0-9-]*:.*## / {printf "  %-21s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	@touch $(STAMP)

install: $(STAMP) ## .venv with the package (editable) and the test dependencies

# The real vLLM CPU venv and the tiny model the e2e tests and the parser checks run on, and vLLM 0.33's
# wheel (parser and config objects only, over the CPU venv's packages): built once (minutes, with
# progress) into ~/.cache/epd-operator, then reused by every run and fresh clone.
vllm-env: install ## the vLLM CPU venv, the tiny model and vLLM 0.33's parser, into ~/.cache/epd-operator
	$(BIN)/python -m dev.builds.venv
	$(BIN)/python -m dev.builds.tiny_model
	$(BIN)/python -m dev.builds.vllm_wheel

# The real Kubernetes control plane the tests run on (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, kwok) and the real node's kubelet and kube-proxy, built once by one `go build`
# from the official Go modules into ~/.cache/epd-operator/k8s (cold: tens of minutes on 2 cores, with
# progress), the cluster's DNS, CoreDNS, and the real node's NetworkPolicy engine, kube-router's firewall,
# from the Go module proxy (~/.cache/epd-operator/coredns, ~/.cache/epd-operator/kube-router).
k8s-node: install ## the Kubernetes 1.37 control plane, the real node's kubelet and kube-proxy (one go build), CoreDNS and kube-router
	$(BIN)/python -m dev.cluster.cli build --real-node
	$(BIN)/python -m dev.parts build coredns kube-router >/dev/null

# Plus the oldest supported kube-apiserver, prometheus-adapter for the custom metrics API the encoder
# HPA reads (~/.cache/epd-operator/prometheus-adapter), the LeaderWorkerSet controller for multi-node
# tiers (~/.cache/epd-operator/lws) and KEDA's operator and metrics server for tiers scaled by KEDA
# (~/.cache/epd-operator/keda): only the tests marked late_build need them, which `make test` runs
# once they are built; their cold builds would take it past its time budget.
k8s: k8s-node ## all of k8s-node, 1.34's kube-apiserver, prometheus-adapter, the LWS controller and KEDA, from source, cached
	$(BIN)/python -m dev.cluster.cli build --oldest
	$(BIN)/python -m dev.parts build prometheus-adapter lws keda

# The node tier's images as archives (dev/builds/images.py), built beside the Go builds: they copy files where
# those compile. Only where a real node can run (root, buildah, mmdebstrap); elsewhere its tests skip.
node-images: vllm-env ## the node tier's images as archives, without loading them (where a real node can run)
	@if [ "$$(id -u)" = 0 ] && command -v buildah >/dev/null && command -v mmdebstrap >/dev/null; then \
	  $(BIN)/python -m dev.builds.images build pause coredns echo vllm-stub base operator vllm-cpu >/dev/null; \
	else echo "make test: no root, buildah or mmdebstrap here: the node tier's images are not built and its tests skip"; fi

# A local control plane with fake GPU nodes and a real node (containerd, runc, CNI, kubelet, kube-proxy,
# kube-router's firewall, in namespaces of its own: root and
# `apt-get install runc containerd containernetworking-plugins ipset`),
# in the background: prints the kubeconfig and how to stop it. `make images` loads the images into it.
# PARTS names the cluster parts to run beside it (dev/parts/registry.py; `python -m dev.parts list`).
PARTS ?= lws
cluster: k8s-node ## start a local control plane with fake GPU nodes, a real node enforcing NetworkPolicies and the LWS controller in the background (PARTS="lws keda gateway": those parts, dev/parts/registry.py)
	$(BIN)/python -m dev.cluster.cli up --detach --real-node $(addprefix --part=,$(PARTS))

cluster-down: install ## stop the local control plane
	$(BIN)/python -m dev.cluster.cli down

# The real node's image store (~/.cache/epd-operator/node/containerd): containerd roots kept between
# clusters so that images are imported once. Refused while a cluster's node holds a slot.
node-store-clean: install ## empty the real node's image store (refused while a cluster runs)
	$(BIN)/python -m dev.node.store clear

# ruff (lint and format) over the code and tests, mypy over the package (it ships py.typed).
lint: install ## ruff check, ruff format --check and mypy (what the pre-commit hooks run)
	$(BIN)/ruff check operator dev tests bench
	$(BIN)/ruff format --check operator dev tests bench
	$(BIN)/mypy

# The test tiers, one folder each, named by what they need (docs/development.md#test-tiers).
# `make test` is lint, then every tier in one pytest run with the node tier's quick part beside it
# (dev/testing/test_streams.py); .ci/run calls it. The caches build side by side: the Go builds are CPU, the vLLM
# venv and the images mostly download, unpack and copy.
test: install ## lint, then every test tier, the node tier's quick part beside the rest (CI: .ci/run)
	$(MAKE) -j3 vllm-env k8s-node test-tools node-images module-sources
	$(MAKE) lint
	$(BIN)/python -m dev.testing.test_streams

# Pure tests: no process, no socket, no heavy build; a fresh clone needs the venv and the sources below.
test-unit: install module-sources ## the pure tier (tests/unit): needs only the venv and KEDA's module source
	$(BIN)/pytest tests/unit

# Routers, workers, the janitor sidecar and fake vLLM backends as processes and loopback servers.
test-loopback: install ## processes and loopback servers (tests/loopback)
	$(BIN)/pytest tests/loopback

test-integration: k8s test-tools ## the real control plane (tests/integration)
	$(BIN)/pytest tests/integration

# The charts with pinned helm 3 and 4, installed into the real control plane.
test-helm: k8s test-tools ## both charts with helm 3 and 4 (tests/helm)
	$(BIN)/pytest tests/helm

test-e2e: vllm-env ## real vLLM on CPU (tests/e2e; kind tests need kind and Docker)
	$(BIN)/pytest tests/e2e

# Pods on the local cluster's real node: root, Debian's runtime packages, the kubelet (built on first use).
# `-m "not long"` leaves out the experiments of tens of minutes (the whole fault table, the autoscaling loop).
test-node: k8s-node ## the local cluster's real node (tests/node; root, containerd, runc, CNI plugins)
	$(BIN)/pytest tests/node

# Debian's packages the tests use: prometheus (promtool evaluates the chart's adapter rules in
# tests/helm; Prometheus feeds the custom metrics API in the autoscaling integration test) and
# libibverbs (the Mooncake transfer engine loads it, tests/e2e/test_mooncake_transfer.py). Installed
# when missing and possible, else those tests skip and say why.
test-tools: ## install Debian's prometheus and libibverbs for the autoscaling and Mooncake tests when missing and possible
	@command -v promtool >/dev/null && ldconfig -p | grep -q 'libibverbs\.so\.1' \
	  || (command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && apt-get update -q \
	  && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus libibverbs1 ibverbs-providers) \
	  || echo "test: prometheus/promtool or libibverbs are not installed; the tests that need them will skip (apt-get install prometheus libibverbs1 ibverbs-providers)"

# EXAMPLE=examples/epd-nixl-autoscaled.yaml runs E/P/D with KV over NIXL (default: E+PD, shared storage).
demo: install ## run an example on this machine on real vLLM (EXAMPLE=examples/...yaml)
	$(BIN)/python -m dev.local.demo $(if $(EXAMPLE),--example $(EXAMPLE))

# Every generated file from its generator (dev/generate): the CRD and the operator chart's copy, the
# Kubernetes schemas the API embeds, the deployment chart's values schema, the dashboard, docs/api.md's reference.
# The Go module sources generators read (KEDA's CRDs, for the ScaledObject types in api/kube_schemas.json),
# downloaded into Go's module cache once (seconds): the pure tier checks generated files without a process.
module-sources: install ## download the Go module sources make generate reads (KEDA's release)
	$(BIN)/python -m dev.parts.keda >/dev/null

generate: install module-sources ## rewrite every generated file from its generator (dev/generate)
	$(BIN)/python -m dev.generate

# The overhead benchmark drives load with wrk (Debian's package): installed when missing and possible.
bench-tools: ## install wrk for the overhead benchmark when missing and possible
	@command -v wrk >/dev/null || (command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && apt-get update -q && apt-get install -y -q wrk) \
	  || echo "bench: wrk is not installed; the router-overhead section will say so (apt-get install wrk)"

bench: install bench-tools ## the router and operator benchmarks (bench/results/)
	$(BIN)/python -m bench.run

bench-quick: install bench-tools ## the benchmarks, shortened
	$(BIN)/python -m bench.run --quick

# Real vLLM tiers (2 encoders + PD, as render() makes them) behind each router on a Zipf image workload:
# bench/results/bench-e2e.md and .png (about 20 minutes; QUICK=1: a few minutes, bench-e2e-quick.*).
bench-e2e: vllm-env ## real vLLM tiers behind each router on an image workload (QUICK=1: shorter)
	@$(BIN)/python -c "import matplotlib, PIL" 2>/dev/null || $(BIN)/pip install -q -e '.[test,bench]'
	$(BIN)/python -m bench.e2e $(if $(QUICK),--quick)

# The encoder autoscaling loop on the local cluster's real node (root, like test-node): light load, a step that
# needs 4 encoders, light load again through the router Service, spill-over off then on; the HPA scales the encoders
# 1 -> 4 -> 1 on the routers' demand read through Prometheus and prometheus-adapter. bench/results/autoscale.md,
# .png, .json (about 16 minutes with the vLLM image in the node store). The node test's 1 -> 2 loop, which this
# replaced here to stay within that time: python -m bench.autoscale --profile small (autoscale-small.md).
bench-autoscale: k8s-node test-tools ## the encoder autoscaling loop on real pods: first decision, first spill, every needed encoder serving, drain
	@$(BIN)/python -c "import matplotlib" 2>/dev/null || $(BIN)/pip install -q -e '.[test,bench]'
	$(BIN)/python -m bench.autoscale

# The same loop with the KEDA engine: the encoder tier from zero (light load served raw by the consumer), a step
# that wakes it and takes it to 2, light load while KEDA takes it back to zero. KEDA's operator and metrics server
# run in the real node's network namespace beside Prometheus (make k8s builds KEDA). bench/results/autoscale-keda.md,
# .png, .json (about 20 minutes with the vLLM image in the node store).
bench-autoscale-keda: k8s-node test-tools ## the encoder tier scaled to zero and back by KEDA on real pods: time to serve, latency at zero
	@$(BIN)/python -c "import matplotlib" 2>/dev/null || $(BIN)/pip install -q -e '.[test,bench]'
	$(BIN)/python -m dev.parts build keda >/dev/null
	$(BIN)/python -m bench.autoscale --keda

# What the local cluster's gateway (Traefik as a pod) adds to a request against the router Service reached
# directly: p50 and CPU per request. bench/results/gateway.md and .json (about 10 minutes on 2 cores).
bench-gateway: k8s-node ## the gateway's added latency and CPU per request, on real pods
	$(BIN)/python -m bench.gateway

# The fault table on the local cluster's real node (root, like test-node): two pods per tier under steady load
# through the router Service; pods, a router, the operator, the API server and etcd, the kubelet fail one after
# another; then Prometheus and prometheus-adapter stop for a minute each under an autoscaled encoder tier.
# bench/results/faults.md and .json (about 50 minutes on 2 cores with the vLLM image in the node store; rows
# alone: python -m bench.faults --only prometheus_lost,adapter_lost).
bench-faults: k8s-node test-tools ## the fault table on real pods: what each fault costs a client, in figures
	$(BIN)/python -m bench.faults

# Mutation score of every product module the fast tests reach, per group (dev/testing/mutation.py's GROUPS) with mutmut:
# each mutant runs only the unit and in-process loopback tests that reach it. A run replaces its groups' results
# in bench/results/mutation.json and renders bench/results/mutation.md, which lists every module of the package;
# fails when a module of the run is under 95% or a surviving mutant is unexplained. GROUP=kube runs one group
# (from a minute for cli to over ten for kube, on 2 cores); JOBS=1 runs one mutant at a time (default: one per
# core). STALE=1 runs nothing and lists the stored rows whose modules changed since the commit they were measured at.
mutation: install ## mutation score per group (GROUP=kube: one group; JOBS=n mutants at once; STALE=1: list stale rows)
	@$(BIN)/python -c "import mutmut" 2>/dev/null || $(BIN)/pip install -q -e '.[test,mutation]'
	$(BIN)/python dev/testing/mutation.py $(if $(STALE),--stale,$(if $(GROUP),--group $(GROUP)) $(if $(JOBS),--jobs $(JOBS)))

image-deps: install ## whether images/vllm-epd's pins resolve with its base image's vLLM (pip --dry-run; needs PyPI, ~2 min)
	$(BIN)/python -m dev.builds.image_deps

# The images a local real node runs, without Docker or a registry: buildah and mmdebstrap (Debian's
# packages) build them into ~/.cache/epd-operator/images as OCI archives keyed by their inputs, and load
# them into a running `make cluster`. With a working Docker daemon, docker builds the operator and vLLM CPU
# Dockerfiles from their usual bases instead, under the names the chart and the example use, and they are
# loaded the same way (dev/builds/images.py).
images: install ## the images the real node runs, loaded into `make cluster` (buildah, or docker build where Docker works)
	$(BIN)/python -m dev.builds.images load

clean: ## remove .venv and build outputs
	rm -rf $(VENV) .pytest_cache build *.egg-info operator/*.egg-info
