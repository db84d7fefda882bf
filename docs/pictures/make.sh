#!/bin/sh
# Redraw the topology pictures in this folder from the built-in nodes: the DOT that
# `cdigen topo --format dot` prints (tests/unit/test_topo_render.py checks it is current) and a
# PNG of it by Graphviz (Debian: apt-get install graphviz). Run from anywhere:
#   sh docs/pictures/make.sh
set -eu
here=$(cd "$(dirname "$0")" && pwd)
for node in dgx-a100 dgx2-v100 dgx1-v100 pcie-8x4090 pcie-8gpu-phb; do
    cdigen topo --node "builtin:$node" --format dot --output "$here/$node.dot"
    dot -Tpng -Gdpi=72 "$here/$node.dot" -o "$here/$node.png"
done
