"""The node-agent core that both plugins (the device plugin in ``plugin`` and the DRA plugin in
``cdigen.plugin.dra``) are built on: sockets, logging, health and Xid watching, node labels, the API
client, MPS mount rules and the stop-on-signal loop with its deadline. It imports neither
plugin."""
