"""GPU planner: what a workload costs on your own GPUs with vLLM, against each provider's batch price.

A first-order model, for deciding which lane is cheaper, not a benchmark:

- **Weights** = parameters x bytes per parameter (FP16/BF16 2, FP8/INT8 1, INT4 0.5).
- **Decode floor** (memory-bound): every decode step reads all weights once, so one stream's
  step takes at least ``weights / (HBM bandwidth x GPUs)``. A 70B model in FP16 (140 GB) on one
  H100 SXM (3.35 TB/s) needs 140 / 3350 s = 41.8 ms a step, about 24 tokens/s for one stream
  (the figure is a floor even though 140 GB does not fit in one 80 GB H100: the planner says so).
- **Batched throughput**: continuous batching shares each weight read among ``B`` streams, so a
  step of ``B`` tokens costs ``max(memory time, compute time)`` with memory = weights + the KV
  cache the ``B`` streams read, at ``bandwidth_efficiency`` of peak bandwidth, and compute =
  ``B x 2 x parameters`` FLOPs at ``compute_efficiency`` of peak dense FLOPs. ``B`` is capped by
  ``max_num_seqs`` and by the KV cache that fits in what the weights leave of
  ``gpu_memory_utilization`` x memory.
- **Prefill** is compute-bound: ``input tokens x 2 x parameters`` FLOPs.
- **Run time** = model load + prefill time + output tokens / batched decode rate. **Cost** = run
  time x GPUs x $/GPU-hour; compared per million tokens and per item with each provider's batch
  price for the same tokens (the shipped price table, or an override).

GPU figures are the vendors' datasheet numbers (dense tensor-core FLOPs, no sparsity).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from typing import Any, Final, Literal

from airflow_batch_provider.core.pricing import PriceTable, cost
from airflow_batch_provider.core.results import Usage
from airflow_batch_provider.exceptions import ConfigurationError

Precision = Literal["fp16", "bf16", "fp8", "int8", "int4"]
BYTES_PER_PARAM: Final[dict[str, float]] = {"fp16": 2.0, "bf16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model's datasheet figures.

    :param name: short name
    :param memory_gb: HBM/GDDR capacity in GB (10^9 bytes)
    :param bandwidth_tbs: memory bandwidth in TB/s (10^12 bytes/s)
    :param bf16_tflops: dense BF16/FP16 tensor-core TFLOPS
    :param fp8_tflops: dense FP8 (or INT8 where FP8 is absent) tensor TFLOPS
    :param source: where the figures come from
    """

    name: str
    memory_gb: float
    bandwidth_tbs: float
    bf16_tflops: float
    fp8_tflops: float
    source: str

    def tflops(self, precision: str) -> float:
        """Dense tensor throughput for weights in ``precision`` (8-bit and below use the 8-bit path).

        :param precision: weight precision
        """
        return self.bf16_tflops if precision in ("fp16", "bf16") else self.fp8_tflops


GPUS: Final[dict[str, GpuSpec]] = {
    "H100": GpuSpec("H100 SXM 80GB", 80, 3.35, 989, 1979, "NVIDIA H100 datasheet (SXM5)"),
    "H200": GpuSpec("H200 SXM 141GB", 141, 4.8, 989, 1979, "NVIDIA H200 datasheet (SXM)"),
    "A100": GpuSpec("A100 SXM 80GB", 80, 2.039, 312, 624, "NVIDIA A100 datasheet (80GB SXM; INT8 for 8-bit)"),
    "L40S": GpuSpec("L40S 48GB", 48, 0.864, 362, 733, "NVIDIA L40S datasheet"),
    "L4": GpuSpec("L4 24GB", 24, 0.3, 121, 242.5, "NVIDIA L4 datasheet"),
}


@dataclass(frozen=True)
class Workload:
    """What is to be run.

    :param items: requests
    :param input_tokens: prompt tokens per request (average)
    :param output_tokens: generated tokens per request (average)
    """

    items: int
    input_tokens: float
    output_tokens: float

    @property
    def usage(self) -> Usage:
        """The workload's total tokens."""
        return Usage(
            input_tokens=round(self.items * self.input_tokens),
            output_tokens=round(self.items * self.output_tokens),
        )


