# Two commands do everything on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed

.PHONY: demo test lint controlplane helm promtool runtime image browser venv clean-cluster proto crds

# nicop (what a user installs) and nicop-sim (the simulation, the local cluster and the demo).
$(INSTALLED): pyproject.toml sim/pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]' -e ./sim
	@touch $@

venv: $(INSTALLED)

# Builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok once per machine.
controlplane:
	@hack/build-controlplane.sh >/dev/null

# Builds helm (renders and tests the chart in deploy/helm/nicop) once per machine.
helm:
	@hack/build-helm.sh >/dev/null

# Builds promtool (checks the chart's PrometheusRule) once per machine.
promtool:
	@hack/build-promtool.sh >/dev/null

# Builds containerd, runc, crictl, the reference CNI plugins and pause (a real node's runtime)
# once per machine.
runtime:
	@hack/build-runtime.sh >/dev/null

# Installs Debian's Chromium once per machine: the bundle report's test renders the page in it.
browser:
	@hack/install-browser.sh >/dev/null

# Builds nicop's OCI image (Debian bookworm + nicop in a virtualenv; root, no registry), cached
# by the sources that make it; prints the archive's path.
image: $(INSTALLED)
	@PYTHON=$(PY) hack/build-image.sh >/dev/null

# As root the demo adds a real node: its runtime and nicop's image are built first (once,
# cached); when that cannot be done, the demo runs without it and says why.
demo: $(INSTALLED) controlplane
	@if [ "$$(id -u)" = 0 ]; then hack/build-runtime.sh >/dev/null && \
		PYTHON=$(PY) hack/build-image.sh >/dev/null || echo "no real node: see above"; fi
	$(VENV)/bin/nicop demo

# The real node's tests need the runtime and nicop's image (as root; built once, cached); the
# bundle report's test needs a browser.
# Line coverage of the test process (slipcover: a fraction of coverage.py's cost), printed per
# package, with a floor (tests/coverage_floor.py); generated protobuf modules left out.
test: $(INSTALLED) controlplane runtime image helm promtool browser lint
	@mkdir -p test-artifacts
	$(PY) -m slipcover --source src/nicop,sim/nicop_sim --omit '*_pb2.py,*_pb2_grpc.py' \
		--json --out test-artifacts/coverage.json -m pytest
	$(PY) tests/coverage_floor.py test-artifacts/coverage.json

lint: $(INSTALLED)
	$(VENV)/bin/ruff check src sim tests bench
	$(VENV)/bin/mypy

clean-cluster: $(INSTALLED)
	$(VENV)/bin/nicop cluster down

# Regenerates the gRPC code of the kubelet APIs (device plugin, DRA plugin, plugin registration).
proto: $(INSTALLED)
	$(PY) -m nicop.node.deviceplugin.protogen

# Regenerates deploy/crds from the API models and copies them into the Helm chart.
crds: $(INSTALLED)
	$(VENV)/bin/nicop crds generate
	rm -f deploy/helm/nicop/crds/*.yaml && cp deploy/crds/*.yaml deploy/helm/nicop/crds/
