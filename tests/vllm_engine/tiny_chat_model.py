"""Build a tiny Llama chat model vLLM's CPU build loads, with random weights under a fixed seed.

Run with the engine's interpreter (``.venv-vllm/bin/python``), which has ``transformers``,
``tokenizers`` and ``torch``: ``python tiny_chat_model.py OUT_DIR``. No generative model that vLLM
loads ships in a wheel, so the test makes one (about 0.3M parameters, a few MB): 2 layers,
``head_dim`` 64 (the CPU attention kernel refuses 16), and a byte-level BPE tokenizer trained
here on a few sentences (``tokenizers``; byte-level, so whatever the model emits decodes to the
exact text: a WordPiece tokenizer such as MiniLM's puts spaces between pieces and turns a
grammar-constrained ``{"sentiment": ...}`` into ``{ " se n tim en t " ...``), with a chat template.
Its answers are noise; under the engine's structured outputs (``response_format`` json_schema)
they are valid JSON of the schema; their shape, usage and finish reason are the engine's.
"""

from __future__ import annotations

import sys
from pathlib import Path

#: The tokenizer's special tokens (beginning, end, padding).
SPECIAL = ("<s>", "</s>", "<pad>")
#: What the byte-level BPE is trained on: its merges only; every byte stays encodable.
CORPUS = (
    "You label customer feedback for a retailer. Return a JSON object with exactly the fields",
    '{"sentiment": "positive", "topic": "billing", "confidence": 0.5}',
    '{"sentiment": "negative", "topic": "delivery"} {"sentiment": "neutral", "topic": "support"}',
    "product_quality app_experience other Comment: the parcel came late and the app crashed",
)
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
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(1234)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS, vocab_size=512, min_frequency=1, special_tokens=list(SPECIAL))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
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
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
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
