"""The GPU planner against the seed's figures and a published vLLM throughput figure."""

from __future__ import annotations

import json

import pytest

from airflow_batch_provider.adapters.registry import compare_models
from airflow_batch_provider.core.gpu_planner import (
    GPUS,
    Workload,
    decode_floor_s,
    gpu_spec,
    main,
    plan,
    weights_bytes,
)
from airflow_batch_provider.core.pricing import PriceTable
from airflow_batch_provider.exceptions import ConfigurationError


def test_a_70b_fp16_model_on_one_h100_takes_41_8_ms_a_decode_step_about_24_tokens_a_second() -> None:
    """Seed 000, section 2: 140 GB of weights read once per step at 3.35 TB/s."""
    assert weights_bytes(70, "fp16") == 140e9
    step = decode_floor_s(70, "fp16", GPUS["H100"])
    assert step == pytest.approx(0.0418, abs=0.00005)
    result = plan(
        params_b=70, precision="fp16", gpu="H100", workload=Workload(1000, 500, 200), usd_per_gpu_hour=2.5
    )
    assert result.single_stream_tps == pytest.approx(23.9, abs=0.1)
    assert not result.fits and "tensor parallel" in result.notes[0]  # 140 GB does not fit in 80 GB


def test_an_8b_fp8_model_on_one_h100_is_within_a_factor_two_of_a_published_vllm_figure() -> None:
    """Published: Red Hat's MLPerf Inference v5.1 submission, Llama-3.1-8B in FP8 with vLLM 0.10.0 on
    one H100, 5,777 output tokens/s in the Offline scenario (Red Hat blog, "Efficient and
    reproducible LLM inference: Red Hat MLPerf Inference v5.1 results",
    https://www.redhat.com/en/blog/efficient-and-reproducible-llm-inference-red-hat-mlperf-inference-v51-results).
    The MLPerf Llama-3.1-8B task is CNN/DailyMail summarisation: roughly 780 input and up to 128
    output tokens a sample. Order of magnitude only: the planner is a first-order model."""
    result = plan(
        params_b=8, precision="fp8", gpu="H100", workload=Workload(13368, 778, 128), usd_per_gpu_hour=2.5
    )
    assert result.fits and result.batch_size == 256
    assert 5777 / 2 < result.steady_output_tps < 5777 * 2


def test_more_gpus_lower_the_decode_floor_in_proportion() -> None:
    one = decode_floor_s(70, "fp16", GPUS["H100"], gpus=1)
    assert decode_floor_s(70, "fp16", GPUS["H100"], gpus=2) == pytest.approx(one / 2)
    assert decode_floor_s(70, "fp8", GPUS["H100"]) == pytest.approx(one / 2)


def test_faster_memory_gives_a_lower_floor_in_the_order_of_bandwidth() -> None:
    floors = {name: decode_floor_s(8, "bf16", spec) for name, spec in GPUS.items()}
    assert sorted(floors, key=floors.__getitem__) == ["H200", "H100", "A100", "L40S", "L4"]


def test_the_cost_comparison_names_the_cheaper_lane_both_ways() -> None:
    prices = PriceTable.load()
    work = Workload(1_000_000, 500, 100)
    compare = compare_models()  # what each adapter declares; core names no provider
    cheap_gpu = plan(
        params_b=8,
        precision="fp8",
        gpu="H100",
        workload=work,
        usd_per_gpu_hour=2.0,
        prices=prices,
        compare=compare,
    )
    assert cheap_gpu.cheaper == "self-hosted"
    assert cheap_gpu.self_hosted_usd == pytest.approx(cheap_gpu.gpu_hours * 2.0)
    assert cheap_gpu.usd_per_item == pytest.approx(cheap_gpu.self_hosted_usd / 1_000_000)
    small = Workload(1_000, 500, 100)  # the model load alone costs more than the provider's batch
    dear = plan(
        params_b=8,
        precision="fp8",
        gpu="H100",
        workload=small,
        usd_per_gpu_hour=50.0,
        prices=prices,
        compare=compare,
    )
    assert dear.cheaper != "self-hosted"
    assert {q.provider for q in dear.providers} == {"openai", "anthropic", "gemini", "bedrock"}


def test_unknown_gpus_precisions_and_negative_inputs_are_refused_with_the_known_values() -> None:
    with pytest.raises(ConfigurationError, match="H100"):
        gpu_spec("V100")
    with pytest.raises(ConfigurationError, match="fp8"):
        weights_bytes(8, "fp4")
    with pytest.raises(ConfigurationError, match="gpus=0"):
        plan(params_b=8, precision="fp8", gpu="L4", workload=Workload(1, 1, 1), usd_per_gpu_hour=1, gpus=0)


def test_the_command_prints_a_table_or_json(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--params-b", "70", "--precision", "fp16", "--gpu", "h100", "--items", "1000"]
    args += ["--input-tokens", "500", "--output-tokens", "200", "--usd-per-gpu-hour", "2.5"]
    assert main(args) == 0
    assert "decode floor 41.8 ms/step = 23.9 tok/s single stream" in capsys.readouterr().out
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["decode_floor_s"] == pytest.approx(0.0418, abs=0.00005)
    assert main([*args[:4], "--gpu", "tpu", *args[6:]]) == 2
