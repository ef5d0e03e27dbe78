"""Starting Keras's backend: its native notices held back, compiled programs kept on disk, and which device it
computes on.

Importing these modules imports no Keras."""
