"""Dream's Hugging Face config, shipped by d1jax beside a Dream export (``trust_remote_code``).

Written for d1jax to load under transformers 4.x and 5.x. It reads the same ``config.json``
as Dream-org/Dream-v0-Instruct-7B and apple/DiffuCoder-7B (``model_type`` "Dream": a Qwen2
config plus ``mask_token_id``); fields the model does not use are kept as plain attributes,
so a config saves back with them.
"""

import warnings

from transformers import PretrainedConfig

# The variant the model implements (Dream-7B's); any other value is refused when it is built.
SUPPORTED = {"hidden_act": "silu", "use_sliding_window": False, "attention_dropout": 0.0}
ROPE_TYPES = ("default", "linear")  # positions as they are, or divided by rope_scaling's factor


class DreamConfig(PretrainedConfig):
    """Architecture of a Dream mask predictor; the defaults are Dream-v0-7B's."""

    model_type = "Dream"
    keys_to_ignore_at_inference = ["past_key_values"]

    def __init__(self, vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                 num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                 hidden_act="silu", max_position_embeddings=131072, initializer_range=0.02,
                 rms_norm_eps=1e-6, use_cache=False, tie_word_embeddings=False,
                 rope_theta=1000000.0, rope_scaling=None, use_sliding_window=False,
                 sliding_window=None, max_window_layers=28, attention_dropout=0.0,
                 mask_token_id=151666, pad_token_id=151643, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = (num_attention_heads if num_key_value_heads is None
                                    else num_key_value_heads)
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.use_cache = use_cache
        self.rope_theta = rope_theta
        with warnings.catch_warnings():  # transformers 5 renames it rope_parameters, warning
            warnings.simplefilter("ignore", FutureWarning)
            self.rope_scaling = rope_scaling
        self.use_sliding_window = use_sliding_window
        self.sliding_window = sliding_window
        self.max_window_layers = max_window_layers
        self.attention_dropout = attention_dropout
        kwargs.setdefault("architectures", ["DreamModel"])
        # transformers 4 ties an output head to the input embedding unless told not to.
        super().__init__(tie_word_embeddings=bool(tie_word_embeddings), **kwargs)
        self.mask_token_id = mask_token_id
        self.pad_token_id = pad_token_id


def rope_type_and_factor(config):
    """(rope type, the factor positions are divided by) from ``rope_scaling``.

    transformers 5 keeps ``rope_scaling`` as ``rope_parameters`` and adds ``rope_theta`` to it
    (a None becomes ``{"rope_type": "default", ...}``), 4.x keeps it as written: both read here.
    """
    scaling = getattr(config, "rope_scaling", None) or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    return kind, (float(scaling.get("factor", 1.0)) if kind == "linear" else 1.0)
