"""snapshot"""
