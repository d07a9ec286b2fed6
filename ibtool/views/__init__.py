"""Views: how records are written for people and programs.

    render      fields to text columns and JSON objects (the keys of `rdma -j`)
    res         the `res` tables: each object's columns and counts
    resfilter   the `res` filters (iproute2's words), beside the columns they filter
    events      events as a line of text and as JSON
    prometheus  metric families and their text exposition

May import ibtool.model, ibtool.errors and ibtool.argtypes; never ibtool.web or ibtool.sources
(leaves beside it), the Host or anything above.
"""
