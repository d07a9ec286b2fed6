"""The sysfs readers: what the kernel shows of RDMA devices and their netdevs as files.

- values: the parsers of what the kernel prints in a file (enums, LIDs, rates, GUIDs, netdev
  names) and what is wrong with a value it never prints (Invalid).
- files: SysfsFiles, a tree rooted anywhere: a file read, parsed, or warned about once.
- rooted: RootedFiles, any file under the root (/proc, configfs, /etc) read bounded, never
  through a link out of the root.
- pci: PciFiles, an RDMA device's PCIe links up to the root port, its NUMA node and CPUs.
- net: NetFiles, the netdevs' VLANs (/proc/net/vlan/config, or rtnetlink where it is
  root's alone), bonds and carrier changes.
- counters: CounterFiles, the PMA and driver (hw_counters) counters of ports and devices.
- infiniband: SysfsSource, /sys/class/infiniband: devices, ports, GIDs, P_Key tables, on top of
  NetFiles and CounterFiles.
- stack: StackFiles, the RDMA stack: modules (or their built-in function), the uverbs ABI and
  char devices.

These modules import only ibtool.model, ibtool.errors, ibtool.argtypes and one another (each
only the ones listed above it); net also ibtool.sources.rtnetlink, lazily, for the VLANs of a
running kernel whose /proc/net/vlan/config the user may not read.
"""
