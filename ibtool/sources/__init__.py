"""Where facts come from: sysfs, RDMA netlink, verbs, kernel links. Each source returns
ibtool.model records, never its library's objects."""
