"""Versioned SQL migrations, applied in file-name order by ``signoff migrate``."""
