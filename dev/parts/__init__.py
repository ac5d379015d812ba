"""The local cluster's parts: what runs beside the control plane (``dev/cluster/``) and its real node
(``dev/node/``). One module a part, each a :class:`~dev.parts.part.Part` (``part``: build, configure, start,
ready, stop), all listed in ``registry``: ``kube_router`` (the NetworkPolicy engine) and ``coredns`` (the
cluster's DNS) start with every real node; ``lws`` (the LeaderWorkerSet controller), ``keda`` (KEDA) and
``gateway`` (Traefik as the Gateway API gateway) when asked for; ``prometheus_adapter`` is built for the tests
that run it beside their own Prometheus.

    python -m dev.parts list               # every part, built or not
    python -m dev.parts build NAME...      # their builds
"""