@dataclass(frozen=True)
class ProviderQuote:
    """The same tokens at one provider's batch price.

    :param provider: provider name
    :param model: the model priced
    :param total_usd: the workload's cost
    :param usd_per_million_tokens: per million tokens (input + output)
    :param usd_per_item: per request
    """

    provider: str
    model: str
    total_usd: float
    usd_per_million_tokens: float
    usd_per_item: float


@dataclass(frozen=True)
class Plan:
    """The planner's answer (all times in seconds, money in USD).

    :param gpu: the GPU's name
    :param gpus: GPUs per replica
    :param weights_gb: model weights
    :param fits: whether weights leave room for a KV cache in ``gpus`` x memory
    :param decode_floor_s: memory-bound time of one decode step at peak bandwidth
    :param single_stream_tps: tokens/s of one stream at that floor
    :param batch_size: concurrent streams the KV cache and ``max_num_seqs`` allow
    :param batched_decode_tps: output tokens/s with that batch
    :param bound: what limits a batched step: ``memory`` or ``compute``
    :param prefill_s: time to read every prompt
    :param run_s: load + prefill + decode
    :param gpu_hours: run time x GPUs
    :param self_hosted_usd: GPU hours x rate
    :param usd_per_million_tokens: self-hosted, per million tokens (input + output)
    :param usd_per_item: self-hosted, per request
    :param providers: the same tokens at each provider's batch price
    :param cheaper: ``self-hosted`` or the cheapest provider's name
    :param notes: caveats (does not fit, ...)
    :param load_s: model load time included in ``run_s``
    :param output_tokens: the workload's output tokens
    """

    gpu: str
    gpus: int
    weights_gb: float
    fits: bool
    decode_floor_s: float
    single_stream_tps: float
    batch_size: int
    batched_decode_tps: float
    bound: str
    prefill_s: float
    run_s: float
    gpu_hours: float
    self_hosted_usd: float
    usd_per_million_tokens: float
    usd_per_item: float
    providers: tuple[ProviderQuote, ...] = ()
    cheaper: str = "self-hosted"
    notes: tuple[str, ...] = field(default_factory=tuple)

    load_s: float = 0.0
    output_tokens: int = 0

    @property
    def steady_output_tps(self) -> float:
        """Output tokens/s over prefill and decode (model load excluded), as benchmarks report."""
        busy = self.run_s - self.load_s
        return self.output_tokens / busy if busy > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict."""
        return {**asdict(self), "steady_output_tps": self.steady_output_tps}

    def render(self) -> str:
        """A short text table."""
        lines = [
            f"{self.gpus} x {self.gpu}: weights {self.weights_gb:.1f} GB ({'fits' if self.fits else 'DOES NOT FIT'})",
            f"decode floor {self.decode_floor_s * 1000:.1f} ms/step = {self.single_stream_tps:.1f} tok/s single stream",
            f"batch {self.batch_size}: {self.batched_decode_tps:,.0f} output tok/s ({self.bound}-bound)",
            f"run {self.run_s / 3600:.2f} h (prefill {self.prefill_s:,.0f} s), {self.gpu_hours:.2f} GPU-h",
            f"self-hosted   ${self.self_hosted_usd:,.2f}  ${self.usd_per_million_tokens:.4f}/M tok  "
            f"${self.usd_per_item:.6f}/item",
        ]
        for q in self.providers:
            lines.append(
                f"{q.provider:<13} ${q.total_usd:,.2f}  ${q.usd_per_million_tokens:.4f}/M tok  "
                f"${q.usd_per_item:.6f}/item  ({q.model}, batch price)"
            )
        lines.append(f"cheaper: {self.cheaper}")
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


def weights_bytes(params_b: float, precision: str) -> float:
    """Bytes of weights.

    :param params_b: parameters in billions
    :param precision: ``fp16``, ``bf16``, ``fp8``, ``int8`` or ``int4``
    :raises ConfigurationError: unknown precision
    """
    if precision not in BYTES_PER_PARAM:
        raise ConfigurationError(f"precision {precision!r}; use one of {sorted(BYTES_PER_PARAM)}.")
    return params_b * 1e9 * BYTES_PER_PARAM[precision]


def decode_floor_s(params_b: float, precision: str, gpu: GpuSpec, gpus: int = 1) -> float:
    """Memory-bound time of one decode step: all weights read once at peak bandwidth.

    :param params_b: parameters in billions
    :param precision: weight precision
    :param gpu: the GPU
    :param gpus: GPUs sharing the weights (tensor parallel)
    """
    return weights_bytes(params_b, precision) / (gpu.bandwidth_tbs * 1e12 * gpus)


def default_kv_bytes_per_token(params_b: float) -> float:
    """A rough KV-cache size per token for a Llama-style model with grouped-query attention, FP16.

    Llama 3 8B: 32 layers x 8 KV heads x 128 dims x 2 (K, V) x 2 bytes = 128 KiB; it grows about
    with the square root of the size (70B: 80 layers, 8 KV heads = 320 KiB; this gives 379 KiB).

    :param params_b: parameters in billions
    """
    return 131072 * math.sqrt(params_b / 8)


def gpu_spec(name: str) -> GpuSpec:
    """Look up a GPU by short name.

    :param name: ``H100``, ``H200``, ``A100``, ``L40S`` or ``L4``
    :raises ConfigurationError: unknown GPU
    """
    key = name.upper().replace("-", "").replace(" ", "")
    found = {k.upper(): v for k, v in GPUS.items()}.get(key)
    if found is None:
        raise ConfigurationError(f"GPU {name!r} is not in the planner; known: {sorted(GPUS)}.")
    return found


def provider_quotes(
    usage: Usage, items: int, prices: PriceTable, models: Mapping[str, str]
) -> tuple[ProviderQuote, ...]:
    """The same tokens at each provider's batch price.

    :param usage: the tokens
    :param items: requests (for the per-item figure)
    :param prices: the price table
    :param models: provider -> model to price at (each adapter declares its own as
        ``compare_model``; the registry's ``compare_models()`` gathers them)
    """
    tokens = usage.total_tokens
    out = []
    for provider, model in models.items():
        total = cost(usage, prices.price(provider, model), "batch")
        out.append(
            ProviderQuote(
                provider=provider,
                model=model,
                total_usd=float(total),
                usd_per_million_tokens=float(total * Decimal(10**6) / tokens) if tokens else 0.0,
                usd_per_item=float(total / items) if items else 0.0,
            )
        )
    return tuple(out)


def plan(
    *,
    params_b: float,
    precision: str,
    gpu: str | GpuSpec,
    workload: Workload,
    usd_per_gpu_hour: float,
    gpus: int = 1,
    prices: PriceTable | None = None,
    compare: Mapping[str, str] | None = None,
    max_num_seqs: int = 256,
    gpu_memory_utilization: float = 0.9,
    kv_bytes_per_token: float | None = None,
    bandwidth_efficiency: float = 0.8,
    compute_efficiency: float = 0.5,
    load_s: float = 300.0,
) -> Plan:
    """Estimate a workload's run time and cost on ``gpus`` GPUs, against provider batch prices.

    :param params_b: parameters in billions
    :param precision: weight precision (``fp16``, ``bf16``, ``fp8``, ``int8``, ``int4``)
    :param gpu: GPU short name or spec
    :param workload: items and tokens per item
    :param usd_per_gpu_hour: your cost of one GPU-hour
    :param gpus: GPUs per replica (tensor parallel)
    :param prices: price table for the comparison (default: the shipped one)
    :param compare: provider -> model to compare with (the registry's ``compare_models()``, what
        the adapters declare); ``None``: no comparison
    :param max_num_seqs: vLLM's cap on concurrent sequences
    :param gpu_memory_utilization: share of GPU memory vLLM may use
    :param kv_bytes_per_token: KV cache bytes per token (default: :func:`default_kv_bytes_per_token`)
    :param bandwidth_efficiency: share of peak bandwidth a batched step reaches
    :param compute_efficiency: share of peak FLOPs prefill and batched decode reach
    :param load_s: seconds to start the pod and load the weights (paid, no tokens)
    :raises ConfigurationError: a value out of range
    """
    spec = gpu if isinstance(gpu, GpuSpec) else gpu_spec(gpu)
    if gpus < 1 or params_b <= 0 or workload.items < 0 or usd_per_gpu_hour < 0:
        raise ConfigurationError(
            f"gpus={gpus}, params_b={params_b}, items={workload.items}, usd_per_gpu_hour={usd_per_gpu_hour}: "
            "GPUs and parameters must be positive, items and the rate not negative."
        )
    notes: list[str] = []
    weights = weights_bytes(params_b, precision)
    budget = spec.memory_gb * 1e9 * gpus * gpu_memory_utilization
    kv_per_token = kv_bytes_per_token or default_kv_bytes_per_token(params_b)
    context = workload.input_tokens + workload.output_tokens / 2
    kv_room = budget - weights
    fits = kv_room > kv_per_token * (workload.input_tokens + workload.output_tokens)
    if not fits:
        need = math.ceil(weights / (spec.memory_gb * 1e9 * gpu_memory_utilization * 0.9))
        notes.append(
            f"{weights / 1e9:.0f} GB of weights leave no KV cache room in {gpus} x {spec.memory_gb:.0f} GB; "
            f"use about {need} GPUs (tensor parallel) or a lower precision. Run figures assume it fit."
        )
    batch = max(1, min(max_num_seqs, int(max(kv_room, 0) / (kv_per_token * max(context, 1)))))
    floor = decode_floor_s(params_b, precision, spec, gpus)
    flops = spec.tflops(precision) * 1e12 * gpus * compute_efficiency
    memory_step = (weights + batch * context * kv_per_token) / (
        spec.bandwidth_tbs * 1e12 * gpus * bandwidth_efficiency
    )
    compute_step = batch * 2 * params_b * 1e9 / flops
    step = max(memory_step, compute_step)
    decode_tps = batch / step
    usage = workload.usage
    prefill = usage.input_tokens * 2 * params_b * 1e9 / flops
    run = load_s + prefill + (usage.output_tokens / decode_tps if usage.output_tokens else 0.0)
    gpu_hours = run / 3600 * gpus
    total = gpu_hours * usd_per_gpu_hour
    tokens = usage.total_tokens
    quotes = provider_quotes(usage, workload.items, prices or PriceTable.load(), compare or {})
    cheapest = min(quotes, key=lambda q: q.total_usd, default=None)
    return Plan(
        gpu=spec.name,
        gpus=gpus,
        weights_gb=weights / 1e9,
        fits=fits,
        decode_floor_s=floor,
        single_stream_tps=1 / floor,
        batch_size=batch,
        batched_decode_tps=decode_tps,
        bound="memory" if memory_step >= compute_step else "compute",
        prefill_s=prefill,
        run_s=run,
        gpu_hours=gpu_hours,
        self_hosted_usd=total,
        usd_per_million_tokens=total * 1e6 / tokens if tokens else 0.0,
        usd_per_item=total / workload.items if workload.items else 0.0,
        providers=quotes,
        cheaper="self-hosted" if cheapest is None or total <= cheapest.total_usd else cheapest.provider,
        notes=tuple(notes),
        load_s=load_s,
        output_tokens=usage.output_tokens,
    )


def main(argv: Sequence[str] | None = None, compare: Mapping[str, str] | None = None) -> int:
    """Command line: ``python -m airflow_batch_provider.gpu_planner --params-b 8 ...``.

    :param argv: arguments (default: ``sys.argv[1:]``)
    :param compare: provider -> model to compare with (the entry point passes the adapters' own)
    """
    parser = argparse.ArgumentParser(
        prog="python -m airflow_batch_provider.gpu_planner",
        description="Estimate a self-hosted vLLM batch's run time and cost against provider batch prices.",
    )
    parser.add_argument("--params-b", type=float, required=True, help="parameters, in billions")
    parser.add_argument("--precision", default="bf16", choices=sorted(BYTES_PER_PARAM))
    parser.add_argument("--gpu", default="H100", help=f"one of {', '.join(GPUS)}")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs per replica (tensor parallel)")
    parser.add_argument("--items", type=int, required=True)
    parser.add_argument("--input-tokens", type=float, required=True, help="per item")
    parser.add_argument("--output-tokens", type=float, required=True, help="per item")
    parser.add_argument("--usd-per-gpu-hour", type=float, required=True)
    parser.add_argument("--pricing-override", help="JSON file merged over the shipped prices")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    try:
        result = plan(
            params_b=args.params_b,
            precision=args.precision,
            gpu=args.gpu,
            gpus=args.gpus,
            workload=Workload(args.items, args.input_tokens, args.output_tokens),
            usd_per_gpu_hour=args.usd_per_gpu_hour,
            prices=PriceTable.load(args.pricing_override),
            compare=compare,
        )
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result.to_dict(), indent=2) if args.json else result.render())
    return 0
