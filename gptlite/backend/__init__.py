"""Starting Keras's backend: its native notices held back, and compiled programs kept on disk.

Nothing here imports Keras."""
