"""embedline adapters."""
