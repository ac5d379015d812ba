"""The local cluster's parts: what runs beside the control plane and the real node."""
