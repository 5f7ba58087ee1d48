"""KV-block kernels (erase, copy) that slaq's KV connector calls in vLLM's worker: Triton on CUDA,
each with the torch reference it runs on CPU (see kv_blocks.py)."""
