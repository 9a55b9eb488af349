"""A tiny random-weight llama model in GGUF, written locally (nothing is downloaded).

The lab needs a *real* inference engine (llama.cpp through ``llama_cpp.server``) but no
real weights: chaos drills exercise the serving path (process, sockets, SSE streaming,
queueing), not the quality of the text. :func:`write_tiny_llama` writes a complete llama
GGUF file with the ``gguf`` package: every metadata key llama.cpp requires for the
``llama`` architecture, a small SentencePiece ("llama") vocabulary with byte-fallback
tokens ``<0x00>``..``<0xFF>`` (so any UTF-8 text tokenizes), some ASCII words and a few
CJK tokens, and random F32 or F16 tensors with the llama tensor names.

With the defaults (2 layers, 64 dims) the file is about 0.5 MB, it is written in
milliseconds, and llama.cpp generates thousands of (meaningless) tokens per second on one
CPU core. The output is byte-for-byte deterministic for a given seed and shape.

:func:`ensure_tiny_model` caches one such file under a directory, idempotently and
atomically, so concurrent test workers never see a half-written model.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Final, Literal

import gguf
import numpy as np

__all__ = [
    "BOS_ID",
    "CHATML_TEMPLATE",
    "DEFAULT_CACHE_DIR",
    "EOS_ID",
    "UNK_ID",
    "TINY_MODEL_FORMAT_VERSION",
    "build_vocab",
    "ensure_tiny_model",
    "write_tiny_llama",
]

#: Bump when the file layout written by :func:`write_tiny_llama` changes, so cached
#: models written by an older version are not reused.
TINY_MODEL_FORMAT_VERSION: Final = 1

#: Where :func:`ensure_tiny_model` keeps models unless told otherwise.
DEFAULT_CACHE_DIR: Final = Path(
    os.environ.get("CHAOS_INFER_MODELS", Path.home() / ".cache" / "chaoslib-infer" / "models")
)

UNK_ID: Final = 0
BOS_ID: Final = 1
EOS_ID: Final = 2

#: A minimal ChatML template (Jinja, as llama.cpp / llama_cpp.server expect it). Embedded
#: in the model so ``/v1/chat/completions`` formats prompts the same way on every version
#: of llama-cpp-python instead of depending on its built-in fallback chat format.
CHATML_TEMPLATE: Final = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Output weight on the constant channel for tokens the model must never generate.
_SUPPRESS_WEIGHT: Final = -1000.0

# SentencePiece marks a word boundary with U+2581 ("lower one eighth block").
_SPM_SPACE: Final = "\u2581"

_ASCII_WORDS: Final = (
    "the a an and or of to in on is are was be it this that for with as at by from "
    "hello world chaos drill fault inject latency error retry timeout replica server "
    "client request response token stream model queue load fail ok yes no up down "
    "kill stop start restart health ready live node pod gpu cpu memory disk network "
    "one two three four five six seven eight nine ten"
).split()

_ASCII_PIECES: Final = (
    "s ing ed er ly es ion "
    ". , ! ? : ; ' \" ( ) - _ / 0 1 2 3 4 5 6 7 8 9 "
    "a b c d e f g h i j k l m n o p q r s t u v w x y z"
).split()

# A few CJK tokens so multi-byte text also hits real (non-byte) vocabulary entries.
_CJK_TOKENS: Final = ("你好", "世界", "模型", "混沌", "测试", "日本", "語", "한국어")


def build_vocab() -> tuple[list[str], list[float], list[int]]:
    """Return the tiny SPM vocabulary as ``(tokens, scores, token_types)``.

    Layout: ``<unk>`` (0), ``<s>`` (1), ``</s>`` (2), ChatML markers ``<|im_start|>`` and
    ``<|im_end|>`` (control tokens), the 256 byte-fallback tokens ``<0x00>``..``<0xFF>``,
    then normal pieces: ``▁`` (a lone space), word-initial ASCII words (``▁hello``),
    subword pieces (``ing``) and CJK words. Scores are descending log-probabilities for
    normal pieces (longer pieces score higher so the SPM merger prefers them) and 0 for
    special and byte tokens, as in real llama vocabularies.
    """
    tokens: list[str] = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    types: list[int] = [
        gguf.TokenType.UNKNOWN,
        gguf.TokenType.CONTROL,
        gguf.TokenType.CONTROL,
        gguf.TokenType.CONTROL,
        gguf.TokenType.CONTROL,
    ]
    scores: list[float] = [0.0] * len(tokens)

    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        types.append(gguf.TokenType.BYTE)
        scores.append(0.0)

    normal: list[str] = [_SPM_SPACE]
    normal += [_SPM_SPACE + w for w in _ASCII_WORDS]
    normal += list(dict.fromkeys(_ASCII_PIECES))  # de-duplicated, order kept
    normal += [_SPM_SPACE + w for w in _CJK_TOKENS] + list(_CJK_TOKENS)
    seen = set(tokens)
    for i, piece in enumerate(normal):
        if piece in seen:
            continue
        seen.add(piece)
        tokens.append(piece)
        types.append(gguf.TokenType.NORMAL)
        # Longer pieces win merges; the index keeps scores distinct and deterministic.
        scores.append(float(-1000 + 10 * len(piece)) - i * 1e-3)
    return tokens, scores, [int(t) for t in types]


def write_tiny_llama(
    path: Path,
    seed: int = 0,
    n_layers: int = 2,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    context_length: int = 2048,
    dtype: Literal["f32", "f16"] = "f32",
    chat_template: str | None = CHATML_TEMPLATE,
    natural_stop: bool = False,
    name: str = "chaoslib-infer tiny llama",
) -> Path:
    """Write a tiny random-weight llama model to ``path`` in GGUF and return ``path``.

    Args:
        path: Destination file (parent directories are created). Overwritten if present.
        seed: Seed for the weights; the same arguments always give the same bytes.
        n_layers: Number of transformer blocks (``llama.block_count``).
        n_embd: Hidden size (``llama.embedding_length``); must be divisible by ``n_head``.
        n_head: Attention heads (``llama.attention.head_count``).
        n_head_kv: Key/value heads for grouped-query attention; must divide ``n_head``.
        n_ff: Feed-forward width (``llama.feed_forward_length``).
        context_length: Training context length advertised in the metadata.
        dtype: ``"f32"`` or ``"f16"`` for the 2-D weight matrices (norms stay F32, as
            llama.cpp expects).
        chat_template: Jinja chat template stored as ``tokenizer.chat_template``
            (ChatML by default); ``None`` stores none, so servers fall back to their
            built-in chat format.
        natural_stop: If ``False`` (the default) the model never *generates* a
            control, unknown or byte-fallback token: every completion runs to
            ``max_tokens`` and every generated token is a whole word/piece of valid
            UTF-8, so a stream of N tokens is exactly N content chunks (what load tests
            and latency budgets want). If ``True`` the weights are left purely random
            and the model stops whenever it happens to sample ``</s>`` or
            ``<|im_end|>`` (which llama.cpp treats as end-of-generation), usually within
            a few dozen tokens.
        name: ``general.name``.

    Returns:
        ``path``, for chaining.

    Raises:
        ValueError: If the shape arguments are inconsistent.
    """
    if n_layers < 1 or n_embd < 1 or n_ff < 1 or context_length < 1:
        raise ValueError("n_layers, n_embd, n_ff and context_length must be positive")
    if n_head < 1 or n_embd % n_head:
        raise ValueError(f"n_embd ({n_embd}) must be a positive multiple of n_head ({n_head})")
    if n_head_kv < 1 or n_head % n_head_kv:
        raise ValueError(f"n_head_kv ({n_head_kv}) must divide n_head ({n_head})")
    head_dim = n_embd // n_head
    if head_dim % 2:
        raise ValueError(f"head dimension n_embd/n_head = {head_dim} must be even for RoPE")
    n_embd_kv = head_dim * n_head_kv

    tokens, scores, types = build_vocab()
    n_vocab = len(tokens)
    rng = np.random.default_rng(seed)
    wdtype = np.float16 if dtype == "f16" else np.float32
    file_type = gguf.LlamaFileType.MOSTLY_F16 if dtype == "f16" else gguf.LlamaFileType.ALL_F32

    def matrix(rows: int, cols: int) -> np.ndarray:
        # numpy shape is (rows, cols) == ggml ne = [cols, rows]: cols is the input dim.
        scale = 1.0 / np.sqrt(cols)
        return (rng.standard_normal((rows, cols), dtype=np.float32) * scale).astype(wdtype)

    def norm() -> np.ndarray:
        return np.ones(n_embd, dtype=np.float32)

    token_embd = matrix(n_vocab, n_embd)
    output = matrix(n_vocab, n_embd)
    attn_out = [matrix(n_embd, n_embd) for _ in range(n_layers)]
    ffn_down = [matrix(n_embd, n_ff) for _ in range(n_layers)]
    if not natural_stop:
        # A constant "bias" channel: hidden dimension 0 is 1.0 in every token
        # embedding and no block writes to it (row 0 of attn_output/ffn_down is zero),
        # so after the final RMS norm it is always positive. A large negative weight on
        # that channel in the output rows of control/unknown/byte tokens keeps their
        # logits far below every normal piece, whatever the context.
        token_embd[:, 0] = 1.0
        for w in (*attn_out, *ffn_down):
            w[0, :] = 0.0
        output[:, 0] = 0.0
        never = [i for i, t in enumerate(types) if t != gguf.TokenType.NORMAL]
        output[never, 0] = _SUPPRESS_WEIGHT

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arch = gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA]  # "llama"
    writer = gguf.GGUFWriter(path, arch)
    try:
        writer.add_name(name)
        writer.add_context_length(context_length)
        writer.add_embedding_length(n_embd)
        writer.add_block_count(n_layers)
        writer.add_feed_forward_length(n_ff)
        writer.add_head_count(n_head)
        writer.add_head_count_kv(n_head_kv)
        writer.add_rope_dimension_count(head_dim)
        writer.add_rope_freq_base(10000.0)
        writer.add_layer_norm_rms_eps(1e-5)
        writer.add_vocab_size(n_vocab)
        writer.add_file_type(int(file_type))

        writer.add_tokenizer_model("llama")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(tokens)
        writer.add_token_scores(scores)
        writer.add_token_types(types)
        writer.add_unk_token_id(UNK_ID)
        writer.add_bos_token_id(BOS_ID)
        writer.add_eos_token_id(EOS_ID)
        writer.add_add_bos_token(True)
        writer.add_add_eos_token(False)
        if chat_template is not None:
            writer.add_chat_template(chat_template)

        writer.add_tensor("token_embd.weight", token_embd)
        for i in range(n_layers):
            blk = f"blk.{i}"
            writer.add_tensor(f"{blk}.attn_norm.weight", norm())
            writer.add_tensor(f"{blk}.attn_q.weight", matrix(n_embd, n_embd))
            writer.add_tensor(f"{blk}.attn_k.weight", matrix(n_embd_kv, n_embd))
            writer.add_tensor(f"{blk}.attn_v.weight", matrix(n_embd_kv, n_embd))
            writer.add_tensor(f"{blk}.attn_output.weight", attn_out[i])
            writer.add_tensor(f"{blk}.ffn_norm.weight", norm())
            writer.add_tensor(f"{blk}.ffn_gate.weight", matrix(n_ff, n_embd))
            writer.add_tensor(f"{blk}.ffn_up.weight", matrix(n_ff, n_embd))
            writer.add_tensor(f"{blk}.ffn_down.weight", ffn_down[i])
        writer.add_tensor("output_norm.weight", norm())
        writer.add_tensor("output.weight", output)

        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    return path


def ensure_tiny_model(cache_dir: Path | None = None, seed: int = 0) -> Path:
    """Return the path of a cached tiny model, writing it first if it is missing.

    Idempotent and safe under concurrency: the model is written to a temporary file in
    ``cache_dir`` and atomically renamed into place, so a reader never sees a partial
    file. The file name carries the format version and seed, so a layout change never
    reuses a stale file.

    Args:
        cache_dir: Directory for the model; defaults to :data:`DEFAULT_CACHE_DIR`
            (``$CHAOS_INFER_MODELS`` or ``~/.cache/chaoslib-infer/models``).
        seed: Weight seed passed to :func:`write_tiny_llama`.

    Returns:
        Path to the ``.gguf`` file.
    """
    cache_dir = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE_DIR
    tag = hashlib.sha256(f"v{TINY_MODEL_FORMAT_VERSION}-seed{seed}".encode()).hexdigest()[:8]
    target = cache_dir / f"tiny-llama-v{TINY_MODEL_FORMAT_VERSION}-s{seed}-{tag}.gguf"
    if target.is_file() and target.stat().st_size > 0:
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=".tiny-llama-", suffix=".gguf.tmp", dir=cache_dir)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write_tiny_llama(tmp, seed=seed)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target
