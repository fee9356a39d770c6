"""The single controller; knows nothing of notebooks or widgets."""
