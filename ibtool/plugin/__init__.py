"""plugin"""
