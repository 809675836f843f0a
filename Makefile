# The two Quick start commands: `make demo` and `make test`. Each creates the local virtual
# environment .venv on first use (Python >= 3.11 and pip are all a fresh machine needs).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: setup demo ember test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/ember demo
	@$(MAKE) --no-print-directory ember

# ember lives in $(VENV), not on PATH: say how to reach it.
ember:
	@echo "ember is installed in $(VENV): run 'source $(BIN)/activate' to type 'ember ...'," \
	      "or call $(BIN)/ember directly."

test: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) out
