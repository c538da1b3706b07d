"""Results files, tables across runs and plots."""
