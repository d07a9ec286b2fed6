"""Where facts come from: the kernel's files and sockets. Each source returns ibtool.model
records, never its library's objects.

    sysfs    /sys/class/infiniband, the netdevs, the counters (a package)
    netlink  RDMA netlink: the NLDEV client, the session that merges it with sysfs (a package)
    verbs    pyverbs: the one place that knows which pyverbs it has
    links    rxe/siw links added and deleted through `rdma link` (iproute2)
    proc     /proc: IPv4 sysctls, a process's limits and allowed CPUs; a netdev's MTU
    process  a job's process as doctor --pid judges it: /proc/PID, its rdma cgroup
    configfs the RDMA CM's RoCE defaults (/sys/kernel/config/rdma_cm)
    userspace  the libibverbs providers installed (/etc/libibverbs.d)
    rtnetlink  NETLINK_ROUTE: a netdev's DCB, the route to an address
    firewall   nft / iptables rules that drop UDP to a port on the input path
    mad      MADs through rdma-core's libibumad, libibmad and libibnetdisc: the subnet's scan
    subnet   the subnet beyond the scan: every port's PMA counters, the SMs, a route

May import ibtool.model, ibtool.errors and ibtool.argtypes; never ibtool.views or ibtool.web
(leaves beside it), the Host or anything above it.
"""
