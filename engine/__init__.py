"""The native engine: static-KV-cache decoding with EAGLE-3 speculation (chain and tree)."""
