"""Revision files (one per schema change)."""
