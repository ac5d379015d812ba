# epd-operator — the two commands a newcomer needs are `make demo` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install vllm-env k8s cluster cluster-down lint test test-unit test-loopback test-integration test-helm test-e2e demo generate bench bench-tools bench-quick bench-e2e mutation images clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	@touch $(STAMP)

install: $(STAMP)

# The real vLLM CPU venv and the tiny model the e2e tests and the parser checks run on, and vLLM 0.33's
# wheel (parser and config objects only, over the CPU venv's packages): built once (minutes, with
# progress) into ~/.cache/epd-operator, then reused by every run and fresh clone.
vllm-env: install
	$(BIN)/python -m dev.venv
	$(BIN)/python -m dev.tiny_model
	$(BIN)/python -m dev.vllm_wheel

# The real Kubernetes control plane the tests run on (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, kwok), built once from the official Go modules into ~/.cache/epd-operator/k8s
# (cold: tens of minutes on 2 cores, with progress), plus the oldest supported kube-apiserver.
k8s: install
	$(BIN)/python -m dev.cluster build
	$(BIN)/python -m dev.cluster build --oldest

# A local control plane with fake GPU nodes, in the background: prints the kubeconfig and how to stop it.
cluster: k8s
	$(BIN)/python -m dev.cluster up --detach

cluster-down: install
	$(BIN)/python -m dev.cluster down

# ruff (lint and format) over the code and tests, mypy over the package (it ships py.typed).
lint: install
	$(BIN)/ruff check operator dev tests bench
	$(BIN)/ruff format --check operator dev tests bench
	$(BIN)/mypy

# The test tiers, one folder each, named by what they need (docs/development.md#test-tiers).
# `make test` is lint plus every tier in one pytest run; .ci/run calls it.
test: vllm-env k8s lint
	$(BIN)/pytest

# Pure tests: no process, no socket, no heavy build; a fresh clone needs only the venv.
test-unit: install
	$(BIN)/pytest tests/unit

# Routers, workers, the janitor sidecar and fake vLLM backends as processes and loopback servers.
test-loopback: install
	$(BIN)/pytest tests/loopback

# The real Kubernetes control plane.
test-integration: k8s
	$(BIN)/pytest tests/integration

# The charts with pinned helm 3 and 4, installed into the real control plane.
test-helm: k8s
	$(BIN)/pytest tests/helm

# Real vLLM on CPU (tests/e2e/kind also needs kind and Docker, and skips without them).
test-e2e: vllm-env
	$(BIN)/pytest tests/e2e

# EXAMPLE=examples/epd-nixl-autoscaled.yaml runs E/P/D with KV over NIXL (default: E+PD, shared storage).
demo: install
	$(BIN)/python -m dev.demo $(if $(EXAMPLE),--example $(EXAMPLE))

# Every generated file from its generator (dev/generate): the CRD and the operator chart's copy, the
# Kubernetes schemas the API embeds, the deployment chart's values schema, the dashboard, docs/api.md's reference.
generate: install
	$(BIN)/python -m dev.generate

# The overhead benchmark drives load with wrk (Debian's package): installed when missing and possible.
bench-tools:
	@command -v wrk >/dev/null || (command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && apt-get update -q && apt-get install -y -q wrk) \
	  || echo "bench: wrk is not installed; the router-overhead section will say so (apt-get install wrk)"

bench: install bench-tools
	$(BIN)/python -m bench.run

bench-quick: install bench-tools
	$(BIN)/python -m bench.run --quick

# Real vLLM tiers (2 encoders + PD, as render() makes them) behind each router on a Zipf image workload:
# bench/results/bench-e2e.md and .png (about 20 minutes; QUICK=1: a few minutes, bench-e2e-quick.*).
bench-e2e: vllm-env
	@$(BIN)/python -c "import matplotlib, PIL" 2>/dev/null || $(BIN)/pip install -q -e '.[test,bench]'
	$(BIN)/python -m bench.e2e $(if $(QUICK),--quick)

# Mutation score of the pure core (render, router pickers/protocol/reuse, controller apply/status, api rules/
# validation) with mutmut: each mutant runs only the unit tests that reach it. Writes bench/results/mutation.md
# (about 20 minutes on 2 cores); fails when a group is under 90% or a surviving mutant is unexplained.
# GROUP=router runs one group (its report goes to build/mutation/mutation.md).
mutation: install
	@$(BIN)/python -c "import mutmut" 2>/dev/null || $(BIN)/pip install -q -e '.[test,mutation]'
	$(BIN)/python dev/mutation.py $(if $(GROUP),--group $(GROUP))

images:
	docker build -t epd-operator:dev -f images/operator/Dockerfile .
	docker build -t vllm-epd:dev -f images/vllm-epd/Dockerfile images/vllm-epd

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info operator/*.egg-info
