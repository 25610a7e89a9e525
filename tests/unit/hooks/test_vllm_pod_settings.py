"""The vllm_kubernetes connection's extras."""

from __future__ import annotations

import pytest

from airflow_batch_provider.exceptions import ConfigurationError
from airflow_batch_provider.hooks.vllm_pod_settings import VllmPodSettings, job_label


def test_extras_are_read_with_their_types_and_defaults_long_enough_for_gpu_autoscaling() -> None:
    s = VllmPodSettings.from_extra(
        {"gpu_count": "4", "usd_per_gpu_hour": "3.2", "tolerations": [{"key": "gpu"}], "max_model_len": 8192}
    )
    assert (s.gpu_count, s.usd_per_gpu_hour, s.max_model_len) == (4, 3.2, 8192)
    assert s.tolerations == ({"key": "gpu"},)
    assert s.schedule_timeout_s >= 900 and s.startup_timeout_s >= 900


def test_a_misspelt_extra_is_refused_by_name_not_ignored() -> None:
    with pytest.raises(ConfigurationError, match="gpu_cout"):
        VllmPodSettings.from_extra({"gpu_cout": 2})
    with pytest.raises(ConfigurationError, match="gpu_count"):
        VllmPodSettings.from_extra({"gpu_count": "two"})
    with pytest.raises(ConfigurationError, match="negative"):
        VllmPodSettings.from_extra({"usd_per_gpu_hour": -1})


def test_the_command_line_carries_tensor_parallel_memory_and_length_but_no_secret() -> None:
    s = VllmPodSettings.from_extra({"gpu_count": 2, "max_model_len": 4096, "hub_token_secret": "hf"})
    args = s.run_batch_args("m", "/exchange/k.jsonl", "/exchange/k.output.jsonl")
    assert args[:8] == [
        "vllm",
        "run-batch",
        "-i",
        "/exchange/k.jsonl",
        "-o",
        "/exchange/k.output.jsonl",
        "--model",
        "m",
    ]
    assert args[args.index("--tensor-parallel-size") + 1] == "2"
    assert args[args.index("--max-model-len") + 1] == "4096"
    assert "hf" not in args


def test_a_job_label_must_be_a_valid_kubernetes_label_value() -> None:
    assert job_label("abp-0123") == "abp-0123"
    with pytest.raises(ConfigurationError, match="label value"):
        job_label("x" * 64)


@pytest.mark.parametrize(
    "extra",
    [
        {"presign_expiry_s": 3600},  # not past the default 1800 s scheduling + 1800 s startup
        {"presign_expiry_s": 7200, "schedule_timeout_s": 7200},
        {"presign_expiry_s": 8 * 24 * 3600},  # S3 and GCS sign for 7 days at most
    ],
)
def test_presigned_urls_must_outlive_the_pod_s_wait_and_start_and_no_more_than_seven_days(
    extra: dict[str, int],
) -> None:
    with pytest.raises(ConfigurationError, match="presign_expiry_s"):
        VllmPodSettings.from_extra(extra)
    assert VllmPodSettings.from_extra({}).presign_expiry_s == 86400


def test_a_presigned_output_is_staged_on_disk_not_held_in_the_engine_s_memory() -> None:
    from airflow_batch_provider.hooks.vllm_pod_settings import OUTPUT_TMP_DIR

    s = VllmPodSettings.from_extra({})
    to_url = s.run_batch_args("m", "https://b.s3/in?X-Amz-Signature=a", "https://b.s3/out?X-Amz-Signature=b")
    assert to_url[to_url.index("--output-tmp-dir") + 1] == OUTPUT_TMP_DIR
    local = s.run_batch_args("m", "/exchange/k.jsonl", "/exchange/k.output.jsonl")
    assert "--output-tmp-dir" not in local  # a local output is written to its file directly


def test_an_image_older_than_the_lane_s_minimum_engine_is_refused_naming_both_versions() -> None:
    from airflow_batch_provider.adapters.vllm_engine import MIN_ENGINE_VERSION, image_version

    assert MIN_ENGINE_VERSION == (0, 32, 0)
    assert image_version("vllm/vllm-openai:v0.33.0") == (0, 33, 0)
    assert image_version("registry.local:5000/vllm-cpu:0.32.0-avx2") == (0, 32, 0)
    assert image_version("vllm/vllm-openai:latest") is None  # no version in the tag: not judged here
    with pytest.raises(ConfigurationError, match=r"v0\.10\.1.*0\.32\.0.*--output-tmp-dir"):
        VllmPodSettings.from_extra({"image": "vllm/vllm-openai:v0.10.1"})
    VllmPodSettings.from_extra({"image": "vllm/vllm-openai:latest"})
