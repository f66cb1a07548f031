"""Ledger backends. Import them from ``dataoad``."""
