"""The data path: QP ladders, RDMA operations with verification, rdma_cm, the ping wire
protocol, the loopback tests and the ping server and clients.

May import ibtool.sources (verbs), ibtool.model, ibtool.errors and ibtool.argtypes; never the
Host (ibtool.host) or anything above it: a command gives the data path what it read of the
host.
"""
