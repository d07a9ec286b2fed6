"""Where facts come from. Each source returns ibtool.model.records records, never its library's objects."""
