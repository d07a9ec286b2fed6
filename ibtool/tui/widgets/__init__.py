"""The dashboard's widgets, one per module."""
