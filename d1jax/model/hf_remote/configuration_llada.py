"""LLaDA's Hugging Face config, shipped by d1jax beside every export (``trust_remote_code``).

Written for d1jax to load under transformers 4.x and 5.x. It reads the same ``config.json``
as GSAI-ML/LLaDA-8B-Instruct (same ``model_type`` and field names); fields the model below
does not use are kept as plain attributes, so a config saves back unchanged.
"""

from transformers import PretrainedConfig

# The variant the model implements: LLaDA-8B's. Any other value is refused when the model is built.
SUPPORTED = {
    "block_type": "llama", "layer_norm_type": "rms", "activation_type": "silu", "rope": True,
    "alibi": False, "include_bias": False, "include_qkv_bias": False, "clip_qkv": None,
    "attention_layer_norm": False, "input_emb_norm": False, "block_group_size": 1,
}


class LLaDAConfig(PretrainedConfig):
    """Architecture of a LLaDA mask predictor; the defaults are LLaDA-8B's."""

    model_type = "llada"
    keys_to_ignore_at_inference = ["past_key_values"]
    attribute_map = {"hidden_size": "d_model", "num_attention_heads": "n_heads",
                     "num_hidden_layers": "n_layers",
                     "max_position_embeddings": "max_sequence_length"}

    def __init__(self, d_model=4096, n_heads=32, n_kv_heads=None, n_layers=32,
                 mlp_hidden_size=12288, mlp_ratio=4, vocab_size=126464, embedding_size=126464,
                 rope_theta=500000.0, rms_norm_eps=1e-5, max_sequence_length=4096,
                 weight_tying=False, scale_logits=False, multi_query_attention=None,
                 mask_token_id=126336, use_cache=False, **kwargs):
        self.d_model = d_model
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.n_layers = n_layers
        self.mlp_hidden_size = mlp_hidden_size
        self.mlp_ratio = mlp_ratio
        self.vocab_size = vocab_size
        self.embedding_size = embedding_size
        self.rope_theta = rope_theta
        self.rms_norm_eps = rms_norm_eps
        self.max_sequence_length = max_sequence_length
        self.weight_tying = weight_tying
        self.scale_logits = scale_logits
        self.multi_query_attention = multi_query_attention
        self.mask_token_id = mask_token_id
        self.use_cache = use_cache
        kwargs.setdefault("architectures", ["LLaDAModelLM"])
        # transformers 4 ties an output head to the input embedding unless told not to.
        kwargs["tie_word_embeddings"] = bool(weight_tying)
        super().__init__(**kwargs)

    @property
    def kv_heads(self):
        """Key/value heads: n_kv_heads, else 1 for multi-query attention, else n_heads."""
        if self.n_kv_heads is not None:
            return self.n_kv_heads
        return 1 if self.multi_query_attention else self.n_heads

    @property
    def mlp_hidden(self):
        """Width of the SwiGLU hidden layer: mlp_hidden_size, else mlp_ratio * d_model."""
        return self.mlp_hidden_size or int(self.mlp_ratio * self.d_model)

    @property
    def rows(self):
        """Rows of the embedding and output head: embedding_size, else vocab_size."""
        return self.embedding_size or self.vocab_size
