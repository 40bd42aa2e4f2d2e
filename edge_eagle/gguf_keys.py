"""GGUF metadata keys and tensor names, in one place.

Upstream keys are those llama.cpp 0c1e57098 (vendored by llama-cpp-python 0.3.36) reads
for arch ``eagle3``. The ``edge_eagle.*`` keys are ours: upstream ignores them, so a
file that carries them still loads there (with EAGLE-3 semantics, see README).
"""

from __future__ import annotations

ARCH = "general.architecture"
EAGLE3 = "eagle3"

# Per-arch keys; format with arch=...
BLOCK_COUNT = "{arch}.block_count"
EMBEDDING_LENGTH = "{arch}.embedding_length"
FEED_FORWARD_LENGTH = "{arch}.feed_forward_length"
CONTEXT_LENGTH = "{arch}.context_length"
HEAD_COUNT = "{arch}.attention.head_count"
HEAD_COUNT_KV = "{arch}.attention.head_count_kv"
KEY_LENGTH = "{arch}.attention.key_length"
VALUE_LENGTH = "{arch}.attention.value_length"
RMS_EPS = "{arch}.attention.layer_norm_rms_epsilon"
ROPE_FREQ_BASE = "{arch}.rope.freq_base"
ROPE_DIM = "{arch}.rope.dimension_count"
VOCAB_SIZE = "{arch}.vocab_size"

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
TOKENS = "tokenizer.ggml.tokens"
CHAT_TEMPLATE = "tokenizer.chat_template"

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
