"""embedline embedline."""
