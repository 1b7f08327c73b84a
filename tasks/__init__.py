"""embedline tasks."""
