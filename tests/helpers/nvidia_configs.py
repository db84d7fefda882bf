"""NVIDIA's device-plugin configs: the examples of NVIDIA's k8s-device-plugin documentation
(time-slicing, MPS, MIG, renamed resources), written here as data for the tests."""

TIME_SLICING = """\
version: v1
flags:
  migStrategy: none
  failOnInitError: true
  nvidiaDriverRoot: /
  plugin:
    passDeviceSpecs: false
    deviceListStrategy: envvar
    deviceIDStrategy: uuid
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 10
"""
RENAMED = """\
version: v1
sharing:
  timeSlicing:
    renameByDefault: true
    failRequestsGreaterThanOne: true
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""
MPS = """\
version: v1
sharing:
  mps:
    resources:
    - name: nvidia.com/gpu
      replicas: 10
"""
MIG_MIXED = """\
version: v1
flags:
  migStrategy: mixed
"""
RESOURCES = """\
version: v1
flags:
  plugin:
    deviceListStrategy: [volume-mounts, cdi-cri]
resources:
  gpus:
  - pattern: "*"
    name: gpu
  mig:
  - pattern: "1g.10gb"
    name: mig-1g.10gb
sharing:
  timeSlicing:
    resources:
    - name: gpu
      rename: gpu.ts
      replicas: 2
"""
