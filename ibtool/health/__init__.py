"""health"""
