"""The dashboard's screens beside the overview: a port's detail, the loopback test, help."""
