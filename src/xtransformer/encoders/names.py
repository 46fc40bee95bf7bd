"""Names the encoder settings may take, in a module without torch (the settings records read them)."""

POOLINGS = ("cls", "last", "mean")  # how token states become a text's embedding (encoders/embed.py)
