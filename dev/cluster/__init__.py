"""The local control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok's fake GPU
nodes on this machine (``local``: :class:`~dev.cluster.local.LocalCluster`), its API as the admin (``api``, over
``kube_blocking``), its credentials (``pki``), its fake nodes (``fake_nodes``), and ``make cluster``'s command
line (``cli``) with what a running one leaves for other commands (``state``)."""
