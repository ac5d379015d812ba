"""The local cluster's real node: containerd, runc, CNI, the kubelet and kube-proxy in namespaces and a cgroup of
their own (``real_node``: its lifecycle), with containerd's and the pod network's configuration (``containerd``),
the kubelet's and kube-proxy's (``kube_config``), the one path between this machine and the node's network
(``bridge``), the image store that outlives a cluster (``store``) and the machine's cgroup layout (``cgroups``)."""
