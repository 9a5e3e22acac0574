# azprobe: `make demo` and `make test` bring a fresh machine to a working state first.
SHELL := /bin/bash
PYTHON_SYSTEM ?= /usr/bin/python3
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
PREFIX ?= /opt/azprobe

.PHONY: setup host venv test test-unit demo bench lint clean install

setup: host venv

host:
	@bash scripts/setup-host.sh

# The files setup.py compiles with mypyc (pyproject.toml [tool.azprobe] compiled): the
# install is rebuilt when one changes, so the tests never run an older build of it.
COMPILED := $(shell $(PYTHON_SYSTEM) -c 'import tomllib; \
  print(*tomllib.load(open("pyproject.toml", "rb"))["tool"]["azprobe"]["compiled"])')

# The venv sees only the `bcc` package from the system (symlinked in), nothing else.
$(VENV)/.installed: pyproject.toml setup.py $(COMPILED) | host
	@test -x $(PY) || $(PYTHON_SYSTEM) -m venv $(VENV)
	@site=$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	  test -e $$site/bcc || ln -s /usr/lib/python3/dist-packages/bcc $$site/bcc
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[lab,test]'
	@touch $@

venv: $(VENV)/.installed

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

test-unit: setup
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

demo: setup
	$(VENV)/bin/azprobe lab demo

bench: setup
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

install: setup
	bash scripts/install.sh "$(PREFIX)"

clean:
	-$(VENV)/bin/azprobe lab down 2>/dev/null
	rm -rf $(VENV) build *.egg-info .pytest_cache
