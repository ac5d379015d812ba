"""epd-operator: run vLLM Encoder/Prefill/Decode disaggregated multimodal inference on Kubernetes."""

__version__ = "0.1.0"
