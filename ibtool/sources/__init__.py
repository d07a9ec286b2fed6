"""Where facts come from: the kernel's files and sockets. Each source returns ibtool.model
records, never its library's objects.

    sysfs    /sys/class/infiniband, the netdevs, the counters (a package)
    netlink  RDMA netlink: the NLDEV client, the session that merges it with sysfs (a package)
    verbs    pyverbs: the one place that knows which pyverbs it has
    links    rxe/siw links added and deleted through `rdma link` (iproute2)

May import ibtool.views, ibtool.web, ibtool.model, ibtool.errors, ibtool.argtypes; never the
Host or anything above it.
"""
