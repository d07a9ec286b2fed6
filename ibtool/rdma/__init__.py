"""The data path: QP ladders, RDMA operations with verification, the ping wire protocol."""
