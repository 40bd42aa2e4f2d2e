"""GGUF metadata keys and tensor names, in one place.

The standard keys are gguf-py's (`gguf.Keys`). The eagle3 keys are those llama.cpp
0c1e57098 (vendored by llama-cpp-python 0.3.36) reads for arch ``eagle3``; gguf-py 0.19 on
PyPI does not name them yet. The ``edge_eagle.*`` keys are ours: upstream ignores them, so
a file that carries them still loads there (with EAGLE-3 semantics, see README). The
drafter's tensors are tabled in tensors.py.
"""

from __future__ import annotations

from gguf import Keys

ARCH = Keys.General.ARCHITECTURE
ALIGNMENT = Keys.General.ALIGNMENT
EAGLE3 = "eagle3"

# Per-arch keys; format with arch=...
BLOCK_COUNT = Keys.LLM.BLOCK_COUNT
EMBEDDING_LENGTH = Keys.LLM.EMBEDDING_LENGTH
FEED_FORWARD_LENGTH = Keys.LLM.FEED_FORWARD_LENGTH
CONTEXT_LENGTH = Keys.LLM.CONTEXT_LENGTH
HEAD_COUNT = Keys.Attention.HEAD_COUNT
HEAD_COUNT_KV = Keys.Attention.HEAD_COUNT_KV
KEY_LENGTH = Keys.Attention.KEY_LENGTH
VALUE_LENGTH = Keys.Attention.VALUE_LENGTH
RMS_EPS = Keys.Attention.LAYERNORM_RMS_EPS
ROPE_FREQ_BASE = Keys.Rope.FREQ_BASE
ROPE_DIM = Keys.Rope.DIMENSION_COUNT
VOCAB_SIZE = Keys.LLM.VOCAB_SIZE

# eagle3 (upstream)
TARGET_LAYERS = "eagle3.target_layers"
TARGET_HIDDEN_SIZE = "eagle3.target_hidden_size"
NORM_BEFORE_RESIDUAL = "eagle3.norm_before_residual"
NORM_BEFORE_FC = "eagle3.norm_before_fc"

# edge-eagle (EAGLE-3.1 and provenance)
FC_NORM = "edge_eagle.fc_norm"  # bool
FC_NORM_WEIGHTS = "edge_eagle.fc_norm.weight.{i}"  # f32 array [target_hidden_size], i = 0..2
NORM_OUTPUT = "edge_eagle.norm_output"  # bool
SOURCE = "edge_eagle.source"
REVISION = "edge_eagle.revision"
LAYOUT = "edge_eagle.layout"
CONVERTER_VERSION = "edge_eagle.converter_version"
TARGET_VOCAB_FINGERPRINT = "edge_eagle.target_vocab_fingerprint"

TOKENIZER_PREFIX = "tokenizer."
TOKENS = Keys.Tokenizer.LIST
CHAT_TEMPLATE = Keys.Tokenizer.CHAT_TEMPLATE

# eagle3 tensor names (upstream llama.cpp, src/models/eagle3.cpp)
T_FC = "fc.weight"
T_ENC_NORM = "enc.output_norm.weight"  # norm_before_fc
T_TOKEN_EMBD = "token_embd.weight"
T_OUTPUT_NORM = "output_norm.weight"
T_OUTPUT = "output.weight"
T_D2T = "d2t"
T_ATTN_NORM = "blk.0.attn_norm.weight"  # input_layernorm
T_ATTN_NORM_2 = "blk.0.attn_norm_2.weight"  # hidden_norm
T_ATTN_Q = "blk.0.attn_q.weight"
T_ATTN_K = "blk.0.attn_k.weight"
T_ATTN_V = "blk.0.attn_v.weight"
T_ATTN_OUT = "blk.0.attn_output.weight"
T_FFN_NORM = "blk.0.ffn_norm.weight"  # post_attention_layernorm
T_FFN_GATE = "blk.0.ffn_gate.weight"
T_FFN_UP = "blk.0.ffn_up.weight"
T_FFN_DOWN = "blk.0.ffn_down.weight"

# Architectures whose llama.cpp graph exports layer inputs (res->t_layer_inp), read off
# src/models/*.cpp of llama.cpp 0c1e57098. Others need the eval-callback capture path.
LAYER_INPUT_ARCHS = frozenset({
    "bailingmoe3", "deepseek4", "gemma4", "hunyuan_vl", "lfm2", "llama", "mimo2",
    "minimax-01", "minimax-m2", "muse-glimmer", "nanbeige", "nemotron_h", "gpt-oss",
    "qwen3", "qwen35", "qwen35moe", "qwen3moe", "qwen3next", "qwen4exp",
})
