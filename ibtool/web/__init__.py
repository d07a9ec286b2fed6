"""The exporter's listener: an HTTP server that bounds what a client can hold (connections,
threads, time, memory), and node_exporter's web config (TLS, basic auth).

    server  the HTTP/1.1 server: one selector loop, deadlines, limits, TLS per connection
    config  exporter-toolkit's web config YAML, parsed strictly, re-read when it changes

May import ibtool.model, ibtool.errors and ibtool.argtypes only.
"""
