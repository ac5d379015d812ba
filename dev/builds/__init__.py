"""Everything built once into the cache (``~/.cache/epd-operator``, ``dev/paths.py``) and reused by later runs:
every Go program from a pinned module release (``go_module``; the Kubernetes components through it, versions pinned
in ``k8s_binaries``), the vLLM CPU venv (``venv``), other vLLM releases' parsers (``vllm_wheel``), the tiny model
(``tiny_model``), and the images the real node runs (``images``, written by ``oci``; ``image_deps`` checks the
vLLM image's pins)."""
