"""The notebook front door: the IPython extension, %pathways / %%pathways, the comm."""
