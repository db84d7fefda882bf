"""The device-plugin wing: a kubelet device plugin (API v1beta1) serving the node's GPUs as
extended resources (``cdigen plugin``)."""
