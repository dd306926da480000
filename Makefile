# The two commands a new user runs first (README): `make demo` and `make test`.
# Each creates .venv when it is missing. Everything else is here for developers and CI.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-dev

.PHONY: demo test test-py test-ansible slurm-up slurm-down bench bench-quick clean venv

venv: $(STAMP)

# Read from the installed metadata (importing torch takes seconds).
export TORCH_VERSIONS := from importlib.metadata import version; print(version("torch"), version("torchvision"))

$(STAMP): setup.cfg pyproject.toml
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --quiet --upgrade pip
	# torch/torchvision: the releases pinned on this platform's disk (see README, "Install").
	$(VPY) -m pip install --quiet -e '.[dev]'
	# The clients examples/ runs (Lightning, accelerate, transformers; setup.cfg), on the torch just installed:
	# a second install, so a client's need for torch is met by that torch; one that would replace it stops here.
	@$(VPY) -c "$$TORCH_VERSIONS" > $(VENV)/.torch-before-clients
	$(VPY) -m pip install --quiet -e '.[dev,clients]'
	@$(VPY) -c "$$TORCH_VERSIONS" | cmp -s - $(VENV)/.torch-before-clients \
		|| { echo "make venv: the clients extra replaced torch/torchvision: $$($(VPY) -c "$$TORCH_VERSIONS")" >&2; exit 1; }
	$(VPY) -m pip check
	@touch $(STAMP)

## The main job on the embedded default: 2 local DDP ranks on CPUs, real bundled data.
demo: $(STAMP)
	$(VENV)/bin/hpc-train submit --cluster local --wait

## Everything CI runs: Python suites (unit, training, real Slurm) then the Ansible ladder.
## Both run even if the first fails; each prints its wall time.
test: $(STAMP)
	@rc=0; for suite in test-py test-ansible; do \
		start=$$(date +%s); $(MAKE) --no-print-directory $$suite || rc=1; \
		echo "=== $$suite took $$(( $$(date +%s) - start )) s"; \
	done; exit $$rc

test-py: $(STAMP)
	$(VPY) -m pytest -q tests --ignore=tests/ansible

test-ansible:
	bash tests/ansible/run.sh

slurm-up:
	tests/cluster/slurm-up

slurm-down:
	tests/cluster/slurm-down

bench: $(STAMP)
	$(VPY) benchmarks/run.py

bench-quick: $(STAMP)
	$(VPY) benchmarks/run.py --quick

clean:
	rm -rf build dist *.egg-info .pytest_cache
