"""The exporter's listener: an HTTP server that bounds what a client can hold (connections,
threads, time, memory), and node_exporter's web config (TLS, basic auth).

    server  the HTTP/1.1 server: one selector loop, deadlines, limits, TLS per connection
    config  exporter-toolkit's web config as a whole, and its reload when a file changes
    yaml    the strict reading: files read as hostile, the YAML walked key by key
    tls     tls_server_config and the SSLContext built from it
    auth    basic_auth_users: bcrypt checks, one at a time, and their cache

May import ibtool.model, ibtool.errors and ibtool.argtypes only.
"""
