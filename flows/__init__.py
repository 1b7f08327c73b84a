"""embedline flows."""
