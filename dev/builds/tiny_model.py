#!/usr/bin/env python3
"""Build (once) a tiny random-weight Qwen2-VL that real vLLM serves on a 2-core CPU.

No model can be downloaded here, so the end-to-end tests and `make demo` use a model built
locally: a Qwen2-VL with a 2-layer, 128-wide language model, a 2-block vision tower, a
byte-level BPE tokenizer trained on a few sentences, the Qwen special tokens, a Qwen-style
chat template and an image processor capped at 64 image tokens. Its answers are garbage, but
every byte vLLM handles on the E -> PD path (image placeholders, encoder output shape,
embeddings in the shared store) is the same as for a real Qwen2-VL.

Building needs torch/transformers/tokenizers, which only the vLLM venv has: this file is also
the build script, run with that venv's python. The result is cached under
``$EPD_CACHE/models/tiny-qwen2-vl-<RECIPE>`` with a ``.ready`` marker.

Usage: ``python -m dev.builds.tiny_model`` -- prints the model directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

# Bump when anything below changes what is built, so cached models are rebuilt.
RECIPE = "2"
CACHE = Path(os.environ.get("EPD_CACHE", Path.home() / ".cache" / "epd-operator"))
MODEL_DIR = CACHE / "models" / f"tiny-qwen2-vl-{RECIPE}"
# A stable name for the current recipe's model, beside it (relative, so it resolves wherever the
# model cache is mounted: examples/epd-local-cpu.yaml loads /models/tiny-qwen2-vl).
MODEL_LINK = MODEL_DIR.with_name("tiny-qwen2-vl")
# The name vLLM reports in /v1/models and expects in requests.
SERVED_NAME = "tiny-qwen2-vl"

# Qwen2-VL's image grid: 14-pixel patches merged 2x2, so one image token covers 28x28 pixels.
IMAGE_TOKEN_PIXELS = 28 * 28
MAX_IMAGE_TOKENS = 64
MAX_MODEL_LEN = 32768

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

# Qwen2-VL's template, reduced to what a chat request needs: roles, text, images, videos.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' or 'image' in part or 'image_url' in part %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'video' or 'video' in part %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in part %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

TRAINING_TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "Describe the image in one sentence.",
    "What color is the square in the picture?",
    "Encoder, prefill and decode run as separate vLLM instances.",
    "A red circle, a blue square and a green triangle on a white background.",
    "Hello! How are you today? I am fine, thank you.",
    "0 1 2 3 4 5 6 7 8 9 10 100 1000",
    "user assistant system: text, image, video; yes no maybe.",
]


def is_ready() -> bool:
    return (MODEL_DIR / ".ready").exists()


def _log(msg: str) -> None:
    print(f"[tiny-model] {msg}", file=sys.stderr, flush=True)


def ensure() -> Path:
    """Return the tiny model's directory, building it (a few seconds) in the vLLM venv if needed, and
    point ``MODEL_LINK`` at it."""
    if not is_ready():
        _build_in_venv()
    if not MODEL_LINK.is_symlink() or os.readlink(MODEL_LINK) != MODEL_DIR.name:
        temporary = MODEL_LINK.with_name(f"{MODEL_LINK.name}.link-{os.getpid()}")
        temporary.unlink(missing_ok=True)
        temporary.symlink_to(MODEL_DIR.name)
        temporary.replace(MODEL_LINK)
    return MODEL_DIR


def _build_in_venv() -> None:
    from dev.builds import venv

    python = venv.ensure()
    _log(f"building a tiny random-weight Qwen2-VL into {MODEL_DIR}")
    partial = MODEL_DIR.with_name(MODEL_DIR.name + f".partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    subprocess.run([str(python), __file__, "build", str(partial)], check=True, env=env, cwd="/")
    (partial / ".ready").write_text(RECIPE)
    try:
        partial.rename(MODEL_DIR)  # atomic: a concurrent builder either wins or finds it ready
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)
        if not is_ready():
            raise
    _log("ready")


# ---------------------------------------------------------------------------------------------
# Build script: runs inside the vLLM venv.
# ---------------------------------------------------------------------------------------------


# Any: transformers is installed only in the vLLM venv this runs in, not where mypy checks.
def _train_tokenizer(vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TRAINING_TEXT, trainer=trainer)
    assert tok.get_vocab_size() <= vocab_size, "tokenizer outgrew the model's embedding table"
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
        model_max_length=MAX_MODEL_LEN,
        chat_template=CHAT_TEMPLATE,
    )


def _build(out: Path) -> None:
    import torch
    from transformers import (
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    torch.manual_seed(0)
    vocab_size = 1024  # a multiple of 64 keeps vLLM's padded vocab equal to the real one
    tokenizer = _train_tokenizer(vocab_size)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    config = Qwen2VLConfig(
        text_config=dict(
            vocab_size=vocab_size,
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,  # head_dim 32: the CPU attention backend's minimum
            num_key_value_heads=2,
            # As long as the examples' maxModelLen, so their rendered flags run unchanged.
            max_position_embeddings=MAX_MODEL_LEN,
            rope_scaling={"type": "mrope", "mrope_section": [4, 6, 6]},  # sums to head_dim / 2
            rope_theta=10000.0,
            bos_token_id=ids["<|endoftext|>"],
            eos_token_id=ids["<|im_end|>"],
            pad_token_id=ids["<|endoftext|>"],
            tie_word_embeddings=False,
        ),
        vision_config=dict(
            depth=2,
            embed_dim=64,
            hidden_size=128,  # the merger projects into the language model's width
            num_heads=4,
            mlp_ratio=2,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
        ),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
    )
    # bfloat16 is what vLLM's CPU backend runs this model in; stored so, nothing is cast at load.
    model = Qwen2VLForConditionalGeneration(config).to(torch.bfloat16)
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    model.save_pretrained(out)

    size = {"shortest_edge": 4 * IMAGE_TOKEN_PIXELS, "longest_edge": MAX_IMAGE_TOKENS * IMAGE_TOKEN_PIXELS}
    processor = Qwen2VLProcessor(
        image_processor=Qwen2VLImageProcessor(size=size),
        video_processor=Qwen2VLVideoProcessor(size=size),
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(out)
    tokenizer.save_pretrained(out)


if __name__ == "__main__":
    if sys.argv[1:2] == ["build"] and len(sys.argv) == 3:
        _build(Path(sys.argv[2]))
    elif len(sys.argv) == 1:
        print(ensure())
    else:
        sys.exit("usage: tiny_model.py [build OUT_DIR]")
