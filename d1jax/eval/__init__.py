"""d1's evaluation protocol (``evaluate``) and the scorer of generation files (``score``)."""
