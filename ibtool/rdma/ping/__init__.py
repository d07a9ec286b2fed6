"""`ibtool ping`: RC round trips between two processes or hosts, both sides, four protocols.

Modules, lower first (a module imports only those above it in this list):

- session.py: one connection's CQ, MR, QP and work requests, the errors of a ping run
- admission.py: who a server lets in and what each client may hold (no sockets, no verbs)
- options.py: what a server is told (ServeOptions), one record for the four servers
- echo.py: a server's answer loop, every ping echoed on a connected Session
- client.py: the native client, its round trip, and run_client that counts any protocol's
- acceptor.py: a TCP server's listener, handshake table and thread per admitted session
- server.py: the native protocol's server sessions (`ibtool ping --server`)
- serial.py: an rdma_cm server's loop, one client at a time (rping.py, cmping.py)
- pingpong.py: rdma-core's ibv_rc_pingpong as a peer (`--compat rc_pingpong`)
- rping.py: librdmacm's rping as a peer (`--compat rping`)
- cmping.py: the native ping connected through rdma_cm (`--cm`)
- facts.py: `ibtool doctor`'s query of a server's facts (no verbs)

The package may import ibtool.errors, ibtool.argtypes, ibtool.model and the rest of
ibtool.rdma (wire, ladder, completions, hwclock, cm, loopback's pattern); nothing above
ibtool.rdma. This file imports nothing: the plugin's argument checks load admission.py
without pyverbs.
"""
