"""Per-pod attribution: which pod and container hold which GPU, share, MIG device or claim, and
with which memory limit.

The kubelet's PodResources API (:mod:`plugin.attribution.podresources`) says which device IDs
(device plugin) and which ResourceClaims (DRA) each container got; each wing maps them to GPUs
through what it advertised or prepared (:mod:`plugin.attribution.wings`): the device catalogue
behind its resources, the claims in its checkpoint. The result is one list of
:class:`~plugin.attribution.holdings.Holding` rows, printed by ``cdigen plugin pods`` and ``cdigen
dra pods`` and exported as Prometheus series by :mod:`plugin.attribution.collector`.
"""
