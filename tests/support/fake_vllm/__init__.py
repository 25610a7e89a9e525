"""A stand-in ``vllm`` executable for tests: ``vllm run-batch`` over the emulator's model.

It honours ``vllm run-batch -i IN -o OUT --model M [--output-tmp-dir D]`` (other engine flags are accepted and
ignored) and vLLM 0.33's batch formats: OpenAI batch lines in (``/v1/chat/completions`` and
``/v1/embeddings`` answered; any other url gets the engine's per-line 400); out, one line per
input line, in input order. ``IN`` and ``OUT`` are local paths or http(s) URLs, as in vLLM, and
through the engine's HTTP client (aiohttp, which re-encodes a presigned query): an input URL is
read with one GET (an HTTP error fails the run, exit 1); an output URL is staged in a file (under
``--output-tmp-dir`` if given) and written with one PUT of that file (``Content-Type:
application/octet-stream``, any 2xx is success, 5 tries 5 s apart) once every line is done, and
not at all if the run fails. Every input line is checked as the engine checks it
(``airflow_batch_provider.adapters.vllm_input``, itself checked against the engine's own models
in ``tests/vllm_engine``); ``tests/vllm_engine`` also compares this stand-in's answers with the
real engine's for the same input file. A local output
file gets each line as it finishes, flushed::

    {"id": "vllm-<hex>", "custom_id": ..., "response": {"status_code": 200,
     "request_id": "vllm-batch-<hex>", "body": {<chat.completion>}}, "error": null}

Errors take vLLM's two shapes: a handler error has ``status_code`` 4xx/5xx, ``body: null`` and
``error: {"error": {"message", "type", "param", "code"}}``; a routing error (unsupported url,
``stream: true``) has ``status_code`` 400, ``body: null`` and ``error`` a bare string. Like vLLM, a
line that is not a valid request fails the whole file before anything is written (exit 1), and
the exit code is 0 once every line was handled, even if every line is an error.

Knobs (environment):

- ``FAKE_VLLM_CRASH_AFTER=N``: exit 1 ("engine dead") after writing N lines;
- ``FAKE_VLLM_STRING_ERROR_EVERY=K``: every K-th line gets a routing error (bare string);
- ``FAKE_VLLM_NULL_BODY_EVERY=K``: every K-th line gets a 500 with a null body and an error object;
- ``FAKE_VLLM_DELAY_S=X``: sleep X seconds before each line (a slow engine);
- ``FAKE_VLLM_SLOW_AFTER=N``: with ``DELAY_S``, answer the first N lines at once and only then slow down;
- ``FAKE_VLLM_UPLOAD_RETRY_S=X``: seconds between upload tries (vLLM's 5 by default);
- ``FAKE_VLLM_REQUIRE_ENV=NAME``: exit 1 at start unless env NAME is set (e.g. the hub token).
- ``FAKE_VLLM_VERSION=X``: the version its start line logs (``vLLM batch processing API version X``);
- ``FAKE_VLLM_REFUSE_CUSTOM_ID=ID``: refuse the line of that custom id as the engine refuses an
  invalid line (``Invalid request on line N``, exit 1, no output): a rule the lane's checks miss.
"""
