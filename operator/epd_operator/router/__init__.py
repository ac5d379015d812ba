"""epd-router: the endpoint picker in front of vLLM encoder, prefill and decode tiers.

protocol (vLLM 0.32 EPD wire format) · pickers (bounded-load hashing, least-loaded, round-robin)
· backends (pools, health, ejection) · discovery (static URLs, EndpointSlices) · reuse (TTL cache)
· metrics (Prometheus) · server (handlers, the E → P → D pipeline) · http_server (inbound HTTP/1.1)
· upstream (HTTP/1.1 client to backends) · main (CLI, workers) · contract (the flags the operator
writes).
"""
