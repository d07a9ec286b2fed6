"""`ibtool loopback`: the self-test of one port, every RDMA operation verified, and the
fabric's own rules.

Modules, lower first (a module imports only those above it in this list):

- results.py: the operations' names, OpResult and its Status, Mismatch, OpUnsupported
- pattern.py: the payloads (also the native ping's, ibtool.rdma.ping.client)
- apm.py: an RC QP's alternate path loaded, armed and migrated to
- mcast.py: a multicast group joined through rdma_cm, its rounds and its outsider
- operations.py: Loopback, the QPs and buffers of one self-test and its RDMA operations
- fabric.py: FabricTest, a Loopback that also tests ud_qkey, mcast and apm
- selftest.py: run and run_op, each operation timed and its result said

The package may import ibtool.errors, ibtool.model, ibtool.sources (verbs) and the rest of
ibtool.rdma (ladder, completions, cm); nothing above ibtool.rdma.
"""
